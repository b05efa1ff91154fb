"""The I/O shell of side-effecting actions: submit, fetch and cancel (see replay.actions).

Each action is recorded before its one call (``ActionIntended``, durable), then its outcome,
then what follows: an accepted submit registers the status operation and polling starts
under its deadline and budgets; a fetched result is stored under ``state_dir/results`` with
its size and SHA-256 recorded; an escalated action waits for ``bide decide ACTION OPTION``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from daemon import logfmt, scoping
from daemon.config import FetchConfig
from daemon.errors import RefusalKind, Refused, retired_refusal
from daemon.faults import FaultInjection
from daemon.http import Answer, NoAnswer, StatusClient
from daemon.outbox import write_text
from daemon.profile import Profile
from daemon.spool import FetchFile, Receipt, Spool, SubmitFile, user_name
from daemon.timers import RateQuota
from eventlog.errors import FencedError
from eventlog.fsync import fsync_dir
from eventlog.writer import Appended
from replay.actions import (
    Action,
    decide_action,
    fetch_target,
    fingerprint,
    judge_answer,
    judge_download,
    judge_unanswered,
)
from replay.decide import format_time, register
from replay.events import (
    ActionDecided,
    ActionEvent,
    ActionFailed,
    ActionIntended,
    ActionSucceeded,
    DecisionRecorded,
    LogEvent,
    OperationRegistered,
    RegistrationRejected,
)
from replay.observations import DecisionSubmitted
from replay.retention import Tombstone
from replay.state import Operation

ANSWER_CAP = 64 * 1024  # bytes read of a submit's or cancel's answer
#: How an action's id ends (``OP.submit``, ``OP.fetch.1``): no operation id may end so, or
#: an operation and an action could answer to one id.
ACTION_ID = re.compile(r"\.(?:submit|fetch\.\d+|cancel\.\d+)$")


@dataclass(frozen=True)
class ActionPorts:
    """What running actions takes from the daemon, and nothing more: the runner holds no
    supervisor, and this module imports none (one direction of dependency)."""

    record: Callable[[Sequence[LogEvent]], Awaitable[list[Appended]]]  # durably, then fold
    clock: Callable[[], float]
    spawn: Callable[[Callable[[str], Coroutine[Any, Any, None]], str], None]  # a daemon task
    schedule: Callable[[str], None]  # arm a status operation's timer
    provider_turn: Callable[[str], Awaitable[None]]  # wait for the provider's quota
    profile: Callable[[str], Profile | None]
    client: Callable[[str], StatusClient | None]
    operation: Callable[[str], Operation | None]
    operations: Callable[[], Iterable[Operation]]
    spool: Spool  # receipts
    state_dir: Path
    outbox_dir: Path
    faults: FaultInjection
    count_internal_error: Callable[[], None]
    #: With the log in PostgreSQL: the seconds a call may take under the lease (its timeout,
    #: a fetch's cut to what the lease leaves), once the lease has that plus the margin left
    #: by this node's clock; None when it has not (the call is not sent). Without a lease,
    #: the timeout as it is.
    lease_room: Callable[[float, bool], Awaitable[float | None]]
    #: The lease's room asked again as a call's first byte is written (``daemon.http``'s
    #: ``gate``; a paused process past its lease sends nothing); None without a lease.
    send_gate: Callable[[float], bool] | None = None
    #: Fetches: the rate per principal and what ``results/`` keeps (``[fetch]``).
    fetch_limits: FetchConfig = field(default_factory=FetchConfig)
    #: A retired operation's tombstone (``[retention]``): its id stays held by its owner.
    retired: Callable[[str], Tombstone | None] = field(default=lambda op_id: None)


class ActionRunner:
    def __init__(self, ports: ActionPorts) -> None:
        self.ports = ports
        self.actions: dict[str, Action] = {}
        self.results_dir = ports.state_dir / "results"
        self._fetch_quotas: dict[int, RateQuota] = {}

    # -- ingest ------------------------------------------------------------------------------

    async def ingest_submit(
        self, rid: str, sf: SubmitFile, owner: int, *, digest: str = ""
    ) -> int | None:
        """Record the submit's intent and start it; returns the intent's log sequence number
        (None when this submit was recorded before: a retry)."""
        ports = self.ports
        reg = sf.registration
        profile = ports.profile(reg.provider)
        if profile is None:
            raise Refused(f"no profile for provider {reg.provider!r}")
        if profile.submit is None:
            raise Refused(
                f"profile {profile.name} has no [submit] section: it documents no submit call"
            )
        if len(sf.body) > profile.submit.max_body_bytes:
            raise Refused(
                f"body is {len(sf.body)} bytes; the profile allows {profile.submit.max_body_bytes}"
            )
        if ACTION_ID.search(reg.operation_id):
            raise Refused(
                f"operation id {reg.operation_id!r} ends like an action's id "
                f"(.submit, .fetch.N, .cancel.N); choose another"
            )
        if self.holder(reg.operation_id) != owner:
            why = scoping.refusal(reg.operation_id)
            if why is not None:
                raise Refused(why)
        # Another principal's id is this owner's too, recorded apart (daemon.scoping).
        reg = msgspec.structs.replace(
            reg, operation_id=scoping.recorded_id(reg.operation_id, owner, self.holder)
        )
        action_id = f"{reg.operation_id}.submit"
        fp = fingerprint(profile.submit.method, profile.submit.url, sf.body)
        existing = self.actions.get(action_id)
        if existing is not None:
            same = existing.intent.request_fingerprint == fp and (
                not digest or existing.intent.request_digest in ("", digest)
            )
            if same:
                return None  # ingested before a crash, or a client's retry
            raise Refused(
                f"operation id {reg.operation_id} is already in use",
                kind=RefusalKind.CONFLICT,
                code="operation_id_in_use",
            )
        retired = ports.retired(reg.operation_id)
        if retired is not None:
            raise retired_refusal(reg.operation_id, retired)
        if ports.operation(reg.operation_id) is not None:
            raise Refused(
                f"operation id {reg.operation_id} is already in use",
                kind=RefusalKind.CONFLICT,
                code="operation_id_in_use",
            )
        if not sf.force:
            duplicate = self._live_with_fingerprint(fp, owner)
            if duplicate is not None:
                raise Refused(
                    f"duplicate submit: operation {duplicate} has the same request "
                    f"fingerprint and is still live (use --force to submit again)"
                )
        key = sf.idempotency_key
        if key is None and profile.contract.idempotent_submit:
            key = secrets.token_hex(16)  # S29: recorded before the request leaves
        template = msgspec.structs.replace(reg, request_fingerprint=fp, idempotency_key=key)
        intent = ActionIntended(
            operation_id=reg.operation_id,
            at=ports.clock(),
            action_id=action_id,
            kind="submit",
            provider=profile.name,
            method=profile.submit.method,
            url=profile.submit.url,
            request_fingerprint=fp,
            idempotency_key=key,
            timeout_seconds=profile.submit.timeout_seconds,
            body=sf.body,
            registration=template,
            spool_request=rid,
            registered_by=user_name(owner),
            registered_by_uid=owner,
            request_digest=digest,
        )
        landed = await ports.record([intent])
        self.start(action_id)
        return landed[0].seq

    def _live_with_fingerprint(self, fp: str, owner: int) -> str | None:
        """The owner's own live operation (or submit) with this fingerprint: another
        principal's is none of its business, and naming it would tell that it exists."""
        for op in self.ports.operations():
            if (
                op.request_fingerprint == fp
                and op.phase in ("live", "escalated")
                and op.registered_by_uid == owner
            ):
                return scoping.shown(op.operation_id, owner)
        for action in self.actions.values():
            if (
                action.kind == "submit"
                and action.intent.request_fingerprint == fp
                and action.phase in ("in_flight", "escalated")
                and action.intent.registered_by_uid == owner
            ):
                return scoping.shown(action.operation_id, owner)
        return None

    def holder(self, op_id: str) -> int | None:
        """Who registered ``op_id`` (or submits it): a uid, None for an operation recorded
        before registrants were, :data:`daemon.scoping.FREE` when nothing holds it."""
        op = self.ports.operation(op_id)
        if op is not None:
            return op.registered_by_uid
        submit = self.actions.get(f"{op_id}.submit")
        if submit is not None:
            return submit.intent.registered_by_uid
        retired = self.ports.retired(op_id)
        if retired is not None:
            return retired.owner_uid
        return scoping.FREE

    def resolve(self, op_id: str, uid: int) -> str:
        """The recorded id of what ``uid`` calls ``op_id``: its own scoped operation when
        another principal holds ``op_id``, else ``op_id`` (an action id too: ``X.fetch.1``)."""
        if self.holder(op_id) == uid:
            return op_id
        mine = scoping.scoped(op_id, uid)
        if self.holder(mine) != scoping.FREE:
            return mine
        m = ACTION_ID.search(op_id)
        if m is not None:
            action = scoping.scoped(op_id[: m.start()], uid) + op_id[m.start() :]
            if action in self.actions:
                return action
        return op_id

    async def ingest_fetch(self, rid: str, ff: FetchFile, requester: int) -> ActionIntended:
        """Record a fetch asked for by the user ``requester`` (the API's peer or the spool
        file's owner) and start it; returns its intent.

        Who may fetch is the intake's rule (``daemon.engine.intake.Authority.may_fetch``),
        checked before this is called. Each principal is held to ``[fetch]
        per_principal_per_minute``."""
        ports = self.ports
        op = ports.operation(self.resolve(ff.operation_id, requester))
        if op is None:
            raise Refused(
                f"no operation {ff.operation_id!r}", kind=RefusalKind.NOT_FOUND, code="not_found"
            )
        self._take_fetch_slot(requester)
        target = fetch_target(op.phase, op.results, ff.result)
        if isinstance(target, str):
            raise Refused(
                f"operation {op.operation_id}: {target}",
                kind=RefusalKind.CONFLICT,
                code="not_fetchable",
            )
        name, url = target
        profile = ports.profile(op.provider)
        if profile is None:
            raise Refused(
                f"no profile for provider {op.provider!r}",
                kind=RefusalKind.CONFLICT,
                code="not_fetchable",
            )
        n = 1 + sum(
            1
            for a in self.actions.values()
            if a.operation_id == op.operation_id and a.kind == "fetch"
        )
        intent = ActionIntended(
            operation_id=op.operation_id,
            at=ports.clock(),
            action_id=f"{op.operation_id}.fetch.{n}",
            kind="fetch",
            provider=op.provider,
            method="GET",
            url=url,
            timeout_seconds=profile.fetch.timeout_seconds,
            max_bytes=profile.fetch.max_bytes,
            spool_request=rid or None,
            result_name=name,
            requested_by=user_name(requester),
            requested_by_uid=requester,
        )
        await ports.record([intent])
        self.start(intent.action_id)
        return intent

    def _take_fetch_slot(self, requester: int) -> None:
        limits = self.ports.fetch_limits
        quota = self._fetch_quotas.get(requester)
        if quota is None:
            quota = self._fetch_quotas[requester] = RateQuota(
                limits.per_principal_per_minute / 60.0, limits.burst
            )
        wait = quota.reserve()
        if wait > 0:
            quota.release()
            raise Refused(
                f"user {user_name(requester)} asks for fetches faster than [fetch] "
                f"per_principal_per_minute = {limits.per_principal_per_minute:g}; try again in "
                f"{wait:.1f}s",
                kind=RefusalKind.RATE_LIMITED,
                code="fetch_rate_limited",
                retry_after=wait,
            )

    def prune_results(self, keep: str | None = None) -> None:
        """Remove results older than ``[fetch] results_max_age_seconds``, then the oldest
        until ``results/`` holds at most ``results_max_bytes``; ``keep`` (the result just
        stored) always stays, so a fetch larger than the cap is still handed over."""
        limits = self.ports.fetch_limits
        now = time.time()
        try:
            entries = list(os.scandir(self.results_dir))
        except FileNotFoundError:
            return
        files: list[tuple[float, int, str]] = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((st.st_mtime, st.st_size, entry.name))
        files.sort()
        total = sum(size for _, size, _ in files)
        removed = 0
        for mtime, size, name in files:
            old = now - mtime > limits.results_max_age_seconds
            if name == keep or not (old or total > limits.results_max_bytes):
                continue
            if name.endswith(".part") and not old:
                continue  # a download in progress
            with contextlib.suppress(FileNotFoundError):
                (self.results_dir / name).unlink()
            total -= size
            removed += 1
        if removed:
            logfmt.info(
                "results pruned",
                removed=removed,
                kept_bytes=total,
                max_bytes=limits.results_max_bytes,
            )

    async def decide(self, action: Action, decision: DecisionSubmitted) -> ActionDecided:
        events = decide_action(action, decision, self.ports.clock())
        await self.ports.record(events)
        if any(isinstance(e, ActionIntended) for e in events):
            self.start(action.action_id)
        decided = events[0]
        assert isinstance(decided, ActionDecided)
        return decided

    async def after_decision(self, events: list[object]) -> None:
        """A closing decision that chose ``cancel_at_provider`` starts the cancel action."""
        for ev in events:
            if isinstance(ev, DecisionRecorded) and ev.follow_up == "cancel_at_provider":
                await self.start_cancel(ev.operation_id)

    async def start_cancel(self, op_id: str) -> None:
        ports = self.ports
        op = ports.operation(op_id)
        if op is None:
            return
        profile = ports.profile(op.provider)
        if profile is None or profile.cancel is None:
            logfmt.error("cancel chosen but the profile documents no cancel call", op=op_id)
            return
        n = 1 + sum(
            1 for a in self.actions.values() if a.operation_id == op_id and a.kind == "cancel"
        )
        try:
            cancel_url = profile.cancel_url(op.provider_job_id)
        except ValueError as exc:  # a {+job_id} path id with a dot or empty segment
            logfmt.error("cancel not sent", op=op_id, reason=str(exc))
            return
        intent = ActionIntended(
            operation_id=op_id,
            at=ports.clock(),
            action_id=f"{op_id}.cancel.{n}",
            kind="cancel",
            provider=op.provider,
            method=profile.cancel.method,
            url=cancel_url,
            timeout_seconds=profile.cancel.timeout_seconds,
        )
        await ports.record([intent])
        self.start(intent.action_id)

    # -- restart -----------------------------------------------------------------------------

    async def recover(self) -> None:
        """Intents without outcomes (a crash in between) are ambiguous: judged as such (S29).
        Results kept past their age or the size cap are removed."""
        ports = self.ports
        self.prune_results()
        for action in list(self.actions.values()):
            if action.phase != "in_flight":
                continue
            profile = ports.profile(action.provider)
            spec = profile.submit_spec if profile else None
            events = judge_unanswered(action.intent, None, "", spec, ports.clock())
            logfmt.warn("action outcome unknown after restart", action=action.action_id)
            await self._outcome(action.action_id, events)
        for op in list(ports.operations()):
            if (
                op.phase == "closed"
                and op.follow_up == "cancel_at_provider"
                and not any(
                    a.operation_id == op.operation_id and a.kind == "cancel"
                    for a in self.actions.values()
                )
            ):
                await self.start_cancel(op.operation_id)

    # -- running -----------------------------------------------------------------------------

    def start(self, action_id: str) -> None:
        self.ports.spawn(self._guarded, action_id)

    async def _guarded(self, action_id: str) -> None:
        """The barrier: if bide fails (a bug) while running the action, its outcome is
        recorded as unknown (the call may have left), which escalates a submit or cancel and
        fails a fetch; the daemon and every other action go on."""
        try:
            self.ports.faults.fire("action", action_id)
            await self._run(action_id)
        except FencedError:
            raise  # another node holds the log: this node's term ends (daemon.node)
        except Exception as exc:  # one action, not the daemon
            name = type(exc).__name__
            logfmt.error("internal error while running an action", action=action_id, error=name)
            self.ports.count_internal_error()
            action = self.actions.get(action_id)
            if action is None or action.phase != "in_flight":
                return
            events = judge_unanswered(
                action.intent,
                None,
                f"internal error ({name}) during the call; it may have left",
                None,
                self.ports.clock(),
            )
            with contextlib.suppress(Exception):
                await self._outcome(action_id, events)

    async def _run(self, action_id: str) -> None:
        ports = self.ports
        action = self.actions[action_id]
        intent = action.intent
        client = ports.client(intent.provider)
        profile = ports.profile(intent.provider)
        if client is None or profile is None:
            events = judge_unanswered(
                intent,
                "connect_refused",
                f"no profile for provider {intent.provider}",
                None,
                ports.clock(),
            )
            await self._outcome(action_id, events)
            return
        if intent.kind == "fetch":
            await self._outcome(action_id, await self._download(intent, client))
            return
        headers: dict[str, str] = {}
        if intent.kind == "submit" and profile.submit is not None:
            headers["Content-Type"] = profile.submit.content_type
            if intent.idempotency_key and profile.contract.idempotent_submit:
                headers[profile.submit.idempotency_header] = intent.idempotency_key
        await ports.provider_turn(intent.provider)  # the provider's quota covers every call
        seconds = await ports.lease_room(intent.timeout_seconds, False)
        if seconds is None:
            await self._outcome(action_id, self._not_sent(intent))
            return
        result = await client.call(
            intent.method,
            intent.url,
            seconds=seconds,
            cap=ANSWER_CAP,
            body=intent.body or None,
            headers=headers,
            gate=ports.send_gate,
        )
        spec = profile.submit_spec
        if isinstance(result, NoAnswer):
            events = judge_unanswered(intent, result.kind, result.detail, spec, ports.clock())
        else:
            events = judge_answer(
                intent,
                result.status,
                result.headers,
                result.operation_location,
                result.body,
                spec,
                profile.origin,
                ports.clock(),
            )
        await self._outcome(action_id, events)

    async def _outcome(self, action_id: str, events: list[ActionEvent]) -> None:
        ports = self.ports
        await ports.record(events)
        action = self.actions[action_id]
        if action.phase == "in_flight":  # an automatic retry was recorded (S29)
            self.start(action_id)
            return
        outcome = action.outcome
        rid = action.intent.spool_request
        if isinstance(outcome, ActionSucceeded):
            if action.kind == "submit":
                await self._register(action, outcome)
            elif action.kind == "fetch" and rid:
                who = action.intent.requested_by_uid
                ports.spool.write_receipt(
                    Receipt(
                        rid,
                        "fetched",
                        _shown(action.operation_id, who),
                        action_id=_shown(action_id, who),
                        stored_as=outcome.stored_as,
                        sha256=outcome.sha256,
                        size=outcome.size,
                    ),
                    reader=who,
                )
            logfmt.info("action succeeded", action=action_id, http=outcome.http_status)
            return
        if isinstance(outcome, ActionFailed):
            self._announce(action, outcome)
            if rid:
                status = "escalated" if outcome.options else "failed"
                who = (
                    action.intent.requested_by_uid
                    if action.kind == "fetch"
                    else action.intent.registered_by_uid
                )
                ports.spool.write_receipt(
                    Receipt(
                        rid,
                        status,  # type: ignore[arg-type]
                        _shown(action.operation_id, who),
                        f"{outcome.reason}: {outcome.detail}",
                        action_id=_shown(action_id, who),
                    ),
                    reader=who,
                )

    async def _register(self, action: Action, outcome: ActionSucceeded) -> None:
        ports = self.ports
        template = action.intent.registration
        profile = ports.profile(action.provider)
        rid = action.intent.spool_request
        if template is None or profile is None or outcome.provider_job_id is None:
            return
        reg = msgspec.structs.replace(
            template,
            provider_job_id=outcome.provider_job_id,
            status_location=outcome.status_location,
        )
        events = register(
            reg,
            profile.contract,
            ports.clock(),
            registered_by=action.intent.registered_by,
            registered_by_uid=action.intent.registered_by_uid,
        )
        rejected = next((e for e in events if isinstance(e, RegistrationRejected)), None)
        if rejected is not None:
            logfmt.error(
                "accepted job could not be registered", op=reg.operation_id, reason=rejected.reason
            )
            if rid:
                who = action.intent.registered_by_uid
                ports.spool.write_receipt(
                    Receipt(
                        rid,
                        "rejected",
                        _shown(reg.operation_id, who),
                        f"{rejected.reason}: {rejected.detail}",
                    ),
                    reader=who,
                )
            return
        await ports.record(events)
        registered = next(e for e in events if isinstance(e, OperationRegistered))
        ports.schedule(registered.operation_id)
        logfmt.info(
            "submitted and registered", op=registered.operation_id, job=registered.provider_job_id
        )
        if rid:
            who = action.intent.registered_by_uid
            ports.spool.write_receipt(
                Receipt(
                    rid,
                    "registered",
                    _shown(registered.operation_id, who),
                    action_id=_shown(action.action_id, who),
                ),
                reader=who,
            )

    async def _download(self, intent: ActionIntended, client: StatusClient) -> list[ActionEvent]:
        """Stream the result to ``results/ACTION.part``, then rename it: never a partial file."""
        ports = self.ports
        self.results_dir.mkdir(mode=0o750, exist_ok=True)
        final = self.results_dir / _safe(intent.action_id)
        part = final.with_name(final.name + ".part")
        digest = hashlib.sha256()
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        try:

            def sink(chunk: bytes) -> None:
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]

            cap = intent.max_bytes or 1
            await ports.provider_turn(intent.provider)
            seconds = await ports.lease_room(intent.timeout_seconds, True)
            if seconds is None:
                return self._not_sent(intent)
            result = await client.call(
                "GET",
                intent.url,
                seconds=seconds,
                cap=cap,
                sink=sink,
                headers={"Accept": "*/*"},
                gate=ports.send_gate,
            )
            if isinstance(result, Answer) and 200 <= result.status < 300 and not result.truncated:
                os.fsync(fd)
        finally:
            os.close(fd)
        now = ports.clock()
        if isinstance(result, NoAnswer):
            part.unlink(missing_ok=True)
            return judge_unanswered(intent, result.kind, result.detail, None, now)
        events = judge_download(
            intent,
            result.status,
            result.size,
            result.truncated,
            digest.hexdigest(),
            final.name,
            now,
        )
        if not isinstance(events[0], ActionSucceeded):
            part.unlink(missing_ok=True)
            return events
        os.chmod(part, 0o640)
        os.rename(part, final)
        with contextlib.suppress(OSError):
            fsync_dir(self.results_dir)
        self.prune_results(keep=final.name)
        return events

    def _not_sent(self, intent: ActionIntended) -> list[ActionEvent]:
        return judge_unanswered(
            intent,
            "not_sent",
            "not sent: the log's lease would not outlive the call once its intent was durable",
            None,
            self.ports.clock(),
        )

    def _announce(self, action: Action, failed: ActionFailed) -> None:
        if not failed.options:
            logfmt.warn(
                "action failed", action=action.action_id, reason=failed.reason, detail=failed.detail
            )
            return
        text = action_escalation_text(action, failed)
        path = write_text(self.ports.outbox_dir, f"{action.action_id}.{action.attempts}", text)
        logfmt.warn(
            "action escalated",
            action=action.action_id,
            reason=failed.reason,
            outbox=path,
            options=",".join(o.id for o in failed.options),
        )


def action_escalation_text(action: Action, failed: ActionFailed) -> str:
    lines = [
        f"bide escalation {action.action_id}: {failed.reason}",
        f"  action:        {action.kind} for operation {action.operation_id} "
        f"(provider {action.provider})",
        f"  request:       {action.intent.method} {action.intent.url}, attempt "
        f"{action.attempts}"
        + (
            ", idempotency key recorded"
            if action.intent.idempotency_key
            else ", no idempotency key"
        ),
        f"  outcome:       {failed.detail or failed.reason} at {format_time(failed.at)}"
        + (" (the request may have taken effect)" if failed.ambiguous else ""),
        "  options:",
    ]
    lines += [f"    {n}. {o.id}: {o.label}" for n, o in enumerate(failed.options, start=1)]
    lines.append(f"  decide with:   bide decide {action.action_id} OPTION [--note TEXT]")
    return "\n".join(lines) + "\n"


def _shown(text: str, uid: int | None) -> str:
    return scoping.shown(text, uid) if uid is not None else text


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
