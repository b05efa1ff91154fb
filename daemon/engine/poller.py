"""The poller: each live operation's one timer, and the poll sequence it starts.

One job: the I/O shell around ``replay.decide`` for status polls (S9, S13, S32, S33). A
wake-up runs the seed's order: load; ``decide(WakeUp)`` (deadline, budget, due); the
provider's turn and quota (:mod:`daemon.engine.pacing`; a poll it holds back is recorded as a
``local_quota`` delay); ``StatusRequestIntended`` made durable; one request; the fact and its
decision recorded together (:meth:`daemon.engine.chain.Chain.handle`); the next timer. Nothing
is held while sleeping: the state is in the log, the timer is one heap entry. An overdue
operation gets one wake-up, never a burst; ``decide`` checks its deadline first.

The poller also holds each provider's profile and status client, reloaded with the profiles
(an invalid profile keeps the last good one); the quotas and in-flight slots are its pacing's,
its own or the one a sharded node's engines share (:class:`daemon.engine.pacing.SharedPacing`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import anyio
import anyio.abc

from daemon import logfmt
from daemon.config import Config
from daemon.engine.chain import Chain
from daemon.engine.followers import Waiters
from daemon.engine.pacing import Deferred, Granted, Member, Pacing, SharedPacing, Slots
from daemon.errors import ConfigError
from daemon.faults import FaultInjection
from daemon.http import MIN_TIMEOUT, CredentialError, StatusClient
from daemon.metrics import Metrics
from daemon.profile import Profile, load_profiles, too_long_for_lease
from daemon.timers import TimerHeap
from eventlog.errors import FencedError
from replay.events import StatusRequestIntended, StatusResponseReceived, TransportFailed
from replay.observations import QuotaDeferred, WakeUp
from replay.state import Operation

#: A request is not sent this close to its deadline: it could arrive after it.
SEND_MARGIN = MIN_TIMEOUT
MAX_POLLS = 1024  # poll tasks alive at once; more due operations wait their turn
#: How far back a start counts the log's requests in the quotas: the widest window a provider's
#: quota is judged over (bide_alerts and the tests check 1 s and 2 s windows).
QUOTA_SEED_SECONDS = 2.0


class Poller:
    def __init__(
        self,
        config: Config,
        chain: Chain,
        waiters: Waiters,
        metrics: Metrics,
        *,
        faults: FaultInjection,
        pacing: SharedPacing | None = None,
    ) -> None:
        self.config = config
        self.chain = chain
        self.waiters = waiters
        self.metrics = metrics
        self.faults = faults
        self.clock = chain.clock
        self.timers = TimerHeap()
        # The quotas and in-flight slots: this engine's own, or the process's shared ones.
        self.pacing: Pacing = pacing or Pacing(is_live=self._is_live, wake=self._wake)
        self._member: Member | None = None
        if pacing is not None:
            self._member = pacing.attach(self._is_live, self._wake, self.live_by_provider)
        self.profiles: dict[str, Profile] = {}
        self.clients: dict[str, StatusClient] = {}
        self.busy: set[str] = set()
        self.idle = anyio.Event()
        self.polls: anyio.abc.TaskGroup | None = None
        self._poll_slots = anyio.Semaphore(MAX_POLLS)
        chain.on_set_aside = self.timers.cancel

    def _is_live(self, op_id: str) -> bool:
        op = self.chain.ops.get(op_id)
        return op is not None and op.phase == "live"

    def _wake(self, op_id: str) -> None:
        self.timers.schedule(op_id, time.monotonic())

    def live_by_provider(self) -> dict[str, int]:
        """Live operations per provider (a node's demand on each provider's quota)."""
        out: dict[str, int] = {}
        for op in self.chain.ops.values():
            if op.phase == "live":
                out[op.provider] = out.get(op.provider, 0) + 1
        return out

    def detach(self) -> None:
        """The engine stops: the shared pacing forgets it (and takes back its held slots)."""
        if self._member is not None and isinstance(self.pacing, SharedPacing):
            self.pacing.detach(self._member)
            self._member = None

    # -- profiles ------------------------------------------------------------------------------

    def load_profiles(self) -> None:
        cfg = self.config
        if cfg.profiles_dir is None:
            raise ConfigError(f"{cfg.path}: [paths] profiles_dir is not set")
        good, bad = load_profiles(cfg.profiles_dir)
        lease = self.chain.lease
        if lease is not None:
            for name, message in too_long_for_lease(good, lease.longest_request).items():
                bad[cfg.profiles_dir / f"{name}.toml"] = message
                del good[name]
        for path, message in bad.items():
            kept = " (keeping the last good version)" if path.stem in self.profiles else ""
            logfmt.error("profile refused" + kept, profile=path, error=message)
        for name, profile in good.items():
            old = self.profiles.get(name)
            if old is not None and old.digest == profile.digest:
                continue
            self.profiles[name] = profile
            quota = profile.quota
            self.pacing.configure(name, quota.requests_per_second, quota.burst, quota.max_in_flight)
            previous = self.clients.pop(name, None)
            self.clients[name] = StatusClient(profile, self._credentials_dir())
            if previous is not None and self.polls is not None:
                self.polls.start_soon(previous.aclose)
            logfmt.info("profile loaded", provider=name, digest=profile.digest[:16])

    def _credentials_dir(self) -> Path | None:
        if self.config.credentials_dir is not None:
            return self.config.credentials_dir
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        return Path(creds) if creds else None

    # -- timers --------------------------------------------------------------------------------

    def seed_quotas(self, ops: Iterable[Operation], now: float) -> None:
        """Count the requests the log shows were answered in the last seconds (by the
        process or node before this one) in each provider's quota: a restart or a takeover
        starts with that much of the window spent, not with a fresh burst. The answer's time
        stands for the request's (a little later: the safe side)."""
        monotonic = self.pacing.monotonic()
        recent: dict[str, list[float]] = {}
        for op in ops:
            for at in (op.last_http_at, op.last_transport_failure_at):
                if at is not None and 0.0 <= now - at < QUOTA_SEED_SECONDS:
                    recent.setdefault(op.provider, []).append(monotonic - (now - at))
        for provider, sent in recent.items():
            self.pacing.seed(provider, sent)

    def schedule(self, op_id: str) -> None:
        """Arm the operation's one timer: at the end of the wait its last ``PollScheduled``
        set, measured on the monotonic clock from when it was decided (when that happened in
        this process), else at ``next_poll_at`` read against the wall clock now; and never
        later than the deadline, a wall-clock fact. An operation that will not poll again
        (ended, or set aside) has its timer cancelled and gives back the quota slot it held."""
        op = self.chain.ops.get(op_id)
        waits = self.chain.waits
        if op is None or op.phase != "live" or op_id in self.chain.set_aside:
            self.timers.cancel(op_id)
            waits.pop(op_id, None)
            if op is not None:
                self.pacing.give_back(op_id, op.provider)
            return
        if self.pacing.queued(op_id):
            # Waiting for its turn at the quota: only its deadline wakes it meanwhile.
            deadline, _ = op.effective_deadline
            self.timers.schedule(op_id, time.monotonic() + max(0.0, deadline - self.clock()))
            return
        now_mono, now_wall = time.monotonic(), self.clock()
        wait = waits.get(op_id)
        if wait is not None and wait[0] == op.next_poll_at:
            due = wait[1]
        else:
            waits.pop(op_id, None)
            due = now_mono + max(0.0, op.next_poll_at - now_wall)
        deadline, _ = op.effective_deadline
        self.timers.schedule(op_id, min(due, now_mono + max(0.0, deadline - now_wall)))

    def _timer_elapsed(self, op: Operation) -> bool:
        """Whether the wait scheduled for ``op`` in this process has run out (monotonic)."""
        wait = self.chain.waits.get(op.operation_id)
        return wait is not None and wait[0] == op.next_poll_at and time.monotonic() >= wait[1]

    async def watch_wall_clock(self) -> None:
        """Re-arm every timer when the wall clock jumps: deadlines are wall-clock times, so one
        brought nearer by a jump forward must still stop its operation on time."""
        offset = self.clock() - time.monotonic()
        while True:
            await anyio.sleep(1.0)
            now = self.clock() - time.monotonic()
            if abs(now - offset) > 1.0:
                logfmt.warn(
                    "the wall clock jumped; deadlines re-read against it",
                    jump=f"{now - offset:+.1f}s",
                )
                for op_id, op in self.chain.ops.items():
                    if op.phase == "live" and op_id not in self.busy:
                        self.schedule(op_id)
            offset = now

    async def timer_loop(self) -> None:
        """Start a poll for each due operation, at most ``MAX_POLLS`` at once: under overload
        due operations wait in the heap's output, not as thousands of parked tasks."""
        assert self.polls is not None
        stopping = self.chain.stopping
        while not stopping.is_set():
            for op_id, due in await self.timers.wait():
                await acquire(self._poll_slots)
                if stopping.is_set():
                    self._poll_slots.release()
                    return
                self.polls.start_soon(self._poll, op_id, due)

    # -- one poll ------------------------------------------------------------------------------

    async def _poll(self, op_id: str, due: float) -> None:
        """One wake-up of one operation, in the seed's order (S32)."""
        try:
            # Lateness as the operation sees it: from its due time to its poll starting.
            self.metrics.wakeup_lateness.observe(time.monotonic() - due)
            op = self.chain.ops.get(op_id)
            if op is None or op_id in self.busy:
                return
            self.busy.add(op_id)
            try:
                await self._poll_once(op)
            except FencedError:
                raise  # not this operation's fault: the node's term ends (daemon.node)
            except Exception as exc:  # the barrier: one operation, not all
                await self.chain.contain(op_id, exc, "polling")
            finally:
                self.busy.discard(op_id)
                self.waiters.announce()  # a decision waiting for this poll may go on
                self.schedule(op_id)
                if not self.busy:
                    self.idle.set()
        finally:
            self._poll_slots.release()

    async def _poll_once(self, op: Operation) -> None:
        """S32: decide; take the provider's turn; reload and decide again with a fresh clock;
        the quota; the intent made durable; a free in-flight slot; the one request; the fact;
        decide. Nothing is held while sleeping (S33); the in-flight slot only for the request."""
        chain = self.chain
        self.faults.fire("poll", op.operation_id)
        events = chain.decide(op, WakeUp(timer_elapsed=self._timer_elapsed(op)))
        if not any(isinstance(e, StatusRequestIntended) for e in events):
            await chain.record(events)  # nothing, or a stop (deadline, budget) S9/S13/S17
            return
        client = self.clients.get(op.provider)
        if client is None:
            logfmt.error(
                "no profile for provider; not polling", op=op.operation_id, provider=op.provider
            )
            self.timers.schedule(op.operation_id, time.monotonic() + 30.0)
            return
        try:
            client.check_credential()
        except CredentialError as exc:
            logfmt.error("credential unreadable; not polling", op=op.operation_id, error=exc)
            return  # rescheduled at next_poll_at; the deadline still bounds the wait
        if chain.lease is not None:  # the lease must outlive the request (daemon.lease)
            await chain.lease.wait_allows(client.profile.status.timeout_seconds)
        slot = self.pacing.in_flight[op.provider]
        intent = await self._intend(op, slot)
        if intent is None:
            return
        try:
            fact = await self._send(chain.ops[op.operation_id], client, intent)
        finally:
            slot.release()
        # The fact and its decision in one durable batch: one write and fsync, not two.
        self.faults.fire("decide", op.operation_id)
        await chain.handle(chain.ops[op.operation_id], fact, with_fact=True)

    async def _intend(self, op: Operation, slot: Slots) -> StatusRequestIntended | None:
        """Make the next request's intent durable, then take ``slot`` (the provider's
        in-flight slot) for it; None if no request is to be sent now.

        The provider's turns (as many as its in-flight slots) bound the intents made durable
        ahead of a free slot: the group commit of the next intents overlaps the requests in
        flight, and an intent waits at most for one of them to end. The deadline is checked
        again once the slot is taken (``_send``)."""
        chain = self.chain
        turn = self.pacing.turns[op.provider]
        await turn.acquire()
        try:
            op = chain.ops[op.operation_id]  # reload: waiting for the turn took time
            now = self.clock()
            events = chain.decide(op, WakeUp(timer_elapsed=self._timer_elapsed(op)))
            intent = next((e for e in events if isinstance(e, StatusRequestIntended)), None)
            if intent is None:
                await chain.record(events)  # the deadline passed while waiting for the turn
                return None
            if not await self._quota_allows(op, now):
                return None
            if chain.stopping.is_set():
                return None
            await chain.record(events)  # S13: durable before the request leaves
            self.faults.fire("request", op.operation_id)
            await slot.acquire()
            return intent
        finally:
            turn.release()

    async def _quota_allows(self, op: Operation, now: float) -> bool:
        """Take a slot of the provider's rate quota, or record the poll as held back
        (``local_quota``; never past the deadline) with its future slot reserved.

        Fair between registrants (:mod:`daemon.engine.pacing`): past its share of the future
        slots, a poll waits in its registrant's queue, unrecorded, so 200 operations of one
        agent cannot take every slot ahead of another's 5.
        """
        op_id, provider, who = op.operation_id, op.provider, op.registered_by
        admission = self.pacing.admit(op_id, provider, who)
        if isinstance(admission, Granted):
            return True
        if not isinstance(admission, Deferred):
            return False  # queued: woken when a slot is used or given back
        await self.chain.handle(op, QuotaDeferred(until=now + admission.wait), now=now)
        if self.chain.ops[op_id].phase == "live":
            self.pacing.hold(op_id, provider, who)
        else:
            self.pacing.release(provider)
        return False

    async def _send(
        self, op: Operation, client: StatusClient, intent: StatusRequestIntended
    ) -> StatusResponseReceived | TransportFailed:
        """The one request of ``intent``, or why it was not sent after all."""
        await self.provider_turn(op.provider, reserved=True)
        deadline, _ = op.effective_deadline
        time_left = deadline - self.clock()
        # S13: a request needs room to arrive before the deadline, not only to leave.
        if time_left < SEND_MARGIN:
            return TransportFailed(
                operation_id=op.operation_id,
                at=self.clock(),
                request_number=intent.request_number,
                kind="pool_timeout",
                detail=f"not sent: less than {SEND_MARGIN:g}s to the deadline once the "
                f"intent was durable",
            )
        lease = self.chain.lease
        if lease is not None and not lease.allows(client.profile.status.timeout_seconds):
            return TransportFailed(
                operation_id=op.operation_id,
                at=self.clock(),
                request_number=intent.request_number,
                kind="not_sent",
                detail="not sent: the lease would not outlive the request once the intent "
                "was durable",
            )
        try:
            url = op.status_location or client.profile.status_url(op.provider_job_id)
        except ValueError as exc:  # a {+job_id} path id with a dot or empty segment
            return TransportFailed(
                operation_id=op.operation_id,
                at=self.clock(),
                request_number=intent.request_number,
                kind="not_sent",
                detail=f"not sent: {exc}"[:200],
            )
        self.faults.fire("send", op.operation_id)
        fact = await client.fetch(
            operation_id=op.operation_id,
            url=url,
            request_number=intent.request_number,
            time_left=time_left,
            clock=self.clock,
            job_id=op.provider_job_id,
            gate=self.chain.send_gate,  # the lease, checked again as the request is written
        )
        self.metrics.requests_sent += 1
        return fact

    async def provider_turn(self, provider: str, *, reserved: bool = False) -> None:
        """Wait until a request to ``provider`` may leave under its quota.

        A poll took its slot before its intent (``reserved``): only the spacing between
        requests actually leaving is checked again, absorbing the milliseconds the intent's
        append took. A submit, fetch or cancel takes its slot here, from the same quota.
        While the provider is closed (its rate set to zero) nothing leaves; a request that
        slept for a slot taken under limits changed meanwhile takes one again under the new.
        """
        pacing = self.pacing
        if provider not in pacing.quotas:
            return
        await pacing.wait_open(provider)
        if not reserved:
            wait = pacing.quota_wait(provider)
            if wait > 0:
                await anyio.sleep(wait)
        while True:
            await pacing.wait_open(provider)
            generation = pacing.generation(provider)
            wait = pacing.spacing_wait(provider)
            if wait > 0:
                await anyio.sleep(wait)
            if pacing.generation(provider) == generation and pacing.is_open(provider):
                return

    async def wait_idle(self, seconds: float) -> None:
        """Draining: give the polls in flight ``seconds`` to end."""
        if self.busy:
            self.idle = anyio.Event()
            with anyio.move_on_after(seconds):
                await self.idle.wait()


async def acquire(semaphore: anyio.Semaphore) -> None:
    """Take a free slot without a pass through the event loop (anyio's ``acquire`` always
    yields once, twice per poll on the hot path); wait only when none is free."""
    try:
        semaphore.acquire_nowait()
    except anyio.WouldBlock:
        await semaphore.acquire()
