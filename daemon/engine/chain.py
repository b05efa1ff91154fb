"""The chain: one log and the state folded from it (the future unit of a shard).

One job: own one event log. Its ledger (every operation's and action's state), appending
with retry while the log fails, folding every durable event into the ledger and handing it to
the followers (:mod:`daemon.engine.followers`), state snapshots, recovery at start (what a
crash left undecided or in flight), and the lease gate (no request unless the lease outlives
it; an append refused under another epoch ends this node's term).

:meth:`Chain.handle` is the one path that decides and records: ``decide`` (from
``replay/``) on an observation, with this process's clock and jitter, then the events made
durable and folded. Every event is appended before the state it leads to is acted on: the
in-memory ledger only ever reflects durable events, and every durable event is folded in
(even when its appender is cancelled), so a snapshot of the state at a log position is the
fold of the log up to it. Snapshots are taken every ``[log] snapshot_every`` events, at a
moment no append is in flight (new appends wait the few milliseconds that takes), and at a
clean stop; they are encoded, sealed and written in a worker thread.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec

from daemon import logfmt, systemd
from daemon.config import Config
from daemon.metrics import Metrics
from daemon.snapshots import (
    Snapshot,
    SnapshotKeys,
    load_snapshot,
    replay_log,
    write_snapshot_in_thread,
)
from eventlog.envelope import Takeover
from eventlog.epochs import EpochSigning
from eventlog.errors import EventLogError, FencedError, LogIOError
from eventlog.heads import HeadStore
from eventlog.keys import KeyRing, Signer
from eventlog.position import LogPosition
from eventlog.store import LineStore
from eventlog.writer import Appended, LogWriter
from replay.decide import decide
from replay.events import (
    LogEvent,
    NodeTookOver,
    OperationRegistered,
    PollScheduled,
    RequestOutcomeUnknown,
    encode_checked,
)
from replay.ledger import Fact, Ledger
from replay.observations import InternalFault, Observation
from replay.retention import RetentionPolicy, Tombstone
from replay.retention import due as due_retirements
from replay.state import Operation, evolve

#: Takeover events recorded per durable batch (one per operation not ended).
_TAKEOVER_BATCH = 1000
#: Retirements recorded in one durable batch at most (one write, one fsync).
RETIRE_BATCH = 1000


class RequestGate(Protocol):
    """What the engine asks of a lease before each provider request."""

    def allows(self, request_seconds: float) -> bool: ...

    def remaining(self) -> float:
        """Seconds the lease has left by this node's clock (negative once it ran out)."""

    @property
    def longest_request(self) -> float: ...

    def health(self) -> tuple[str, int, float]: ...

    def metrics_lines(self) -> list[str]: ...

    async def wait_allows(self, request_seconds: float) -> None: ...

    def fenced(self, why: str) -> None:
        """An append was refused under another epoch: end this node's term now."""


class Follower(Protocol):
    """A projection kept beside the ledger, fed every durable event as it is folded."""

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        """The ledger was rebuilt from the log at start (events up to ``head_seq``)."""

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        """One event folded: its operation's state before and after (None for an event of
        an action, or of an operation the ledger does not hold)."""

    def batch_done(self) -> None:
        """Every event of one durable batch is folded."""


class Chain:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        signing: EpochSigning | Signer,
        *,
        metrics: Metrics,
        clock: Callable[[], float],
        draw: Callable[[], float],
        heads: HeadStore | None = None,
        store: LineStore | None = None,
        lease: RequestGate | None = None,
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.signing = signing  # signs the log: epoch keys, or format 2's one key
        self.snapshot_keys = SnapshotKeys.of(signing)  # tag the state snapshot
        self.heads = heads  # every published head; refuses a log rolled back behind them
        self.store = store  # the log in PostgreSQL: every write round committed there too
        self.lease = lease  # no request unless the lease outlives it (daemon.lease)
        self.metrics = metrics
        self.clock = clock
        self.draw = draw
        self.ledger = Ledger()
        self.from_snapshot = 0  # events the ledger was given by the snapshot at start
        self.followers: list[Follower] = []
        self.set_aside: set[str] = set()  # failed twice (a bug): not polled again here
        #: op id -> (next_poll_at, monotonic end) of the wait last scheduled in this process
        self.waits: dict[str, tuple[float, float]] = {}
        #: Runs snapshot writes in the daemon's task group; None until it runs (no snapshot).
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None] | None = None
        self.stopping = anyio.Event()
        self.on_set_aside: Callable[[str], None] = lambda op_id: None
        self.status_line: Callable[[bool], str] = lambda alarm: ""
        self._log: LogWriter | None = None
        self._log_recovery = anyio.Lock()
        self._appending = 0  # record() calls between queueing and folding their events
        self._snapshot_barrier: anyio.Event | None = None  # new appends wait while set
        self._snapshot_writing = False
        self._snapshot_events = 0  # the ledger's event count at the last snapshot
        self._append_failing = (0.0, 0)  # (monotonic start, attempts) while appends fail
        self._append_errors: set[str] = set()  # errors logged in this failing episode

    def follow(self, follower: Follower) -> None:
        """Feed ``follower`` every event folded from now on (in registration order)."""
        self.followers.append(follower)

    @property
    def ops(self) -> dict[str, Operation]:
        return self.ledger.ops

    @property
    def position(self) -> LogPosition | None:
        """The log's head (None before it is open, or while it is empty)."""
        return self._log.position if self._log is not None else None

    @property
    def log(self) -> LogWriter:
        assert self._log is not None
        return self._log

    @property
    def flushes(self) -> int:
        return self._log.flushes if self._log is not None else 0

    # -- deciding and recording ---------------------------------------------------------------

    def decide(self, op: Operation, observation: Observation) -> list[LogEvent]:
        """What ``observation`` means for ``op`` now (nothing recorded yet)."""
        return list(decide(op, observation, self.clock(), self.draw()))

    async def handle(
        self,
        op: Operation,
        observation: Observation,
        *,
        with_fact: bool = False,
        now: float | None = None,
    ) -> list[LogEvent]:
        """Decide what ``observation`` means for ``op`` and record the events durably: the one
        decide-then-record path. ``with_fact``: the observation is a fact not yet recorded (a
        provider's answer); it and its decision land in one durable batch (one write and one
        fsync), the decision taken on the state the fact leads to. ``now``: the time of the
        decision when it is the time of the observation too (else the clock's)."""
        at = self.clock() if now is None else now
        if with_fact:
            fact: Any = observation
            events = [fact, *decide(evolve(op, fact), observation, at, self.draw())]
        else:
            events = list(decide(op, observation, at, self.draw()))
        await self.record(events)
        return events

    async def record(self, events: Sequence[LogEvent]) -> list[Appended]:
        """Append ``events`` durably, then fold them into state (and the followers). Returns
        where each landed."""
        if not events:
            return []
        while self._snapshot_barrier is not None:
            await self._snapshot_barrier.wait()
        started = time.monotonic()
        # A scheduled wait is an interval from the decision (a few microseconds ago): its end
        # on the monotonic clock, so a wall clock set back later never stretches it.
        waits = [
            (e.operation_id, e.next_poll_at, started + max(0.0, e.next_poll_at - e.at))
            for e in events
            if isinstance(e, PollScheduled)
        ]
        payloads = [encode_checked(e) for e in events]
        self._appending += 1
        try:
            landed = await self._append_durably(
                payloads, lambda: self._fold(events, waits, payloads)
            )
            for ev, where in zip(events, landed, strict=True):
                if isinstance(ev, OperationRegistered):
                    op = self.ops.get(ev.operation_id)
                    if op is not None and op.registered_seq is None:
                        self.ops[ev.operation_id] = msgspec.structs.replace(
                            op, registered_seq=where.seq
                        )
        finally:
            self._appending -= 1
            self._snapshot_if_due()
        self.metrics.append_latency.observe(time.monotonic() - started)
        return landed

    def _fold(
        self,
        events: Sequence[LogEvent],
        waits: Sequence[tuple[str, float, float]] = (),
        payloads: Sequence[bytes] = (),
    ) -> None:
        """Fold durable events into state (runs even if their appender was cancelled)."""
        for op_id, next_poll_at, due in waits:
            self.waits[op_id] = (next_poll_at, due)
        followers = self.followers
        for ev, payload in zip(events, payloads, strict=True):
            before = self.ops.get(ev.operation_id)
            op = self.ledger.apply(ev)
            for follower in followers:
                follower.event(ev, payload, before, op)
        for follower in followers:
            follower.batch_done()

    async def _append_durably(
        self, payloads: list[bytes], on_durable: Callable[[], None]
    ) -> list[Appended]:
        """Append, and while the log cannot take it (disk full, read-only, I/O error), keep
        retrying with backoff: the caller waits, so no request is sent before its intent is
        recorded, and nothing recorded earlier is touched (the writer cut the failed batch).

        Many callers wait at once while the log fails; the journal gets one line when the
        condition starts, one for each new error, and one when it ends (with the number of
        attempts), not a line per caller per retry. ``bide_log_append_retries_total`` counts
        the attempts."""
        delay = 0.05
        while True:
            try:
                landed = await self.log.append_many(payloads, on_durable=on_durable)
            except FencedError as exc:
                # Another node is active: stop everything now, never retry (daemon.node).
                if self.lease is not None:
                    self.lease.fenced(str(exc))
                raise
            except LogIOError as exc:
                self._append_failed(exc)
                await anyio.sleep(delay)
                delay = min(delay * 2, 30.0)
                async with self._log_recovery:
                    if self.log.failed is not None:
                        try:
                            await self.log.reopen()
                        except (EventLogError, OSError) as again:
                            self._append_failed(again, reopening=True)
                continue
            if self.metrics.log_alarm:
                self.metrics.log_alarm = 0
                since, attempts = self._append_failing
                logfmt.info(
                    "event log appends recovered",
                    attempts=attempts,
                    failing_for=f"{time.monotonic() - since:.1f}s",
                )
                self._append_failing = (0.0, 0)
                self._append_errors.clear()
                systemd.notify(f"STATUS={self.status_line(False)}")
            return landed

    def _append_failed(self, exc: BaseException, *, reopening: bool = False) -> None:
        """Count one failed attempt; log only when the condition starts or a new error shows."""
        self.metrics.log_append_retries += 1
        text = f"{type(exc).__name__}: {exc}"
        if not self.metrics.log_alarm:
            self.metrics.log_alarm = 1
            self._append_failing = (time.monotonic(), 1)
            self._append_errors = {text}
            logfmt.error(
                "ALARM: the event log cannot be appended to; no request is sent "
                "until its intent is recorded",
                error=exc,
            )
            systemd.notify(f"STATUS={self.status_line(True)}")
            return
        since, attempts = self._append_failing
        self._append_failing = (since, attempts + 1)
        if text not in self._append_errors and len(self._append_errors) < 8:
            self._append_errors.add(text)
            logfmt.error(
                "event log still failing, with another error"
                + ("; reopening" if reopening else ""),
                error=exc,
                attempts=attempts + 1,
                failing_for=f"{time.monotonic() - since:.1f}s",
            )

    # -- retention ----------------------------------------------------------------------------

    def retired(self, op_id: str) -> Tombstone | None:
        """The tombstone of a retired operation (None: never retired, or forgotten)."""
        return self.ledger.tombstones.get(op_id)

    async def retire_due(self, batch: int = RETIRE_BATCH) -> int:
        """Record the retirements due now (``[retention]``, :mod:`replay.retention`) in one
        durable batch; folding them takes the operations out of memory. Returns how many."""
        r = self.config.retention
        policy = RetentionPolicy(
            ended_after=r.ended_after,
            max_ended=r.max_ended,
            max_tombstones=r.max_tombstones,
            batch=batch,
        )
        ledger = self.ledger
        events = due_retirements(ledger.ended, ledger.ops, ledger.actions, self.clock(), policy)
        if events:
            await self.record(events)
        return len(events)

    # -- snapshots ----------------------------------------------------------------------------

    def _snapshot_if_due(self) -> None:
        every = self.config.log.snapshot_every
        due = (
            every > 0
            and self.spawn is not None
            and not self.stopping.is_set()
            and not self._snapshot_writing
            and self.ledger.events - self._snapshot_events >= every
        )
        if not due and self._snapshot_barrier is None:
            return
        if self._appending:
            if self._snapshot_barrier is None:
                self._snapshot_barrier = anyio.Event()  # let those in flight finish
            return
        if due:
            self._start_snapshot()
        if self._snapshot_barrier is not None:
            self._snapshot_barrier.set()
            self._snapshot_barrier = None

    def _start_snapshot(self) -> None:
        """Capture the state and the log position together (nothing is being appended, so the
        position covers exactly the folded events, plus perhaps a checkpoint), then encode,
        seal and write in a worker thread."""
        assert self.spawn is not None
        position = self.log.position
        if position is None:
            return
        copy = self.ledger.copy()
        self._snapshot_events = copy.events
        self._snapshot_writing = True

        async def write() -> None:
            try:
                await write_snapshot_in_thread(
                    self.config.snapshot_path,
                    self.keyring,
                    self.snapshot_keys,
                    position,
                    copy,
                    self.store,
                )
            finally:
                self._snapshot_writing = False

        self.spawn(write)

    async def load_snapshot(self) -> Snapshot | None:
        """The state snapshot, if one is readable (checked against the log once it is open)."""
        return await anyio.to_thread.run_sync(
            load_snapshot, self.config.snapshot_path, self.keyring, self.snapshot_keys, self.store
        )

    async def final_snapshot(self) -> None:
        """At a clean stop, the log closed: snapshot what it holds."""
        log = self._log
        if log is not None and log.position is not None and log.failed is None:
            await write_snapshot_in_thread(
                self.config.snapshot_path,
                self.keyring,
                self.snapshot_keys,
                log.position,
                self.ledger,
                self.store,
            )

    # -- opening and recovery -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def opened(self, snapshot: Snapshot | None) -> AsyncIterator[dict[str, Fact]]:
        """Open the log (its lock refuses a second writer), take the lease's epoch in it, and
        replay it into the ledger (from ``snapshot`` when it still matches the log); yields
        the facts a crash left undecided. The followers are told (``replayed``)."""
        cfg = self.config
        async with LogWriter(
            cfg.log_dir,
            self.keyring,
            self.signing,
            heads=self.heads,
            on_problem=_log_problem,
            segment_bytes=cfg.log.segment_bytes,
            checkpoint_every=cfg.log.checkpoint_every,
            checkpoint_interval=cfg.log.checkpoint_interval_seconds,
            resume=snapshot.position if snapshot else None,
            store=self.store,
        ) as log:
            self._log = log
            if self.store is not None and self.lease is not None:
                # The takeover in the chain: a signed checkpoint naming this node and the
                # lease epoch it took, committed under that epoch before anything else.
                holder, epoch, _ = self.lease.health()
                await log.checkpoint(Takeover(lease_epoch=epoch, holder=holder))
            for cut in log.recoveries:
                logfmt.warn(
                    "torn log tail quarantined"
                    if cut.reason == "torn"
                    else "log records no seal covers quarantined (not acted on)",
                    reason=cut.reason,
                    bytes=cut.cut_len,
                    quarantine=cut.quarantine,
                )
            if snapshot is not None and log.resumed_at != snapshot.position.seq:
                logfmt.warn(
                    "state snapshot does not match the log; replaying the whole log",
                    snapshot=cfg.snapshot_path,
                    snapshot_seq=snapshot.position.seq,
                )
                snapshot = None
            if snapshot is not None and self.snapshot_keys.to_write(snapshot.position) is None:
                logfmt.warn(
                    "state snapshot is of an epoch the log has left (its key is "
                    "destroyed); replaying the whole log",
                    snapshot=cfg.snapshot_path,
                    snapshot_epoch=snapshot.position.epoch,
                )
                snapshot = None
            self.from_snapshot = snapshot.ledger.events if snapshot is not None else 0
            self.ledger = await anyio.to_thread.run_sync(
                replay_log, cfg.log_dir, self.keyring, snapshot
            )
            self._snapshot_events = self.from_snapshot
            undecided = dict(self.ledger.undecided)
            for follower in self.followers:
                follower.replayed(self.ledger, log.head_seq)
            if self.store is not None and self.lease is not None:
                await self._record_takeover()
            yield undecided

    async def _record_takeover(self) -> None:
        """Tell each operation not yet ended that this node took the log (its story shows
        it), before this node decides anything about it."""
        assert self.lease is not None
        holder, epoch, _ = self.lease.health()
        at = self.clock()
        node = holder.split("/", 1)[0]
        events = [
            NodeTookOver(operation_id=op_id, at=at, node=node, holder=holder, epoch=epoch)
            for op_id, op in self.ops.items()
            if op.phase in ("live", "escalated")
        ]
        for start in range(0, len(events), _TAKEOVER_BATCH):
            await self.record(events[start : start + _TAKEOVER_BATCH])

    async def recover_in_flight(self, undecided: dict[str, Fact] | None = None) -> None:
        """S11/S13: an intent without an outcome counted, and its delivery is ambiguous.

        A fact recorded without its decision (a crash between the two appends) is decided now.
        """
        for op_id, fact in (undecided or {}).items():
            try:
                await self.handle(self.ops[op_id], fact)
            except FencedError:
                raise
            except Exception as exc:  # the barrier: a bug here must not stop every start
                await self.contain(op_id, exc, "deciding a fact left by a crash")
                continue
            logfmt.warn(
                "decided a fact left undecided by a crash", op=op_id, request=fact.request_number
            )
        for op in list(self.ops.values()):
            if op.in_flight is None:
                continue
            now = self.clock()
            unknown = RequestOutcomeUnknown(
                operation_id=op.operation_id, at=now, request_number=op.in_flight
            )
            await self.record([unknown])
            try:
                await self.handle(self.ops[op.operation_id], unknown, now=now)
            except FencedError:
                raise
            except Exception as exc:  # the barrier
                await self.contain(op.operation_id, exc, "recovering after a restart")
                continue
            logfmt.warn(
                "request outcome unknown after restart", op=op.operation_id, request=op.in_flight
            )

    async def contain(self, op_id: str, exc: Exception, stage: str) -> None:
        """The barrier: bide failed (a bug) while ``stage`` of ``op_id``. Record the stop
        ``internal_error`` for that operation alone (it escalates, so no restart retries it),
        with the exception's class and never its message, which could carry a secret. If even
        that cannot be recorded, the operation is set aside for the rest of this process."""
        name = type(exc).__name__
        logfmt.error(
            "internal error; the operation is stopped, the others go on",
            op=op_id,
            stage=stage,
            error=name,
            trace=frames(exc),
        )
        self.metrics.internal_errors += 1
        op = self.ops.get(op_id)
        if op is None or op_id in self.set_aside:
            return
        try:
            await self.handle(op, InternalFault(detail=f"{name} while {stage}"[:200]))
        except FencedError:
            raise
        except Exception as again:  # the second failure: give the op up
            self.set_aside.add(op_id)
            self.on_set_aside(op_id)
            logfmt.error(
                "internal error while recording an internal error; the operation is "
                "set aside until the daemon restarts",
                op=op_id,
                error=type(again).__name__,
            )

    # -- the lease gate -----------------------------------------------------------------------

    async def lease_room(self, seconds: float, may_cut: bool) -> float | None:
        """The gate before an action's call (see :class:`daemon.actions.ActionPorts`): a
        fetch (a GET whose result only lands here) is cut to what the lease leaves; a submit
        or a cancel must fit whole (its profile is refused otherwise)."""
        if self.lease is None:
            return seconds
        if may_cut:
            seconds = min(seconds, self.lease.longest_request)
        await self.lease.wait_allows(seconds)
        return seconds if self.lease.allows(seconds) else None

    @property
    def send_gate(self) -> Callable[[float], bool] | None:
        """The last look before a request's first byte is written (``daemon.http``'s
        ``gate``): None without a lease."""
        return None if self.lease is None else self.may_send

    def may_send(self, seconds: float) -> bool:
        """Whether a request that may take ``seconds`` more can leave now: the lease still
        outlives it, by this node's clock. Asked as the request is written, after every await
        on its way (credential, pool, connection): a process paused there past its lease
        finds it here, its request is not sent, and its term ends as fenced (another node may
        hold the lease by now)."""
        lease = self.lease
        if lease is None or lease.allows(seconds):
            return True
        left = lease.remaining()
        logfmt.warn(
            "a request not sent: the lease ran out on its way"
            if left <= 0
            else "a request not sent: the lease would not outlive it",
            left=f"{left:.3f}s",
            needed=f"{seconds:.3f}s",
        )
        if left <= 0:
            lease.fenced(
                "the lease ran out by this node's clock while a request was on its way "
                "(not sent); back to standby"
            )
        return False


def _log_problem(message: str) -> None:
    logfmt.error(message)  # from the log's writer thread: one print, one line


def frames(exc: BaseException) -> str:
    """Where an exception came from, as ``file:line in function`` frames, without its message
    (which could quote a header, a body or a credential)."""
    frames = traceback.extract_tb(exc.__traceback__)[-6:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
