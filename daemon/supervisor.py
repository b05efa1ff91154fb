"""The supervisor: the one task group that owns the log, the timers and every request.

Theory of operation (S9, S11, S13, S30-S33):
    * Start: take the log (its lock refuses a second daemon), replay every event into state
      (from the state snapshot, when it still matches the log, plus the events after it),
      record an unknown outcome for each intent whose outcome never made it to the log (the
      daemon died in between: the request counted, S11/S13), then schedule one wake-up per live
      operation at its ``next_poll_at``. An overdue operation gets one wake-up, never a burst
      (S9); ``decide`` checks its deadline first.
    * A wake-up runs the seed's order (S32): load; ``decide(WakeUp)`` (deadline, budget, due);
      the provider's quota (a poll it holds back is recorded as a ``local_quota`` delay); append
      ``StatusRequestIntended`` and wait until it is durable; send one request; ``decide`` on
      what came back; append the two together; schedule. Nothing is held while sleeping
      (S33): the state is in the log, the timer is one heap entry.
    * The spool is watched with watchfiles (plus one scan at start): registrations and
      decisions are validated, recorded, receipted, then deleted.
    * SIGTERM/SIGINT: stop starting requests, give those in flight ``drain_seconds`` to finish,
      record the rest as unknown outcomes, write a final checkpoint, exit 0. SIGHUP or a change
      in the profiles directory reloads profiles; an invalid profile keeps the last good one.

Every event is appended before the state it leads to is acted on: the in-memory ``ops`` only
ever reflects durable events, and every durable event is folded in (even when its appender is
cancelled), so a snapshot of the state at a log position is the fold of the log up to it.
Snapshots are taken every ``[log] snapshot_every`` events, at a moment no append is in flight
(new appends wait the few milliseconds that takes), and at a clean stop; they are encoded,
sealed and written in a worker thread.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import math
import os
import random
import signal
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import msgspec
import watchfiles

from daemon import logfmt, scoping, systemd
from daemon.actions import ACTION_ID, ActionPorts, ActionRunner
from daemon.api.peer import groups_of
from daemon.config import Config
from daemon.errors import ConfigError, Refused
from daemon.faults import FaultInjection
from daemon.history import Histories
from daemon.http import MIN_TIMEOUT, CredentialError, StatusClient
from daemon.metrics import Metrics, serve_metrics
from daemon.outbox import escalation_text, write_escalation
from daemon.profile import Profile, load_profiles, too_long_for_lease
from daemon.snapshots import SnapshotKeys, load_snapshot, replay_log, write_snapshot_in_thread
from daemon.spool import (
    DOTS,
    DecisionFile,
    FetchFile,
    Receipt,
    RegistrationFile,
    Spool,
    SpoolPermissionError,
    SpoolReject,
    SubmitFile,
    approval_refusal,
    decode_incoming,
    user_name,
)
from daemon.spool import request_id_of as spool_request_id
from daemon.timers import RateQuota, TimerHeap
from daemon.witness.publisher import HeadPublisher
from eventlog.envelope import Takeover
from eventlog.epochs import EpochSigning
from eventlog.errors import EventLogError, FencedError, LogIOError
from eventlog.heads import HeadStore
from eventlog.keys import KeyRing, Signer
from eventlog.position import LogPosition
from eventlog.store import LineStore
from eventlog.writer import Appended, LogWriter
from replay.decide import decide, register
from replay.events import (
    ActionEvent,
    DecisionRejected,
    EscalationRaised,
    LogEvent,
    OperationRegistered,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
    encode_checked,
)
from replay.ledger import Fact, Ledger
from replay.observations import (
    DecisionSubmitted,
    InternalFault,
    QuotaDeferred,
    Registration,
    WakeUp,
    Withdrawal,
)
from replay.state import Operation, evolve

DRAIN_SECONDS = 5.0
#: Fair shares of a provider's quota are computed over this much of it (seconds).
FAIR_HORIZON = 1.0
#: A request is not sent this close to its deadline: it could arrive after it.
SEND_MARGIN = MIN_TIMEOUT
MAX_POLLS = 1024  # poll tasks alive at once; more due operations wait their turn
#: Jitter only has to decorrelate daemons and operations, not resist prediction: a PRNG seeded
#: from the OS once, instead of a getrandom(2) system call for every draw.
_JITTER = random.Random(os.urandom(32))


class RequestGate(Protocol):
    """What the supervisor asks of a lease before each provider request."""

    def allows(self, request_seconds: float) -> bool: ...

    @property
    def longest_request(self) -> float: ...

    def health(self) -> tuple[str, int, float]: ...

    def metrics_lines(self) -> list[str]: ...

    async def wait_allows(self, request_seconds: float) -> None: ...

    def fenced(self, why: str) -> None:
        """An append was refused under another epoch: end this node's term now."""


class Supervisor:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        signer: Signer | None,
        *,
        signing: EpochSigning | None = None,
        heads: HeadStore | None = None,
        publisher: HeadPublisher | None = None,
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = _JITTER.random,
        drain_seconds: float | None = None,
        store: LineStore | None = None,
        lease: RequestGate | None = None,
    ) -> None:
        self.config = config
        self.store = store  # the log in PostgreSQL: every write round committed there too
        self.lease = lease  # no request unless the lease outlives it (daemon.lease)
        self.keyring = keyring
        self.signing: EpochSigning | Signer  # signs the log: epoch keys, or format 2's one key
        if signing is not None:
            self.signing = signing  # forward-secure checkpoint signing (eventlog.epochs)
        elif signer is not None:
            self.signing = signer
        else:
            raise ValueError("the supervisor needs a signing key or epoch signing")
        self.snapshot_keys = SnapshotKeys.of(self.signing)  # tag the state snapshot
        self.heads = heads  # every published head; refuses a log rolled back behind them
        self.publisher = publisher  # sends every signed head to the configured witnesses
        self.clock = clock
        self.draw = draw
        self.drain_seconds = (config.daemon.drain_seconds if drain_seconds is None
                              else drain_seconds)
        self.ledger = Ledger()
        self.ops: dict[str, Operation] = self.ledger.ops
        self.profiles: dict[str, Profile] = {}
        self.clients: dict[str, StatusClient] = {}
        self.quotas: dict[str, RateQuota] = {}
        self.pacers: dict[str, RateQuota] = {}  # the same quota, checked as requests leave
        self.in_flight: dict[str, anyio.Semaphore] = {}  # provider -> requests in flight
        self.turns: dict[str, anyio.Semaphore] = {}  # provider -> intents ahead of a slot
        self.prepaid: dict[str, str] = {}  # op id -> registrant holding a future slot
        self._reserved: dict[str, dict[str, int]] = {}  # provider -> registrant -> slots held
        self._waiting: dict[str, dict[str, collections.deque[str]]] = {}  # turns to come
        self._queued: set[str] = set()
        self._dispatched: set[str] = set()
        self.busy: set[str] = set()
        self.set_aside: set[str] = set()  # failed twice (a bug): not polled again here
        self._decisions_problem = ""  # why the decisions directory is unsafe, if it is
        self._pruned_at = float("-inf")
        self.faults = FaultInjection.from_environment()
        self.timers = TimerHeap()
        self.spool = Spool(config.spool_dir)
        self.metrics = Metrics()
        self.stopping = anyio.Event()
        self._idle = anyio.Event()
        self._log_recovery = anyio.Lock()
        self._poll_slots = anyio.Semaphore(MAX_POLLS)
        self._changed = anyio.Event()
        self._change_waiters = 0
        self.metrics_url: str | None = None
        self._log: LogWriter | None = None
        self.polls: anyio.abc.TaskGroup | None = None
        self.runner = ActionRunner(ActionPorts(
            record=self.record, clock=lambda: self.clock(), spawn=self._spawn,
            schedule=self.schedule, provider_turn=self.provider_turn,
            profile=self.profiles.get, client=self.clients.get,
            operation=lambda op_id: self.ops.get(op_id), operations=lambda: self.ops.values(),
            spool=self.spool, state_dir=config.state_dir, outbox_dir=config.outbox_dir,
            faults=self.faults, count_internal_error=self._count_internal_error,
            lease_room=self._lease_room, fetch_limits=config.fetch))
        self._main_scope: anyio.CancelScope | None = None
        self._appending = 0  # record() calls between queueing and folding their events
        self._snapshot_barrier: anyio.Event | None = None  # new appends wait while set
        self._snapshot_writing = False
        self._snapshot_events = 0  # the ledger's event count at the last snapshot
        # op id -> (next_poll_at, monotonic end) of the wait last scheduled in this process
        self._waits: dict[str, tuple[float, float]] = {}
        self.histories = Histories(config.api.closed_stories, config.api.story_events_kept)
        self.watchers: dict[str, anyio.Event] = {}  # op id -> set at its next recorded event
        self._watching: collections.Counter[str] = collections.Counter()  # waiters per op id
        self._registering: dict[str, anyio.Event] = {}  # op id -> set once it is recorded
        self.live_by_owner: collections.Counter[int | None] = collections.Counter()
        self.api_socket: str | None = None
        self._append_failing = (0.0, 0)  # (monotonic start, attempts) while appends fail
        self._append_errors: set[str] = set()  # errors logged in this failing episode

    # -- recording -------------------------------------------------------------------------

    @property
    def position(self) -> LogPosition | None:
        """The log's head (None before it is open, or while it is empty)."""
        return self._log.position if self._log is not None else None

    @property
    def log(self) -> LogWriter:
        assert self._log is not None
        return self._log

    async def record(self, events: Sequence[LogEvent]) -> list[Appended]:
        """Append ``events`` durably, then fold them into state; then act on escalations.
        Returns where each landed."""
        if not events:
            return []
        while self._snapshot_barrier is not None:
            await self._snapshot_barrier.wait()
        started = time.monotonic()
        # A scheduled wait is an interval from the decision (a few microseconds ago): its end
        # on the monotonic clock, so a wall clock set back later never stretches it.
        waits = [(e.operation_id, e.next_poll_at, started + max(0.0, e.next_poll_at - e.at))
                 for e in events if isinstance(e, PollScheduled)]
        payloads = [encode_checked(e) for e in events]
        self._appending += 1
        try:
            landed = await self._append_durably(
                payloads, lambda: self._fold(events, waits, payloads))
            for ev, where in zip(events, landed, strict=True):
                if isinstance(ev, OperationRegistered):
                    op = self.ops.get(ev.operation_id)
                    if op is not None and op.registered_seq is None:
                        self.ops[ev.operation_id] = msgspec.structs.replace(
                            op, registered_seq=where.seq)
        finally:
            self._appending -= 1
            self._snapshot_if_due()
        self.metrics.append_latency.observe(time.monotonic() - started)
        return landed

    def _fold(self, events: Sequence[LogEvent],
              waits: Sequence[tuple[str, float, float]] = (),
              payloads: Sequence[bytes] = ()) -> None:
        """Fold durable events into state (runs even if their appender was cancelled)."""
        for op_id, next_poll_at, due in waits:
            self._waits[op_id] = (next_poll_at, due)
        for ev, payload in zip(events, payloads, strict=True):
            before = self.ops.get(ev.operation_id)
            op = self.ledger.apply(ev)
            if op is not None and (before is None or before.phase != op.phase):
                if op.phase == "live":
                    self.live_by_owner[op.registered_by_uid] += 1
                elif before is not None and before.phase == "live":
                    self.live_by_owner[op.registered_by_uid] -= 1
            self.histories.add(ev.operation_id, payload, self._phase_after(ev, op))
            watcher = self.watchers.pop(ev.operation_id, None)
            if watcher is not None:
                watcher.set()
            if op is None or isinstance(ev, ActionEvent):
                continue
            self.metrics.observe(ev, op.provider)
            if isinstance(ev, EscalationRaised):
                self._announce(ev)
        self._announce_change()

    def _announce_change(self) -> None:
        """Wake whoever waits in :meth:`wait_until`; with no one waiting (nearly always), no
        new Event is made for each recorded change."""
        if self._change_waiters:
            self._changed.set()
            self._changed = anyio.Event()

    def _phase_after(self, ev: LogEvent, op: Operation | None) -> str | None:
        """The phase of the event's operation, for the stories kept: an action's event counts
        for its operation, or, for a submit that never made one, ends with the action."""
        if op is not None:
            return op.phase
        target = self.ops.get(ev.operation_id)
        if target is not None:
            return target.phase
        action = self.ledger.actions.get(ev.action_id) if isinstance(ev, ActionEvent) else None
        return "closed" if action is not None and action.phase in ("failed", "closed") else None

    async def next_event_of(self, op_id: str) -> None:
        """Wait until the next event of ``op_id`` is durable (a waiter of the API). The last
        waiter to leave (answered, timed out or gone) takes the entry with it."""
        watcher = self.watchers.get(op_id)
        if watcher is None:
            watcher = self.watchers[op_id] = anyio.Event()
        self._watching[op_id] += 1
        try:
            await watcher.wait()
        finally:
            self._watching[op_id] -= 1
            if not self._watching[op_id]:
                del self._watching[op_id]
                if self.watchers.get(op_id) is watcher:
                    del self.watchers[op_id]

    def _snapshot_if_due(self) -> None:
        every = self.config.log.snapshot_every
        due = (every > 0 and self.polls is not None and not self.stopping.is_set()
               and not self._snapshot_writing
               and self.ledger.events - self._snapshot_events >= every)
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
        assert self.polls is not None
        position = self.log.position
        if position is None:
            return
        copy = self.ledger.copy()
        self._snapshot_events = copy.events
        self._snapshot_writing = True

        async def write() -> None:
            try:
                await write_snapshot_in_thread(self.config.snapshot_path, self.keyring,
                                               self.snapshot_keys, position, copy, self.store)
            finally:
                self._snapshot_writing = False

        self.polls.start_soon(write)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, re-checking after every recorded change."""
        while not predicate():
            self._change_waiters += 1
            try:
                await self._changed.wait()
            finally:
                self._change_waiters -= 1

    async def _append_durably(self, payloads: list[bytes], on_durable: Callable[[], None]
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
                logfmt.info("event log appends recovered", attempts=attempts,
                            failing_for=f"{time.monotonic() - since:.1f}s")
                self._append_failing = (0.0, 0)
                self._append_errors.clear()
                systemd.notify(f"STATUS={self.status_line()}")
            return landed

    def _append_failed(self, exc: BaseException, *, reopening: bool = False) -> None:
        """Count one failed attempt; log only when the condition starts or a new error shows."""
        self.metrics.log_append_retries += 1
        text = f"{type(exc).__name__}: {exc}"
        if not self.metrics.log_alarm:
            self.metrics.log_alarm = 1
            self._append_failing = (time.monotonic(), 1)
            self._append_errors = {text}
            logfmt.error("ALARM: the event log cannot be appended to; no request is sent "
                         "until its intent is recorded", error=exc)
            systemd.notify(f"STATUS={self.status_line(alarm=True)}")
            return
        since, attempts = self._append_failing
        self._append_failing = (since, attempts + 1)
        if text not in self._append_errors and len(self._append_errors) < 8:
            self._append_errors.add(text)
            logfmt.error("event log still failing, with another error" +
                         ("; reopening" if reopening else ""), error=exc, attempts=attempts + 1,
                         failing_for=f"{time.monotonic() - since:.1f}s")

    def _announce(self, ev: EscalationRaised) -> None:
        op = self.ops.get(ev.operation_id)
        path = write_escalation(self.config.outbox_dir, ev, op)
        logfmt.warn("escalation raised", op=ev.operation_id, reason=ev.reason,
                    escalation=ev.escalation_id, outbox=path,
                    options=",".join(o.id for o in ev.options))
        for line in escalation_text(ev, op).rstrip().splitlines():
            logfmt.info(line.strip(), op=ev.operation_id)

    # -- profiles --------------------------------------------------------------------------

    def load_profiles(self) -> None:
        if self.config.profiles_dir is None:
            raise ConfigError(f"{self.config.path}: [paths] profiles_dir is not set")
        good, bad = load_profiles(self.config.profiles_dir)
        if self.lease is not None:
            for name, message in too_long_for_lease(good, self.lease.longest_request).items():
                bad[self.config.profiles_dir / f"{name}.toml"] = message
                del good[name]
        for path, message in bad.items():
            kept = " (keeping the last good version)" if path.stem in self.profiles else ""
            logfmt.error("profile refused" + kept, profile=path, error=message)
        for name, profile in good.items():
            old = self.profiles.get(name)
            if old is not None and old.digest == profile.digest:
                continue
            self.profiles[name] = profile
            self.quotas[name] = RateQuota(profile.quota.requests_per_second,
                                          profile.quota.burst)
            self.pacers[name] = RateQuota(profile.quota.requests_per_second,
                                          profile.quota.burst)
            self.in_flight[name] = anyio.Semaphore(profile.quota.max_in_flight)
            self.turns[name] = anyio.Semaphore(profile.quota.max_in_flight)
            previous = self.clients.pop(name, None)
            self.clients[name] = StatusClient(profile, self._credentials_dir())
            if previous is not None and self.polls is not None:
                self.polls.start_soon(previous.aclose)
            logfmt.info("profile loaded", provider=name, digest=profile.digest[:16])

    async def _lease_room(self, seconds: float, may_cut: bool) -> float | None:
        """The gate before an action's call (see :class:`daemon.actions.ActionPorts`): a
        fetch (a GET whose result only lands here) is cut to what the lease leaves; a submit
        or a cancel must fit whole (its profile is refused otherwise)."""
        if self.lease is None:
            return seconds
        if may_cut:
            seconds = min(seconds, self.lease.longest_request)
        await self.lease.wait_allows(seconds)
        return seconds if self.lease.allows(seconds) else None

    def _credentials_dir(self) -> Path | None:
        if self.config.credentials_dir is not None:
            return self.config.credentials_dir
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        return Path(creds) if creds else None

    # -- scheduling ------------------------------------------------------------------------

    def schedule(self, op_id: str) -> None:
        """Arm the operation's one timer: at the end of the wait its last ``PollScheduled``
        set, measured on the monotonic clock from when it was decided (when that happened in
        this process), else at ``next_poll_at`` read against the wall clock now; and never
        later than the deadline, a wall-clock fact."""
        op = self.ops.get(op_id)
        if op is None or op.phase != "live" or op_id in self.set_aside:
            self.timers.cancel(op_id)
            self._waits.pop(op_id, None)
            if op is not None and op_id in self.prepaid:
                quota = self.quotas.get(op.provider)
                if quota is not None:
                    quota.release()
                self._unreserve(op_id, op.provider)
            return
        if op_id in self._queued:
            # Waiting for its turn at the quota: only its deadline wakes it meanwhile.
            deadline, _ = op.effective_deadline
            self.timers.schedule(op_id, time.monotonic() + max(0.0, deadline - self.clock()))
            return
        now_mono, now_wall = time.monotonic(), self.clock()
        wait = self._waits.get(op_id)
        if wait is not None and wait[0] == op.next_poll_at:
            due = wait[1]
        else:
            self._waits.pop(op_id, None)
            due = now_mono + max(0.0, op.next_poll_at - now_wall)
        deadline, _ = op.effective_deadline
        self.timers.schedule(op_id, min(due, now_mono + max(0.0, deadline - now_wall)))

    def _timer_elapsed(self, op: Operation) -> bool:
        """Whether the wait scheduled for ``op`` in this process has run out (monotonic)."""
        wait = self._waits.get(op.operation_id)
        return (wait is not None and wait[0] == op.next_poll_at
                and time.monotonic() >= wait[1])

    async def _watch_wall_clock(self) -> None:
        """Re-arm every timer when the wall clock jumps: deadlines are wall-clock times, so one
        brought nearer by a jump forward must still stop its operation on time."""
        offset = self.clock() - time.monotonic()
        while True:
            await anyio.sleep(1.0)
            now = self.clock() - time.monotonic()
            if abs(now - offset) > 1.0:
                logfmt.warn("the wall clock jumped; deadlines re-read against it",
                            jump=f"{now - offset:+.1f}s")
                for op_id, op in self.ops.items():
                    if op.phase == "live" and op_id not in self.busy:
                        self.schedule(op_id)
            offset = now

    async def _timer_loop(self) -> None:
        """Start a poll for each due operation, at most ``MAX_POLLS`` at once: under overload
        due operations wait in the heap's output, not as thousands of parked tasks."""
        assert self.polls is not None
        while not self.stopping.is_set():
            for op_id, due in await self.timers.wait():
                await _acquire(self._poll_slots)
                if self.stopping.is_set():
                    self._poll_slots.release()
                    return
                self.polls.start_soon(self._poll, op_id, due)

    async def _poll(self, op_id: str, due: float) -> None:
        """One wake-up of one operation, in the seed's order (S32)."""
        try:
            # Lateness as the operation sees it: from its due time to its poll starting.
            self.metrics.wakeup_lateness.observe(time.monotonic() - due)
            op = self.ops.get(op_id)
            if op is None or op_id in self.busy:
                return
            self.busy.add(op_id)
            try:
                await self._poll_once(op)
            except FencedError:
                raise  # not this operation's fault: the node's term ends (daemon.node)
            except Exception as exc:  # the barrier: one operation, not all
                await self.contain(op_id, exc, "polling")
            finally:
                self.busy.discard(op_id)
                self._announce_change()  # a decision waiting for this poll may go on
                self.schedule(op_id)
                if not self.busy:
                    self._idle.set()
        finally:
            self._poll_slots.release()

    async def _poll_once(self, op: Operation) -> None:
        """S32: decide; take the provider's turn; reload and decide again with a fresh clock;
        the quota; the intent made durable; a free in-flight slot; the one request; the fact;
        decide. Nothing is held while sleeping (S33); the in-flight slot only for the request."""
        self.faults.fire("poll", op.operation_id)
        events = decide(op, WakeUp(timer_elapsed=self._timer_elapsed(op)), self.clock(),
                        self.draw())
        if not any(isinstance(e, StatusRequestIntended) for e in events):
            await self.record(events)  # nothing, or a stop (deadline, budget) S9/S13/S17
            return
        client = self.clients.get(op.provider)
        if client is None:
            logfmt.error("no profile for provider; not polling", op=op.operation_id,
                          provider=op.provider)
            self.timers.schedule(op.operation_id, time.monotonic() + 30.0)
            return
        try:
            client.check_credential()
        except CredentialError as exc:
            logfmt.error("credential unreadable; not polling", op=op.operation_id, error=exc)
            return  # rescheduled at next_poll_at; the deadline still bounds the wait
        if self.lease is not None:  # the lease must outlive the request (daemon.lease)
            await self.lease.wait_allows(client.profile.status.timeout_seconds)
        slot = self.in_flight[op.provider]
        intent = await self._intend(op, slot)
        if intent is None:
            return
        try:
            fact = await self._send(self.ops[op.operation_id], client, intent)
        finally:
            slot.release()
        # The fact and its decision in one durable batch: one write and fsync, not two.
        self.faults.fire("decide", op.operation_id)
        after = evolve(self.ops[op.operation_id], fact)
        await self.record([fact, *decide(after, fact, self.clock(), self.draw())])

    async def _intend(self, op: Operation, slot: anyio.Semaphore) -> StatusRequestIntended | None:
        """Make the next request's intent durable, then take ``slot`` (the provider's
        in-flight slot) for it; None if no request is to be sent now.

        The provider's turns (as many as its in-flight slots) bound the intents made durable
        ahead of a free slot: the group commit of the next intents overlaps the requests in
        flight, and an intent waits at most for one of them to end. The deadline is checked
        again once the slot is taken (``_send``)."""
        turn = self.turns[op.provider]
        await _acquire(turn)
        try:
            op = self.ops[op.operation_id]  # reload: waiting for the turn took time
            now = self.clock()
            events = decide(op, WakeUp(timer_elapsed=self._timer_elapsed(op)), now, self.draw())
            intent = next((e for e in events if isinstance(e, StatusRequestIntended)), None)
            if intent is None:
                await self.record(events)  # the deadline passed while waiting for the turn
                return None
            if not await self._quota_allows(op, now):
                return None
            if self.stopping.is_set():
                return None
            await self.record(events)  # S13: durable before the request leaves
            self.faults.fire("request", op.operation_id)
            await _acquire(slot)
            return intent
        finally:
            turn.release()

    async def _send(self, op: Operation, client: StatusClient,
                    intent: StatusRequestIntended) -> StatusResponseReceived | TransportFailed:
        """The one request of ``intent``, or why it was not sent after all."""
        await self.provider_turn(op.provider, reserved=True)
        deadline, _ = op.effective_deadline
        time_left = deadline - self.clock()
        # S13: a request needs room to arrive before the deadline, not only to leave.
        if time_left < SEND_MARGIN:
            return TransportFailed(
                operation_id=op.operation_id, at=self.clock(),
                request_number=intent.request_number, kind="pool_timeout",
                detail=f"not sent: less than {SEND_MARGIN:g}s to the deadline once the "
                       f"intent was durable")
        if self.lease is not None and not self.lease.allows(
                client.profile.status.timeout_seconds):
            return TransportFailed(
                operation_id=op.operation_id, at=self.clock(),
                request_number=intent.request_number, kind="not_sent",
                detail="not sent: the lease would not outlive the request once the intent "
                       "was durable")
        url = op.status_location or client.profile.status_url(op.provider_job_id)
        fact = await client.fetch(operation_id=op.operation_id, url=url,
                                  request_number=intent.request_number,
                                  time_left=time_left, clock=self.clock)
        self.metrics.requests_sent += 1
        return fact

    def _spawn(self, task: Callable[[str], Coroutine[Any, Any, None]], arg: str) -> None:
        assert self.polls is not None
        self.polls.start_soon(task, arg)

    def spawn_task(self, task: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``task`` in the daemon's task group (it outlives the request that started it)."""
        assert self.polls is not None
        self.polls.start_soon(task)

    async def _serve_api(self, *, task_status: anyio.abc.TaskStatus[None]
                         = anyio.TASK_STATUS_IGNORED) -> None:
        from daemon.api.listener import open_listener
        from daemon.api.server import ApiServer, Limits
        from daemon.api.service import Api

        cfg = self.config.api
        listener, where, bound = await open_listener(
            self.config.socket_path, mode=int(cfg.socket_mode, 8), group=cfg.socket_group)
        api = Api(self)

        async def handle(request: Any) -> Any:
            self.metrics.api_requests += 1
            return await api.handle(request)

        def count(reason: str) -> None:
            self.metrics.api_rejections[reason] += 1

        server = ApiServer(handle, limits=Limits(
            max_connections=cfg.max_connections,
            max_connections_per_user=cfg.max_connections_per_user,
            request_timeout=cfg.request_timeout_seconds),
                           count=count)
        self.api_socket = where
        logfmt.info("api listening", socket=where, inherited=not bound)
        task_status.started()
        try:
            async with listener:
                await server.serve(listener)
        finally:
            if bound:
                with contextlib.suppress(OSError):
                    os.unlink(where)

    def _count_internal_error(self) -> None:
        self.metrics.internal_errors += 1

    def _decisions_safe(self) -> bool:
        """Re-check the decisions directory before each scan; log once per change."""
        try:
            self.spool.check_decisions(self.config.spool.agents_group)
            problem = ""
        except (SpoolPermissionError, OSError) as exc:
            problem = str(exc)
        if problem != self._decisions_problem:
            if problem:
                logfmt.error("decisions are not read while their directory is unsafe",
                             error=problem)
            else:
                logfmt.info("the decisions directory is safe again; reading decisions")
            self._decisions_problem = problem
        return not problem

    async def contain(self, op_id: str, exc: Exception, stage: str) -> None:
        """The barrier: bide failed (a bug) while ``stage`` of ``op_id``. Record the stop
        ``internal_error`` for that operation alone (it escalates, so no restart retries it),
        with the exception's class and never its message, which could carry a secret. If even
        that cannot be recorded, the operation is set aside for the rest of this process."""
        name = type(exc).__name__
        logfmt.error("internal error; the operation is stopped, the others go on", op=op_id,
                     stage=stage, error=name, trace=_frames(exc))
        self.metrics.internal_errors += 1
        op = self.ops.get(op_id)
        if op is None or op_id in self.set_aside:
            return
        try:
            fault = InternalFault(detail=f"{name} while {stage}"[:200])
            await self.record(decide(op, fault, self.clock(), self.draw()))
        except FencedError:
            raise
        except Exception as again:  # the second failure: give the op up
            self.set_aside.add(op_id)
            self.timers.cancel(op_id)
            logfmt.error("internal error while recording an internal error; the operation is "
                         "set aside until the daemon restarts", op=op_id,
                         error=type(again).__name__)

    async def provider_turn(self, provider: str, *, reserved: bool = False) -> None:
        """Wait until a request to ``provider`` may leave under its quota.

        A poll took its slot before its intent (``reserved``): only the spacing between
        requests actually leaving is checked again, absorbing the milliseconds the intent's
        append took. A submit, fetch or cancel takes its slot here, from the same quota.
        """
        quota, pacer = self.quotas.get(provider), self.pacers.get(provider)
        if quota is None or pacer is None:
            return
        if not reserved:
            wait = quota.reserve()
            if wait > 0:
                await anyio.sleep(wait)
        wait = pacer.reserve()
        if wait > 0:
            await anyio.sleep(wait)

    async def _quota_allows(self, op: Operation, now: float) -> bool:
        """Take a slot of the provider's rate quota, or record the poll as held back
        (``local_quota``; never past the deadline) with its future slot reserved.

        Fair between registrants: future slots are handed out to each registrant only up to
        its share of the next second's quota (split among the registrants holding or waiting
        for slots); past it, the poll waits in its registrant's queue, unrecorded, and each
        slot used or given back wakes the next waiting poll, registrant by registrant in
        turn. So 200 operations of one agent cannot take every slot ahead of another's 5.
        """
        op_id, provider, who = op.operation_id, op.provider, op.registered_by
        if op_id in self.prepaid:
            self._unreserve(op_id, provider)
            return True
        dispatched = op_id in self._dispatched
        self._dispatched.discard(op_id)
        held = self._reserved.setdefault(provider, {})
        if not dispatched and held.get(who, 0) >= self._share(provider, who):
            self._enqueue(provider, who, op_id)
            return False
        wait = self.quotas[provider].reserve()
        if wait <= 0:
            self._dispatch(provider)
            return True
        await self.record(decide(op, QuotaDeferred(until=now + wait), now, self.draw()))
        if self.ops[op_id].phase == "live":
            self.prepaid[op_id] = who
            held[who] = held.get(who, 0) + 1
        else:
            self.quotas[provider].release()
        return False

    def _share(self, provider: str, who: str) -> int:
        """How many future slots one registrant may hold: the next second of the quota, split
        among the registrants that hold or wait for slots."""
        waiting = self._waiting.get(provider, {})
        active = {r for r, n in self._reserved.get(provider, {}).items() if n} | {
            r for r, q in waiting.items() if q} | {who}
        rate = self.quotas[provider].rate
        return max(1, math.ceil(rate * FAIR_HORIZON / len(active)))

    def _enqueue(self, provider: str, who: str, op_id: str) -> None:
        queues = self._waiting.setdefault(provider, {})
        queue = queues.setdefault(who, collections.deque())
        if op_id not in self._queued:
            queue.append(op_id)
            self._queued.add(op_id)

    def _unreserve(self, op_id: str, provider: str) -> None:
        """A reserved slot was used (or given back): count it off and wake the next poll."""
        who = self.prepaid.pop(op_id, None)
        held = self._reserved.get(provider, {})
        if who is not None and held.get(who, 0) > 0:
            held[who] -= 1
        self._dispatch(provider)

    def _dispatch(self, provider: str) -> None:
        """Wake one waiting poll of ``provider``: the next registrant in turn that has one."""
        queues = self._waiting.get(provider)
        if not queues:
            return
        for who in list(queues):
            queue = queues.pop(who)
            while queue:
                op_id = queue.popleft()
                self._queued.discard(op_id)
                op = self.ops.get(op_id)
                if op is None or op.phase != "live":
                    continue
                if queue:
                    queues[who] = queue  # to the back of the line: the next one's turn
                self._dispatched.add(op_id)
                self.timers.schedule(op_id, time.monotonic())
                return

    # -- spool -----------------------------------------------------------------------------

    async def ingest_all(self) -> None:
        """Ingest every waiting file; one that makes bide itself fail (a bug) is rejected with
        the exception's class as its reason, and the others go on. Decisions wait while their
        directory is open to anyone but the approvers."""
        stages: list[tuple[Path, Callable[[Path], Awaitable[None]]]] = [
            (self.spool.incoming, self.ingest_incoming)]
        if self._decisions_safe():
            stages.append((self.spool.decisions, self.ingest_decision))
        for directory, ingest in stages:
            try:
                waiting = self.spool.pending(directory)
            except OSError as exc:  # out of descriptors, say: the next scan tries again
                logfmt.warn("cannot list the spool; trying again at the next scan",
                            directory=directory, error=exc.strerror)
                continue
            for path in waiting:
                try:
                    self.faults.fire("ingest", path.name)
                    await ingest(path)
                except FencedError:
                    raise  # left in the spool for the next active node
                except Exception as exc:  # the barrier: one file, not all
                    logfmt.error("internal error while ingesting a spool file; rejected",
                                 file=path.name, error=type(exc).__name__,
                                 trace=_frames(exc))
                    self.spool.reject(path, spool_request_id(path),
                                      f"internal error ({type(exc).__name__}) while ingesting; "
                                      f"the daemon went on without it",
                                      decision=directory == self.spool.decisions)

    async def ingest_incoming(self, path: Path) -> None:
        """One file from ``spool/incoming``: a registration, a submit or a fetch request."""
        rid = spool_request_id(path)
        try:
            data, st = self.spool.read(path)
            if rid is None:
                raise SpoolReject("file name is not REQUEST_ID.json (32 lowercase hex digits)")
            request = decode_incoming(data)
            if request.request_id != rid:
                raise SpoolReject("request_id does not match the file name")
            if isinstance(request, SubmitFile):
                async with self.one_at_a_time(request.registration.operation_id):
                    await self.runner.ingest_submit(rid, request, st.st_uid)
            elif isinstance(request, FetchFile):
                # The file's owner is who asks: only the operation's registrant or an operator
                # may fetch, as through the API.
                async with self.one_at_a_time(f"{request.operation_id}\x00fetch"):
                    await self.runner.ingest_fetch(
                        rid, request, st.st_uid, operator=self.is_operator(st.st_uid, st.st_gid))
        except SpoolReject as exc:
            logfmt.warn("spool file rejected", file=path.name, reason=exc)
            self.spool.reject(path, rid, str(exc))
            return
        if isinstance(request, RegistrationFile):
            await self.ingest_registration(path, rid, request, st.st_uid)
        else:
            self.spool.done(path)  # its receipt follows the action's outcome

    def is_operator(self, uid: int, gid: int) -> bool:
        """Root, the daemon's own user, or a member of ``[api] operators_group``."""
        group = self.config.api.operators_group
        return uid in (0, os.geteuid()) or bool(group and group in groups_of(uid, gid))

    async def ingest_registration(self, path: Path, rid: str, rf: RegistrationFile,
                                  owner: int) -> None:
        """Register the job a spool file asks for; the file's owner is who asked."""
        try:
            op, _ = await self.register_operation(rf.registration, owner)
        except Refused as exc:
            logfmt.warn("spool file rejected", file=path.name, reason=exc.detail)
            self.spool.reject(path, rid, scoping.shown(exc.detail, owner))
            return
        self.spool.write_receipt(Receipt(rid, "registered",
                                         scoping.shown(op.operation_id, owner)))
        self.spool.done(path)

    async def register_operation(self, reg: Registration, owner: int, *, digest: str = ""
                                 ) -> tuple[Operation, bool]:
        """Register ``reg`` for the user ``owner`` (from the spool file's owner or the API's
        peer credentials); returns the operation and whether it is new.

        Idempotent: an operation id already recorded for the same job (from the API: for the
        same request, by its ``digest``) is that operation, not a second registration. Two
        registrations of one id at once are taken one after the other: the second finds the
        first recorded (the check and the append are not atomic across the append's await)."""
        async with self.one_at_a_time(reg.operation_id):
            return await self._register_once(reg, owner, digest)

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, op_id: str) -> AsyncIterator[None]:
        """Registrations and submits of one operation id, one after the other."""
        while (pending := self._registering.get(op_id)) is not None:
            await pending.wait()
        done = self._registering[op_id] = anyio.Event()
        try:
            yield
        finally:
            del self._registering[op_id]
            done.set()

    async def _register_once(self, reg: Registration, owner: int, digest: str
                             ) -> tuple[Operation, bool]:
        if ACTION_ID.search(reg.operation_id):
            raise Refused(f"operation id {reg.operation_id!r} ends like an action's id "
                          f"(.submit, .fetch.N, .cancel.N); choose another",
                          code="invalid_operation_id", field="operation_id")
        if self.runner.holder(reg.operation_id) != owner:
            why = scoping.refusal(reg.operation_id)
            if why is not None:
                raise Refused(why, code="invalid_operation_id", field="operation_id")
        # Another principal's id is this owner's too, recorded apart (daemon.scoping).
        reg = msgspec.structs.replace(reg, operation_id=scoping.recorded_id(
            reg.operation_id, owner, self.runner.holder))
        existing = self.ops.get(reg.operation_id)
        if existing is not None:
            same = ((existing.request_digest == digest) if digest else
                    (existing.provider, existing.provider_job_id) == (reg.provider,
                                                                      reg.provider_job_id))
            if same and existing.registered_by_uid in (None, owner):
                return existing, False  # recorded before a crash, or a client's retry
            raise Refused(f"operation id {reg.operation_id} is already in use by another "
                          f"request", code="operation_id_in_use", status=409,
                          field="operation_id")
        if reg.provider_job_id in DOTS:
            raise Refused(
                f"job id {reg.provider_job_id!r} cannot be one segment of a status URL: a dot "
                f"segment is removed by URL normalisation even percent-encoded (RFC 3986 "
                f"§5.2.4, §6.2.2.2), so the request could reach another path",
                code="invalid_job_id", field="job_id")
        if f"{reg.operation_id}.submit" in self.runner.actions:
            raise Refused(f"operation id {reg.operation_id} is already in use by a submit",
                          code="operation_id_in_use", status=409, field="operation_id")
        profile = self.profiles.get(reg.provider)
        if profile is None:
            known = ", ".join(sorted(self.profiles)) or "none loaded"
            raise Refused(f"no profile for provider {reg.provider!r} (known: {known})",
                          code="unknown_provider", field="provider")
        events = register(reg, profile.contract, self.clock(),
                          registered_by=user_name(owner), registered_by_uid=owner)
        rejected = next((e for e in events if isinstance(e, RegistrationRejected)), None)
        if rejected is not None:
            raise Refused(f"{rejected.reason}: {rejected.detail}", code=rejected.reason)
        if digest:
            events = [msgspec.structs.replace(e, request_digest=digest)
                      if isinstance(e, OperationRegistered) else e for e in events]
        await self.record(events)
        registered = next(e for e in events if isinstance(e, OperationRegistered))
        logfmt.info("operation registered", op=registered.operation_id,
                    provider=registered.provider, job=registered.provider_job_id,
                    by=registered.registered_by)
        self.schedule(registered.operation_id)
        return self.ops[registered.operation_id], True

    async def ingest_decision(self, path: Path) -> None:
        rid = spool_request_id(path)
        try:
            data, st = self.spool.read(path)
            if rid is None:
                raise SpoolReject("file name is not REQUEST_ID.json (32 lowercase hex digits)")
            spool_cfg = self.config.spool
            refused = approval_refusal(path, st, approvers_group=spool_cfg.approvers_group,
                                       daemon_uid=os.geteuid(),
                                       allow_root=spool_cfg.allow_root_approval)
            if refused is not None:
                raise SpoolReject(f"not an approval (S36): {refused}")
            try:
                df = msgspec.json.decode(data, type=DecisionFile)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise SpoolReject(f"not a valid decision: {exc}") from None
            approver = user_name(st.st_uid)  # the file's owner, not a name the file claims
            observation = DecisionSubmitted(option=df.option, approver=approver, note=df.note,
                                            escalation_id=df.escalation_id)
            if df.operation_id in self.busy:
                return  # a poll is mid-flight; the next scan picks the file up
            await self.decide_escalation(df.operation_id, observation, st.st_uid)
        except (SpoolReject, Refused) as exc:
            logfmt.warn("decision rejected", file=path.name, reason=exc)
            self.spool.reject(path, rid, str(exc), decision=True)
            return
        self.spool.write_receipt(Receipt(rid, "recorded", df.operation_id), decision=True)
        self.spool.done(path)
        logfmt.info("decision recorded", op=df.operation_id, option=df.option, approver=approver)

    async def decide_escalation(self, op_id: str, observation: DecisionSubmitted,
                                approver_uid: int) -> bool:
        """Record a human's decision on the open escalation of an operation or an action
        (whether ``approver_uid`` is an approver was checked by the caller: the API's roles,
        the spool's directory and group); returns whether polling resumes.

        An approver never answers an escalation of an operation they registered unless
        ``[api] allow_self_approval``; then the decision records it (``self_approved``).
        A poll in flight is let finish first, so the decision meets the state it answers."""
        action = self.runner.actions.get(op_id)
        target = self.ops.get(action.operation_id if action is not None else op_id)
        owner = (action.intent.registered_by_uid
                 if action is not None and action.kind == "submit"
                 else target.registered_by_uid if target is not None else None)
        if owner is not None and owner == approver_uid:
            if not self.config.api.allow_self_approval:
                raise Refused(
                    f"{op_id} was registered by {user_name(approver_uid)}; an approver may not "
                    f"answer their own operation's escalation ([api] allow_self_approval = "
                    f"true allows it, for one-person setups)", code="self_approval", status=403)
            observation = msgspec.structs.replace(observation, self_approved=True)
        if action is not None:
            decided = await self.runner.decide(action, observation)
            if not decided.accepted:
                raise Refused(f"decision rejected: {decided.reason}", code="decision_rejected",
                              status=409, field="option")
            return False
        if self.ops.get(op_id) is None:
            raise Refused(f"no operation or action {op_id!r}", code="not_found", status=404)
        if observation.escalation_id is None and self.config.spool.require_escalation_number:
            raise Refused(
                "the decision names no escalation number: answer with bide decide OP "
                "OPTION --escalation N (N as bide escalations and the outbox show it), "
                "so it cannot land on a later escalation", code="escalation_number_required",
                field="escalation_id")
        await self.wait_until(lambda: op_id not in self.busy)  # bounded by its timeout
        events = decide(self.ops[op_id], observation, self.clock(), self.draw())
        await self.record(events)
        rejected = next((e for e in events if isinstance(e, DecisionRejected)), None)
        if rejected is not None:
            raise Refused(f"decision rejected: {rejected.reason}", code="decision_rejected",
                          status=409, field="option")
        await self.runner.after_decision(list(events))
        self.schedule(op_id)
        return self.ops[op_id].phase == "live"

    async def withdraw(self, op_id: str, withdrawal: Withdrawal) -> bool:
        """Stop waiting on ``op_id`` for its owner (checked by the caller): recorded as
        ``withdrawn_by_owner``, no provider call. False when it had already ended."""
        await self.wait_until(lambda: op_id not in self.busy)  # a poll in flight ends first
        self.busy.add(op_id)  # and none starts until the withdrawal is recorded
        try:
            events = decide(self.ops[op_id], withdrawal, self.clock(), self.draw())
            if events:
                await self.record(events)
        finally:
            self.busy.discard(op_id)
            self.schedule(op_id)  # cancels its timer and gives back a reserved quota slot
        if not events:
            return False
        logfmt.info("operation withdrawn by its owner", op=op_id, by=withdrawal.by)
        return True

    async def _watch_spool(self) -> None:
        """Ingest on every change, and rescan at least once a second: a file dropped between
        the start-up scan and the watch being set up (or an event the kernel dropped) waits
        a second at most, never forever."""
        async for _ in watchfiles.awatch(self.spool.incoming, self.spool.decisions,
                                         stop_event=self.stopping, debounce=20, step=10,
                                         rust_timeout=1000, yield_on_timeout=True):
            await self.ingest_all()
            self.prune_spool()

    def prune_spool(self, *, force: bool = False) -> None:
        """Keep receipts for ``receipt_retention_seconds`` and the newest ``rejected_max_files``
        refused files: at start, then at most once a minute, or sooner during a flood."""
        cfg = self.config.spool
        due = (force or time.monotonic() - self._pruned_at >= 60.0
               or self.spool.rejected_since_prune >= max(1, cfg.rejected_max_files // 10))
        if not due:
            return
        self._pruned_at = time.monotonic()
        try:
            removed = self.spool.prune(self.clock(),
                                       receipt_retention=cfg.receipt_retention_seconds,
                                       receipt_max=cfg.receipt_max_files,
                                       rejected_max=cfg.rejected_max_files)
        except OSError as exc:
            logfmt.warn("cannot prune the spool; trying again later", error=exc.strerror)
            return
        if removed:
            self.metrics.spool_pruned += removed
            logfmt.info("spool pruned", files=removed)

    async def _watch_profiles(self) -> None:
        assert self.config.profiles_dir is not None
        async for _ in watchfiles.awatch(self.config.profiles_dir, stop_event=self.stopping,
                                         debounce=200, rust_timeout=1000):
            self.load_profiles()

    async def _signals(self, scope: anyio.CancelScope, *,
                       task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                       ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            task_status.started()  # handlers are in place: "ready" may be announced
            async for signum in sigs:
                if signum == signal.SIGHUP:
                    logfmt.info("SIGHUP: reloading profiles")
                    self.load_profiles()
                    continue
                logfmt.info("stopping", signal=signal.Signals(signum).name)
                self.stopping.set()
                scope.cancel()
                return

    # -- lifecycle -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop as on SIGTERM: no new requests, drain, final checkpoint."""
        self.stopping.set()
        if self._main_scope is not None:
            self._main_scope.cancel()

    def render_metrics(self) -> str:
        flushes = self._log.flushes if self._log is not None else 0
        text = self.metrics.render(self.ops, self.config.log_dir, flushes)
        if self.lease is not None:
            text = text.rstrip("\n") + "\n" + "\n".join(self.lease.metrics_lines()) + "\n"
        return text

    def status_line(self, *, alarm: bool = False) -> str:
        live = sum(1 for op in self.ops.values() if op.phase == "live")
        escalated = sum(1 for op in self.ops.values() if op.phase == "escalated")
        failing = alarm or self.metrics.log_alarm
        alarm_text = "; ALARM: LOG APPEND FAILING" if failing else ""
        return (f"{live} live, {escalated} escalated, {self.metrics.requests_sent} requests "
                f"sent{alarm_text}")

    async def _status_and_watchdog(self) -> None:
        interval = systemd.watchdog_interval()
        period = min(interval, 5.0) if interval else 5.0
        last = ""
        while True:
            line = self.status_line()
            messages = ["WATCHDOG=1"] if interval else []
            if line != last:
                messages.append(f"STATUS={line}")
                last = line
            if messages:
                systemd.notify(*messages)
            await anyio.sleep(period)

    async def recover_in_flight(self, undecided: dict[str, Fact] | None = None) -> None:
        """S11/S13: an intent without an outcome counted, and its delivery is ambiguous.

        A fact recorded without its decision (a crash between the two appends) is decided now.
        """
        for op_id, fact in (undecided or {}).items():
            try:
                await self.record(decide(self.ops[op_id], fact, self.clock(), self.draw()))
            except FencedError:
                raise
            except Exception as exc:  # the barrier: a bug here must not stop every start
                await self.contain(op_id, exc, "deciding a fact left by a crash")
                continue
            logfmt.warn("decided a fact left undecided by a crash", op=op_id,
                        request=fact.request_number)
        for op in list(self.ops.values()):
            if op.in_flight is None:
                continue
            now = self.clock()
            unknown = RequestOutcomeUnknown(operation_id=op.operation_id, at=now,
                                            request_number=op.in_flight)
            await self.record([unknown])
            try:
                await self.record(decide(self.ops[op.operation_id], unknown, now, self.draw()))
            except FencedError:
                raise
            except Exception as exc:  # the barrier
                await self.contain(op.operation_id, exc, "recovering after a restart")
                continue
            logfmt.warn("request outcome unknown after restart", op=op.operation_id,
                        request=op.in_flight)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        cfg = self.config
        try:
            self.spool.create(cfg.spool.agents_group, cfg.spool.approvers_group)
        except SpoolPermissionError as exc:
            raise ConfigError(str(exc)) from None
        cfg.outbox_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.load_profiles()
        started = time.monotonic()
        snapshot = await anyio.to_thread.run_sync(load_snapshot, cfg.snapshot_path,
                                                  self.keyring, self.snapshot_keys,
                                                  self.store)
        publishing = (self.publisher.running() if self.publisher is not None
                      else contextlib.nullcontext())
        async with publishing, LogWriter(
                cfg.log_dir, self.keyring, self.signing, heads=self.heads,
                             on_problem=_log_problem, segment_bytes=cfg.log.segment_bytes,
                             checkpoint_every=cfg.log.checkpoint_every,
                             checkpoint_interval=cfg.log.checkpoint_interval_seconds,
                             resume=snapshot.position if snapshot else None,
                             store=self.store) as log:
            self._log = log
            if self.store is not None and self.lease is not None:
                # The takeover in the chain: a signed checkpoint naming this node and the
                # lease epoch it took, committed under that epoch before anything else.
                holder, epoch, _ = self.lease.health()
                await log.checkpoint(Takeover(lease_epoch=epoch, holder=holder))
            for cut in log.recoveries:
                logfmt.warn("torn log tail quarantined" if cut.reason == "torn" else
                            "log records no seal covers quarantined (not acted on)",
                            reason=cut.reason, bytes=cut.cut_len, quarantine=cut.quarantine)
            if snapshot is not None and log.resumed_at != snapshot.position.seq:
                logfmt.warn("state snapshot does not match the log; replaying the whole log",
                            snapshot=cfg.snapshot_path, snapshot_seq=snapshot.position.seq)
                snapshot = None
            if snapshot is not None and self.snapshot_keys.to_write(snapshot.position) is None:
                logfmt.warn("state snapshot is of an epoch the log has left (its key is "
                            "destroyed); replaying the whole log", snapshot=cfg.snapshot_path,
                            snapshot_epoch=snapshot.position.epoch)
                snapshot = None
            from_events = snapshot.ledger.events if snapshot is not None else 0
            self.ledger = await anyio.to_thread.run_sync(replay_log, cfg.log_dir, self.keyring,
                                                         snapshot)
            self.ops, self.runner.actions = self.ledger.ops, self.ledger.actions
            self.live_by_owner = collections.Counter(
                op.registered_by_uid for op in self.ops.values() if op.phase == "live")
            self._snapshot_events = from_events
            undecided = dict(self.ledger.undecided)
            self.histories.start_seq = log.head_seq  # later events reach the histories live
            # What start-up built lives as long as the daemon: keep the collector from
            # re-scanning 100,000 operations on every full collection (they hold no cycles).
            gc.freeze()
            live = [op for op in self.ops.values() if op.phase == "live"]
            logfmt.info("replayed", events=self.ledger.events, operations=len(self.ops),
                        live=len(live), from_snapshot=from_events,
                        seconds=f"{time.monotonic() - started:.3f}", log_sync=log.sync_mode)
            async with anyio.create_task_group() as polls:
                self.polls = polls
                await self.recover_in_flight(undecided)
                await self.runner.recover()
                live = [op for op in self.ops.values() if op.phase == "live"]
                for op in live:
                    self.schedule(op.operation_id)
                await self.ingest_all()
                self.prune_spool(force=True)
                with anyio.CancelScope() as main_scope:
                    self._main_scope = main_scope
                    async with anyio.create_task_group() as tg:
                        # Before READY=1: a SIGTERM right after it must drain, not kill.
                        await tg.start(self._signals, main_scope)
                        tg.start_soon(self._timer_loop)
                        tg.start_soon(self._watch_wall_clock)
                        tg.start_soon(self._watch_spool)
                        if cfg.profiles_dir is not None:
                            tg.start_soon(self._watch_profiles)
                        if cfg.metrics.listen:
                            host, _, port = cfg.metrics.listen.rpartition(":")
                            bound = await tg.start(serve_metrics, host, int(port),
                                                   self.render_metrics)
                            self.metrics_url = f"http://{host}:{bound}/metrics"
                            logfmt.info("metrics listening",
                                        address=f"http://{host}:{bound}/metrics")
                        if cfg.api.enabled:
                            await tg.start(self._serve_api)
                        logfmt.info("ready", live=len(live), log=cfg.log_dir)
                        systemd.notify("READY=1", f"STATUS={self.status_line()}")
                        tg.start_soon(self._status_and_watchdog)
                        task_status.started()
                # Draining: no new requests; those in flight get a bounded time to finish.
                self.stopping.set()
                systemd.notify("STOPPING=1", f"STATUS=stopping: {self.status_line()}")
                if self.busy:
                    self._idle = anyio.Event()
                    with anyio.move_on_after(self.drain_seconds):
                        await self._idle.wait()
                polls.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await self.recover_in_flight()
                for client in self.clients.values():
                    await client.aclose()
        if log.position is not None and log.failed is None:
            # The log is closed and nothing changes any more: snapshot what it holds.
            await write_snapshot_in_thread(cfg.snapshot_path, self.keyring, self.snapshot_keys,
                                           log.position, self.ledger, self.store)
        logfmt.info("stopped", head=f"{log.head_seq}:{log.head_hash}")



def _log_problem(message: str) -> None:
    logfmt.error(message)  # from the log's writer thread: one print, one line


async def _acquire(semaphore: anyio.Semaphore) -> None:
    """Take a free slot without a pass through the event loop (anyio's ``acquire`` always
    yields once, twice per poll on the hot path); wait only when none is free."""
    try:
        semaphore.acquire_nowait()
    except anyio.WouldBlock:
        await semaphore.acquire()


def _frames(exc: BaseException) -> str:
    """Where an exception came from, as ``file:line in function`` frames, without its message
    (which could quote a header, a body or a credential)."""
    frames = traceback.extract_tb(exc.__traceback__)[-6:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
