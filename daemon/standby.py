"""A standby node's answers: its copy of the log, read as it grows, behind the local API.

With the log in PostgreSQL a standby copies every committed round into its local segment
files (:meth:`daemon.lease.Lease.acquire`). This module reads that copy as it grows and folds
it the way the daemon folds its log at start (:class:`replay.ledger.Ledger`, and the engine's
followers for stories, waiters and live counts, but not the one that announces escalations:
the active node does), and answers the local API's reads from it: health (``role:
standby``, naming the active node and its epoch), an operation, the list, the escalations,
a story, a bounded wait. Every write is refused with 503 and ``Retry-After``, naming the
active node: only the node holding the lease records anything.

Reads are answered here rather than forwarded: the active node's API is a Unix socket on
another host, so there is nothing to forward to, and the copy is at most a committed round
behind (the standby follows on every ``NOTIFY``). A fetched result's file lives on the node
that fetched it: its content is refused here like a write.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec

from daemon import __version__, logfmt
from daemon.api.schema import ActiveNode, Health
from daemon.api.server import Request, Response
from daemon.api.service import Api, Caller
from daemon.config import Config
from daemon.engine.chain import Follower
from daemon.engine.followers import Observed
from daemon.errors import RefusalKind, Refused
from daemon.supervisor import Supervisor
from eventlog.envelope import Checkpoint, EventRecord
from eventlog.errors import DecryptError, EventLogError, UnknownKeyError
from eventlog.keys import KeyRing
from eventlog.reader import LogReader, StoredRecord
from replay.errors import NewerSchemaError, ReplayError
from replay.events import LogEvent, OperationRegistered, decode_log_event

#: The longest a standby's copy goes unread when no follow pokes it.
REFRESH_SECONDS = 2.0
#: Events folded between two turns of the event loop (a long copy read at start must not
#: keep health from answering).
FOLD_SLICE = 5000


@dataclass(frozen=True)
class _Read:
    """What one read of the copy found: events (seq, payload), the last takeover record, and
    the copy's head."""

    payloads: list[tuple[int, bytes]]
    takeover: ActiveNode | None
    head: tuple[int, str] | None
    unreadable: int


class StandbyReads:
    """The standby's copy of the log, folded; rebuilt from scratch when the copy is (the
    lease moves a copy that is not the database's aside and copies it again)."""

    def __init__(self, config: Config, make: Callable[[], Supervisor], node: str) -> None:
        self.config = config
        self.node = node
        self._make = make
        self.active: ActiveNode | None = None
        self.head: tuple[int, str] | None = None
        self.ready = False
        self.broken: str | None = None  # the copy cannot be read by this bide (a newer one)
        self._news = anyio.Event()
        self._advanced = anyio.Event()  # set (and replaced) whenever the folded head moves
        self.ended = False  # these reads answer no more (the node took the shard, or stopped)
        self._reset()

    def _reset(self) -> None:
        self.sup = self._make()
        chain = self.sup.chain
        self.sup.runner.actions = chain.ledger.actions
        self._followers: list[Follower] = [
            f for f in chain.followers if not isinstance(f, Observed)
        ]
        for follower in self._followers:
            follower.replayed(chain.ledger, -1)
        self.sup.histories.loaded = True  # every event reaches the histories as it is read
        self.api = StandbyApi(self.sup, self)
        self._reader: _CopyReader | None = None
        self._copy: tuple[int, int] | None = None  # the copy directory's (device, inode)
        self.ready = False

    async def handle(self, request: Request) -> Response:
        self.sup.metrics.api_requests += 1
        return await self.api.handle(request)

    def count(self, reason: str) -> None:
        self.sup.metrics.api_rejections[reason] += 1

    def poke(self) -> None:
        """The lease copied new records (or looked for them): read them now."""
        self._news.set()

    async def run(self) -> None:
        """Read and fold the copy as it grows, until cancelled."""
        async with anyio.create_task_group() as tg:
            self.sup.polls = tg  # the API's background reads run here
            while True:
                self._news = anyio.Event()
                try:
                    await self.refresh()
                except Exception as exc:  # the barrier: a bug here must not end the node
                    logfmt.error(
                        "standby: reading its copy of the log failed; reading it again",
                        error=f"{type(exc).__name__}: {exc}"[:300],
                    )
                    self._reset()
                if self.sup.polls is not tg:  # rebuilt: its tasks run here too
                    self.sup.polls = tg
                with anyio.move_on_after(REFRESH_SECONDS):
                    await self._news.wait()

    async def refresh(self) -> None:
        if self.broken is not None:
            return
        try:
            st = os.stat(self.config.log_dir)
        except FileNotFoundError:
            return  # nothing copied yet
        if self._copy is not None and self._copy != (st.st_dev, st.st_ino):
            logfmt.info("standby: the local copy of the log was rebuilt; reading it again")
            self._reset()
        self._copy = (st.st_dev, st.st_ino)
        while True:  # a segment's worth at a time: a long copy read at start stays bounded
            try:
                read = await anyio.to_thread.run_sync(self._read)
            except EventLogError as exc:
                logfmt.warn("standby cannot read its copy of the log; reading it again", error=exc)
                self._reset()
                return
            if read is None:
                break
            if read.unreadable:
                logfmt.warn(
                    "standby: log events left out (unreadable: retired data key)",
                    count=read.unreadable,
                )
            try:
                await self._fold(read.payloads)
            except NewerSchemaError as exc:
                self.broken = str(exc)
                logfmt.error("standby cannot read the log: upgrade bide on this node", error=exc)
                return
            if read.takeover is not None:
                self.active = read.takeover
            if read.head is not None:
                self.head = read.head
                if self.ready:
                    self._advance()
        self.ready = True
        self._advance()

    def _advance(self) -> None:
        self._advanced.set()
        self._advanced = anyio.Event()

    def end(self) -> None:
        """These reads answer no more: wake every :meth:`folded` waiting on them."""
        self.ended = True
        self._advance()

    async def folded(self, seq: int) -> None:
        """Return once the copy is read and folded to record ``seq`` (or these reads
        ended)."""
        while not self.ended and not (self.ready and self.head is not None and self.head[0] >= seq):
            await self._advanced.wait()

    def _read(self) -> _Read | None:
        """The next records copied since the last read, at most a segment's (in a worker
        thread); None when there are none."""
        if self._reader is None:
            self._reader = _CopyReader(self.config.log_dir, self.sup.keyring)
        reader = self._reader
        chunk = reader.next_chunk()
        if chunk is None:
            return None
        payloads: list[tuple[int, bytes]] = []
        takeover: ActiveNode | None = None
        unreadable = 0
        head: tuple[int, str] | None = None
        for stored in chunk:
            head = (stored.seq, stored.hash)
            rec = stored.record
            if isinstance(rec, EventRecord):
                try:
                    payloads.append((stored.seq, reader.decrypt(stored)))
                except (UnknownKeyError, DecryptError):
                    unreadable += 1
            elif isinstance(rec, Checkpoint) and rec.holder:
                node = rec.holder.split("/", 1)[0]
                takeover = ActiveNode(node=node, holder=rec.holder, epoch=rec.lease_epoch)
        return _Read(payloads, takeover, head, unreadable)

    async def _fold(self, payloads: list[tuple[int, bytes]]) -> None:
        """Fold the events as the daemon's chain does, for the followers kept here."""
        ledger = self.sup.chain.ledger
        for start in range(0, len(payloads), FOLD_SLICE):
            for seq, payload in payloads[start : start + FOLD_SLICE]:
                try:
                    ev: LogEvent = decode_log_event(payload)
                    before = ledger.ops.get(ev.operation_id)
                    op = ledger.apply(ev)
                except NewerSchemaError:
                    raise
                except ReplayError:
                    continue  # as a start-up replay leaves it out (its operation is unreadable)
                if isinstance(ev, OperationRegistered) and op is not None:
                    op = ledger.ops[ev.operation_id] = msgspec.structs.replace(
                        op, registered_seq=seq
                    )
                for follower in self._followers:
                    follower.event(ev, payload, before, op)
            for follower in self._followers:
                follower.batch_done()
            await anyio.lowlevel.checkpoint()

    # -- what the API says ------------------------------------------------------------------

    def health(self, caller: Caller) -> Health:
        ops = self.sup.ops.values()
        return Health(
            status="ok" if self.broken is None else "log_failing",
            version=__version__,
            log_head_sequence=self.head[0] if self.head is not None else -1,
            log_head_hash=self.head[1] if self.head is not None else "",
            live=sum(1 for op in ops if op.phase == "live"),
            escalated=sum(1 for op in ops if op.phase == "escalated"),
            you=caller.principal(),
            log_store="postgresql",
            role="standby",
            active=self.active,
        )

    def refused(self, doing: str) -> Refused:
        """A write (or a fetched file) asked of a standby: 503, naming the active node."""
        active = self.active
        who = (
            f"the active node is {active.node} (epoch {active.epoch}); send it to the bide "
            f"API on that node's host (its socket, {self.config.socket_path} with this "
            f"config), or use its spool"
            if active is not None
            else "no node has taken the log yet; try again once one has"
        )
        pg = self.config.postgres
        return Refused(
            f"this node ({self.node}) is a standby: it answers reads from its copy of the "
            f"log and records nothing, so it cannot {doing}; {who}. Should the active node "
            f"fail, this node may take over: asking here again after Retry-After is safe",
            kind=RefusalKind.UNAVAILABLE,
            code="standby",
            retry_after=math.ceil(pg.lease_seconds) if pg is not None else 10,
        )


class _CopyReader(LogReader):
    """The copy's reader, one segment file's new records at a time."""

    def __init__(self, log_dir: Path, keyring: KeyRing) -> None:
        super().__init__(log_dir, keyring)
        self._pending: Iterator[list[StoredRecord]] | None = None

    def next_chunk(self) -> list[StoredRecord] | None:
        while True:
            if self._pending is None:
                self._pending = self._chunks()
            chunk = next(self._pending, None)
            if chunk is None:
                self._pending = None  # read to the end: the next call looks again
                return None
            if chunk:
                return chunk


class StandbyApi(Api):
    """The local API as a standby answers it: :class:`Api`'s reads, from the copy."""

    def __init__(self, supervisor: Supervisor, reads: StandbyReads) -> None:
        super().__init__(supervisor)
        self.reads = reads

    async def _route(self, caller: Caller, request: Request, method: str, path: str) -> Response:
        if path == "/v1/health" and method == "GET":
            return Response(200, msgspec.json.encode(self.reads.health(caller)))
        if method != "GET":
            raise self.reads.refused(f"record anything ({method} {path})")
        if path.startswith("/v1/fetches/") and path.endswith("/content"):
            raise self.reads.refused(
                "hand out a fetched result (its file is on the node that fetched it)"
            )
        if self.reads.broken is not None:
            raise Refused(
                f"this standby cannot read the log ({self.reads.broken}); upgrade bide here",
                kind=RefusalKind.UNAVAILABLE,
                code="standby_cannot_read",
                retry_after=60,
            )
        if not self.reads.ready:
            raise Refused(
                "this standby is still reading its copy of the log; ask again shortly",
                kind=RefusalKind.UNAVAILABLE,
                code="loading",
                retry_after=1,
            )
        return await super()._route(caller, request, method, path)
