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
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

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
        self._reserved: dict[str, dict[str, int]] = {}  # provider -> registrant -> slots held
        self._waiting: dict[str, dict[str, collections.deque[str]]] = {}  # turns to come
        self._queued: set[str] = set()
        self._dispatched: set[str] = set()

    def configure(self, provider: str, rate: float, burst: int) -> None:
        """A provider's quota, new or changed (a profile loaded): both counters start afresh."""
        self.quotas[provider] = RateQuota(rate, burst, self.monotonic)
        self.pacers[provider] = RateQuota(rate, burst, self.monotonic)

    def queued(self, op_id: str) -> bool:
        """Whether ``op_id`` waits in its registrant's queue for a slot."""
        return op_id in self._queued

    def holds(self, op_id: str) -> bool:
        """Whether ``op_id`` holds a future slot (recorded as a ``local_quota`` delay)."""
        return op_id in self.prepaid

    # -- a slot for a poll ------------------------------------------------------------------

    def admit(self, op_id: str, provider: str, who: str) -> Admission:
        """A poll of ``op_id`` (registered by ``who``) asks to send its request now."""
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
