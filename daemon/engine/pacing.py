"""Pacing: each provider's request quota, shared fairly between the registrants polling it.

One job: decide, synchronously and against an injected monotonic clock, when a request to a
provider may leave. Nothing here sleeps, records or sends; the poller acts on the answers.

* Two :class:`~daemon.timers.RateQuota` per provider: the *quota* hands out slots (now, or a
  future one the poll records as a ``local_quota`` delay and then holds, prepaid); the
  *pacer* re-checks the spacing as requests actually leave.
* Fair shares: a registrant may hold future slots only up to its share of the next
  :data:`FAIR_HORIZON` of the quota, split among the registrants holding or waiting for
  slots. Past it, a poll waits in its registrant's queue, unrecorded; each slot used or given
  back wakes the next waiting poll, registrant by registrant in turn.
* Giving back: a held slot whose operation will not poll (it ended, or was set aside) is
  returned with :meth:`Pacing.give_back`, explicitly, by whoever ends the wait.
* In flight: each provider's :class:`Slots` bound the requests in flight and the intents
  made durable ahead of a free slot (the poller's turns).
* Limits while running (:meth:`Pacing.set_limits`): a lowered rate or burst holds from the
  next slot taken (and a request already past its slot but not yet sent is spaced again
  under the new figures); in-flight slots above a lowered limit drain, none is given until
  below it. A rate of zero closes the provider: polls wait in their queues, other requests
  in :meth:`Pacing.wait_open`, until it opens.
* One process, many engines: a :class:`SharedPacing` is one pacing for every shard's
  supervisor in the process, so K of them together keep one quota and one in-flight limit,
  fair between registrants across all of them. With slices (:mod:`daemon.shards.quota`) the
  process keeps within its node's slice, which expires unless renewed.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from daemon.timers import RateQuota

#: Fair shares of a provider's quota are computed over this much of it (seconds).
FAIR_HORIZON = 1.0


@dataclass(frozen=True)
class Granted:
    """The request may be sent now (a slot taken now, or the one held since a deferral)."""


@dataclass(frozen=True)
class Queued:
    """The registrant holds its share of future slots: the poll waits, unrecorded, until
    :meth:`Pacing.give_back` or a slot used wakes it (``wake``)."""


@dataclass(frozen=True)
class Deferred:
    """A future slot is reserved, ``wait`` seconds from now: record the delay, then
    :meth:`Pacing.hold` it (or :meth:`Pacing.release` it if the operation ended)."""

    wait: float


Admission = Granted | Queued | Deferred


@dataclass(frozen=True)
class Limits:
    """A provider's rate (requests per second; 0 closes it), burst and in-flight limit."""

    rate: float
    burst: int
    in_flight: int


class Slots:
    """A provider's in-flight slots, with a limit that may change while they are taken.

    Lowered, the slots taken above the new limit drain (their holders release them as
    usual) and none is given until fewer than the limit are taken; raised, waiting takers
    get theirs at once, first come first served."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._waiting: collections.deque[anyio.Event] = collections.deque()

    async def acquire(self) -> None:
        """Take a slot: at once when one is free and nobody waits (no pass through the event
        loop, as the poller's hot path wants), else in turn."""
        if self.taken < self.limit and not self._waiting:
            self.taken += 1
            return
        given = anyio.Event()
        self._waiting.append(given)
        try:
            await given.wait()
        except BaseException:
            if given.is_set():
                self.release()  # given while being cancelled: not ours to keep
            else:
                self._waiting.remove(given)
            raise

    def release(self) -> None:
        self.taken -= 1
        self._give()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._give()

    def _give(self) -> None:
        while self._waiting and self.taken < self.limit:
            self.taken += 1
            self._waiting.popleft().set()


class Pacing:
    """Every provider's quota and the fair sharing of its future slots.

    ``is_live(op_id)`` says whether a queued poll still has something to poll; ``wake(op_id)``
    makes a queued poll due now (the poller arms its timer)."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        is_live: Callable[[str], bool] = lambda op_id: True,
        wake: Callable[[str], None] = lambda op_id: None,
    ) -> None:
        self.monotonic = monotonic
        self.is_live = is_live
        self.wake = wake
        self.quotas: dict[str, RateQuota] = {}
        self.pacers: dict[str, RateQuota] = {}  # the same quota, checked as requests leave
        self.prepaid: dict[str, str] = {}  # op id -> registrant holding a future slot
        self._prepaid_provider: dict[str, str] = {}  # op id -> provider of that slot
        self._reserved: dict[str, dict[str, int]] = {}  # provider -> registrant -> slots held
        self._waiting: dict[str, dict[str, collections.deque[str]]] = {}  # turns to come
        self._queued: set[str] = set()
        self._dispatched: set[str] = set()
        self.in_flight: dict[str, Slots] = {}  # provider -> requests in flight
        self.turns: dict[str, Slots] = {}  # provider -> intents ahead of a slot
        self.generations: dict[str, int] = {}  # provider -> limits changed so many times
        self._closed: set[str] = set()
        self._opened: dict[str, anyio.Event] = {}

    def configure(self, provider: str, rate: float, burst: int, max_in_flight: int = 8) -> None:
        """A provider's quota, new or changed (a profile loaded): both counters start afresh,
        and so do its in-flight slots (requests in flight release the ones they took)."""
        self.quotas[provider] = RateQuota(rate, burst, self.monotonic)
        self.pacers[provider] = RateQuota(rate, burst, self.monotonic)
        self.in_flight[provider] = Slots(max_in_flight)
        self.turns[provider] = Slots(max_in_flight)
        self.generations[provider] = self.generations.get(provider, 0) + 1

    def seed(self, provider: str, sent: list[float]) -> None:
        """Requests to ``provider`` sent before this process took over (monotonic times):
        counted in its quota, so the window the provider sees holds across a restart or a
        takeover (:meth:`daemon.timers.RateQuota.seed`)."""
        for quota in (self.quotas.get(provider), self.pacers.get(provider)):
            if quota is not None:
                quota.seed(sent)

    def set_limits(self, provider: str, limits: Limits) -> None:
        """Change a configured provider's limits while running (see the module's rules).

        A rate of zero closes the provider; opened again (or raised), the polls waiting in
        its queues are woken in turn."""
        quota, pacer = self.quotas[provider], self.pacers[provider]
        self.generations[provider] = self.generations.get(provider, 0) + 1
        self.in_flight[provider].set_limit(limits.in_flight)
        self.turns[provider].set_limit(limits.in_flight)
        if limits.rate <= 0:
            if provider not in self._closed:
                self._closed.add(provider)
                self._opened[provider] = anyio.Event()
            return
        raised = limits.rate > quota.rate or limits.burst > quota.burst
        quota.retune(limits.rate, limits.burst)
        pacer.retune(limits.rate, limits.burst)
        if provider in self._closed:
            self._closed.discard(provider)
            self._opened.pop(provider).set()
            raised = True
        if raised:
            self._dispatch(provider)

    def is_open(self, provider: str) -> bool:
        """Whether ``provider`` may be sent anything now (its rate is not zero)."""
        return provider not in self._closed

    async def wait_open(self, provider: str) -> None:
        """Wait while ``provider`` is closed."""
        while not self.is_open(provider):
            opened = self._opened.get(provider)
            if opened is None:
                return
            await opened.wait()

    def queued(self, op_id: str) -> bool:
        """Whether ``op_id`` waits in its registrant's queue for a slot."""
        return op_id in self._queued

    def holds(self, op_id: str) -> bool:
        """Whether ``op_id`` holds a future slot (recorded as a ``local_quota`` delay)."""
        return op_id in self.prepaid

    # -- a slot for a poll ------------------------------------------------------------------

    def admit(self, op_id: str, provider: str, who: str) -> Admission:
        """A poll of ``op_id`` (registered by ``who``) asks to send its request now."""
        if not self.is_open(provider):
            self.give_back(op_id, provider)  # a slot taken under limits no longer in force
            self._dispatched.discard(op_id)
            self._enqueue(provider, who, op_id)
            return Queued()
        if op_id in self.prepaid:
            self._unreserve(op_id, provider)
            return Granted()
        dispatched = op_id in self._dispatched
        self._dispatched.discard(op_id)
        held = self._reserved.setdefault(provider, {})
        if not dispatched and held.get(who, 0) >= self.share(provider, who):
            self._enqueue(provider, who, op_id)
            return Queued()
        wait = self.quotas[provider].reserve()
        if wait <= 0:
            self._dispatch(provider)
            return Granted()
        return Deferred(wait)

    def hold(self, op_id: str, provider: str, who: str) -> None:
        """The deferral is recorded: ``op_id`` holds its future slot until it polls."""
        held = self._reserved.setdefault(provider, {})
        self.prepaid[op_id] = who
        self._prepaid_provider[op_id] = provider
        held[who] = held.get(who, 0) + 1

    def release(self, provider: str) -> None:
        """A slot reserved by :meth:`admit` and never held (its operation ended while the
        deferral was recorded) goes back to the quota."""
        self.quotas[provider].release()

    def give_back(self, op_id: str, provider: str) -> bool:
        """``op_id`` will not poll (it ended, or was set aside): the future slot it holds, if
        any, goes back to the quota and the next waiting poll is woken. Returns whether it
        held one."""
        if op_id not in self.prepaid:
            return False
        quota = self.quotas.get(provider)
        if quota is not None:
            quota.release()
        self._unreserve(op_id, provider)
        return True

    def share(self, provider: str, who: str) -> int:
        """How many future slots one registrant may hold: the next :data:`FAIR_HORIZON` of
        the quota, split among the registrants that hold or wait for slots."""
        waiting = self._waiting.get(provider, {})
        active = (
            {r for r, n in self._reserved.get(provider, {}).items() if n}
            | {r for r, q in waiting.items() if q}
            | {who}
        )
        rate = self.quotas[provider].rate
        return max(1, math.ceil(rate * FAIR_HORIZON / len(active)))

    # -- a slot for any request -------------------------------------------------------------

    def generation(self, provider: str) -> int:
        """How many times ``provider``'s limits were set: a request that slept for a slot
        taken under other limits takes one again."""
        return self.generations.get(provider, 0)

    def quota_wait(self, provider: str) -> float:
        """Take a slot of ``provider``'s quota (a submit, fetch or cancel): the seconds until
        it (0 for now; None of a provider with no profile is 0 too)."""
        quota = self.quotas.get(provider)
        return quota.reserve() if quota is not None else 0.0

    def spacing_wait(self, provider: str) -> float:
        """The seconds a request about to leave waits so requests leave spaced (the pacer)."""
        pacer = self.pacers.get(provider)
        return pacer.reserve() if pacer is not None else 0.0

    # -- the queues -------------------------------------------------------------------------

    def _enqueue(self, provider: str, who: str, op_id: str) -> None:
        queues = self._waiting.setdefault(provider, {})
        queue = queues.setdefault(who, collections.deque())
        if op_id not in self._queued:
            queue.append(op_id)
            self._queued.add(op_id)

    def _unreserve(self, op_id: str, provider: str) -> None:
        """A reserved slot was used (or given back): count it off and wake the next poll."""
        who = self.prepaid.pop(op_id, None)
        self._prepaid_provider.pop(op_id, None)
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
                if not self.is_live(op_id):
                    continue
                if queue:
                    queues[who] = queue  # to the back of the line: the next one's turn
                self._dispatched.add(op_id)
                self.wake(op_id)
                return


@dataclass(eq=False)
class Member:
    """One engine using a :class:`SharedPacing`: how to ask about and wake its operations."""

    is_live: Callable[[str], bool]
    wake: Callable[[str], None]
    live: Callable[[], Mapping[str, int]]  # live operations per provider


#: What a provider may use while it has no slice of the installation's quota: nothing.
CLOSED = Limits(0.0, 1, 0)


class SharedPacing(Pacing):
    """One pacing for every engine (shard supervisor) in a process.

    Each engine's poller :meth:`attach`-es itself; operation ids are unique across the
    shards, so a queued poll is asked about and woken through the one engine that has it
    live. Every engine loads the same profiles: a profile's limits are set once and changed
    only when they change (in place, never starting the counters afresh, so engines loading
    profiles one after another cannot open a fresh burst each).

    Without slices the process keeps within the profiles' limits. With ``sliced`` (a node of
    a sharded installation) it keeps within the smaller of the profile and the node's slice
    (:meth:`set_slice`, from :class:`daemon.shards.quota.QuotaExchange`): a provider is
    closed until its first slice, and again once a slice is not renewed before it expires.
    """

    def __init__(
        self, *, sliced: bool = False, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(monotonic=monotonic, is_live=self._member_is_live, wake=self._wake)
        self.sliced = sliced
        self.members: list[Member] = []
        self.profiles: dict[str, Limits] = {}  # provider -> the profile's limits
        self.effective: dict[str, Limits] = {}  # provider -> the limits in force
        self._slices: dict[str, Limits] = {}
        self._until: dict[str, float] = {}  # provider -> monotonic end of its slice

    def attach(
        self,
        is_live: Callable[[str], bool],
        wake: Callable[[str], None],
        live: Callable[[], Mapping[str, int]],
    ) -> Member:
        member = Member(is_live, wake, live)
        self.members.append(member)
        return member

    def detach(self, member: Member) -> None:
        """An engine stops: the future slots its operations hold go back to the quota, and
        its polls leave the queues (an operation of a shard that comes back to this process
        queues afresh under its new engine)."""
        mine = [op_id for op_id in self.prepaid if member.is_live(op_id)]
        self.members.remove(member)
        for op_id in mine:
            self.give_back(op_id, self._prepaid_provider[op_id])
        for queues in self._waiting.values():
            for who, queue in list(queues.items()):
                kept = [op_id for op_id in queue if self._member_is_live(op_id)]
                self._queued.difference_update(op_id for op_id in queue if op_id not in kept)
                if kept:
                    queues[who] = collections.deque(kept)
                else:
                    del queues[who]
        self._dispatched = {op_id for op_id in self._dispatched if self._member_is_live(op_id)}

    def live(self) -> dict[str, int]:
        """Live operations per provider over every attached engine."""
        total: collections.Counter[str] = collections.Counter()
        for member in self.members:
            total.update(member.live())
        return dict(total)

    def configure(self, provider: str, rate: float, burst: int, max_in_flight: int = 8) -> None:
        limits = Limits(rate, burst, max_in_flight)
        if self.profiles.get(provider) == limits:
            return
        self.profiles[provider] = limits
        if provider not in self.quotas:
            super().configure(provider, rate, burst, max_in_flight)
        self._apply(provider)

    def set_slice(self, provider: str, piece: Limits, until: float) -> None:
        """This node's slice of ``provider``'s quota, in force until ``until`` (monotonic)."""
        self._slices[provider] = piece
        self._until[provider] = until
        if provider in self.profiles:
            self._apply(provider)

    def is_open(self, provider: str) -> bool:
        if provider in self._closed:
            return False
        if self.sliced and self.monotonic() >= self._until.get(provider, math.inf):
            self._apply(provider)  # the slice ran out: closed
            return provider not in self._closed
        return True

    def _apply(self, provider: str) -> None:
        profile = self.profiles[provider]
        limits = profile
        if self.sliced:
            piece = self._slices.get(provider)
            if piece is None or self.monotonic() >= self._until.get(provider, -math.inf):
                limits = CLOSED
            else:
                limits = Limits(
                    min(profile.rate, piece.rate),
                    min(profile.burst, max(1, piece.burst)),
                    min(profile.in_flight, piece.in_flight),
                )
        if self.effective.get(provider) != limits:
            self.effective[provider] = limits
            self.set_limits(provider, limits)

    def _member_is_live(self, op_id: str) -> bool:
        return any(member.is_live(op_id) for member in self.members)

    def _wake(self, op_id: str) -> None:
        for member in self.members:
            if member.is_live(op_id):
                member.wake(op_id)
                return
