"""The spool's side of the door: files in, commands to intake, receipts out.

One job: read the spool (watched with watchfiles, plus one scan at start and a rescan at
least once a second), turn each file into an intake command (:mod:`daemon.engine.intake`)
with the file's owner as who asks, and write its receipt or its refusal beside it; then
delete it. Decisions are read only while their directory is safe, and a decision file's
owner counts as an approver only by :meth:`daemon.engine.intake.Authority.spool_approval`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import watchfiles

from daemon import logfmt, scoping
from daemon.config import Config
from daemon.engine.chain import frames
from daemon.engine.intake import Decide, Fetch, Intake, Register, Submit
from daemon.errors import Refused
from daemon.faults import FaultInjection
from daemon.metrics import Metrics
from daemon.spool import (
    DecisionFile,
    FetchFile,
    Receipt,
    RegistrationFile,
    Spool,
    SpoolPermissionError,
    SubmitFile,
    decode_incoming,
    user_name,
)
from daemon.spool import request_id_of as spool_request_id
from eventlog.errors import FencedError
from replay.observations import DecisionSubmitted


class SpoolDoor:
    def __init__(
        self,
        config: Config,
        spool: Spool,
        intake: Intake,
        metrics: Metrics,
        *,
        faults: FaultInjection,
        busy: set[str],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.spool = spool
        self.intake = intake
        self.metrics = metrics
        self.faults = faults
        self.busy = busy  # operations a poll holds: their decisions wait for the next scan
        self.clock = clock
        self._decisions_problem = ""  # why the decisions directory is unsafe, if it is
        self._pruned_at = float("-inf")

    async def watch(self, stopping: anyio.Event) -> None:
        """Ingest on every change, and rescan at least once a second: a file dropped between
        the start-up scan and the watch being set up (or an event the kernel dropped) waits
        a second at most, never forever."""
        async for _ in watchfiles.awatch(
            self.spool.incoming,
            self.spool.decisions,
            stop_event=stopping,
            debounce=20,
            step=10,
            rust_timeout=1000,
            yield_on_timeout=True,
        ):
            await self.ingest_all()
            self.prune()

    def prune(self, *, force: bool = False) -> None:
        """Keep receipts for ``receipt_retention_seconds`` and the newest ``rejected_max_files``
        refused files: at start, then at most once a minute, or sooner during a flood."""
        cfg = self.config.spool
        due = (
            force
            or time.monotonic() - self._pruned_at >= 60.0
            or self.spool.rejected_since_prune >= max(1, cfg.rejected_max_files // 10)
        )
        if not due:
            return
        self._pruned_at = time.monotonic()
        try:
            removed = self.spool.prune(
                self.clock(),
                receipt_retention=cfg.receipt_retention_seconds,
                receipt_max=cfg.receipt_max_files,
                rejected_max=cfg.rejected_max_files,
            )
        except OSError as exc:
            logfmt.warn("cannot prune the spool; trying again later", error=exc.strerror)
            return
        if removed:
            self.metrics.spool_pruned += removed
            logfmt.info("spool pruned", files=removed)

    def decisions_safe(self) -> bool:
        """Whether decisions may be read now (a sharded node's spool asks before handing a
        decision file to this door: :mod:`daemon.shards.spool`)."""
        return self._decisions_safe()

    def _decisions_safe(self) -> bool:
        """Re-check the decisions directory before each scan; log once per change."""
        try:
            self.spool.check_decisions(self.config.spool.agents_group)
            problem = ""
        except (SpoolPermissionError, OSError) as exc:
            problem = str(exc)
        if problem != self._decisions_problem:
            if problem:
                logfmt.error(
                    "decisions are not read while their directory is unsafe", error=problem
                )
            else:
                logfmt.info("the decisions directory is safe again; reading decisions")
            self._decisions_problem = problem
        return not problem

    async def ingest_all(self) -> None:
        """Ingest every waiting file; one that makes bide itself fail (a bug) is rejected with
        the exception's class as its reason, and the others go on. Decisions wait while their
        directory is open to anyone but the approvers."""
        stages: list[tuple[Path, Callable[[Path], Awaitable[None]]]] = [
            (self.spool.incoming, self.ingest_incoming)
        ]
        if self._decisions_safe():
            stages.append((self.spool.decisions, self.ingest_decision))
        for directory, ingest in stages:
            try:
                waiting = self.spool.pending(directory)
            except OSError as exc:  # out of descriptors, say: the next scan tries again
                logfmt.warn(
                    "cannot list the spool; trying again at the next scan",
                    directory=directory,
                    error=exc.strerror,
                )
                continue
            for path in waiting:
                try:
                    self.faults.fire("ingest", path.name)
                    await ingest(path)
                except FencedError:
                    raise  # left in the spool for the next active node
                except Exception as exc:  # the barrier: one file, not all
                    reject_broken(self.spool, path, exc, decision=directory == self.spool.decisions)

    async def ingest_incoming(self, path: Path) -> None:
        """One file from ``spool/incoming``: a registration, a submit or a fetch request."""
        rid = spool_request_id(path)
        try:
            data, st = self.spool.read(path)
            if rid is None:
                raise Refused("file name is not REQUEST_ID.json (32 lowercase hex digits)")
            request = decode_incoming(data)
            if request.request_id != rid:
                raise Refused("request_id does not match the file name")
            if isinstance(request, SubmitFile):
                await self.intake.submit(Submit(request, st.st_uid))
            elif isinstance(request, FetchFile):
                # The file's owner is who asks: only the operation's registrant or an operator
                # may fetch, as through the API.
                operator = self.intake.authority.is_operator(st.st_uid, st.st_gid)
                await self.intake.fetch(Fetch(request, st.st_uid, operator), spool_request=rid)
        except Refused as exc:
            logfmt.warn("spool file rejected", file=path.name, reason=exc)
            self.spool.reject(path, rid, str(exc))
            return
        if isinstance(request, RegistrationFile):
            await self._ingest_registration(path, rid, request, st.st_uid)
        else:
            self.spool.done(path)  # its receipt follows the action's outcome

    async def _ingest_registration(
        self, path: Path, rid: str, rf: RegistrationFile, owner: int
    ) -> None:
        """Register the job a spool file asks for; the file's owner is who asked."""
        try:
            op, _ = await self.intake.register(Register(rf.registration, owner))
        except Refused as exc:
            logfmt.warn("spool file rejected", file=path.name, reason=exc.detail)
            self.spool.reject(path, rid, scoping.shown(exc.detail, owner))
            return
        self.spool.write_receipt(Receipt(rid, "registered", scoping.shown(op.operation_id, owner)))
        self.spool.done(path)

    async def ingest_decision(self, path: Path) -> None:
        rid = spool_request_id(path)
        try:
            data, st = self.spool.read(path)
            if rid is None:
                raise Refused("file name is not REQUEST_ID.json (32 lowercase hex digits)")
            refused = self.intake.authority.spool_approval(path, st)
            if refused is not None:
                raise Refused(f"not an approval (S36): {refused}")
            try:
                df = msgspec.json.decode(data, type=DecisionFile)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise Refused(f"not a valid decision: {exc}") from None
            approver = user_name(st.st_uid)  # the file's owner, not a name the file claims
            observation = DecisionSubmitted(
                option=df.option, approver=approver, note=df.note, escalation_id=df.escalation_id
            )
            if df.operation_id in self.busy:
                return  # a poll is mid-flight; the next scan picks the file up
            await self.intake.decide(Decide(df.operation_id, observation, st.st_uid))
        except Refused as exc:
            logfmt.warn("decision rejected", file=path.name, reason=exc)
            self.spool.reject(path, rid, str(exc), decision=True)
            return
        self.spool.write_receipt(Receipt(rid, "recorded", df.operation_id), decision=True)
        self.spool.done(path)
        logfmt.info("decision recorded", op=df.operation_id, option=df.option, approver=approver)


def reject_broken(spool: Spool, path: Path, exc: Exception, *, decision: bool) -> None:
    """A file whose ingestion failed inside the daemon (a bug, not the file's fault) goes to
    ``spool/rejected`` with a receipt saying so, and the daemon goes on without it."""
    logfmt.error(
        "internal error while ingesting a spool file; rejected",
        file=path.name,
        error=type(exc).__name__,
        trace=frames(exc),
    )
    spool.reject(
        path,
        spool_request_id(path),
        f"internal error ({type(exc).__name__}) while ingesting; the daemon went on without it",
        decision=decision,
    )
