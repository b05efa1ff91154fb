"""One timer heap for every wake-up (not one sleeping task per operation).

Deadlines and ``next_poll_at`` are UTC wall-clock times (persisted); sleeps use the monotonic
clock. A wall-clock time is turned into a monotonic due time when it is scheduled, so a wall
clock that jumps back never makes anything due early, and one that jumps forward is noticed by
``decide`` (which reads the wall-clock ``now``) at the next wake-up.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

import anyio


class TimerHeap:
    """Keys scheduled at monotonic times; rescheduling a key replaces its earlier entry.

    One entry per key is a ``(due, key)`` tuple in the heap and ``key -> due`` in a dict (the
    same float object): an entry is current while the dict still maps its key to its due time,
    so a superseded entry needs no token of its own to be recognised (100,000 keys cost about
    130 bytes each). Two entries of one key due at the same time are one wake-up: the first
    popped takes the key out of the dict, the second finds it gone.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._heap: list[tuple[float, str]] = []
        self._current: dict[str, float] = {}
        self._changed = anyio.Event()
        self._monotonic = monotonic

    def __len__(self) -> int:
        return len(self._current)

    def schedule(self, key: str, due: float) -> None:
        entry = (due, key)
        self._current[key] = due
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._changed.set()

    def cancel(self, key: str) -> None:
        self._current.pop(key, None)

    def pop_due(self, now: float) -> list[tuple[str, float]]:
        """Every key due at ``now`` (monotonic), with its due time, in due order."""
        out = []
        current = self._current
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if current.get(key) == due:
                del current[key]
                out.append((key, due))
        return out

    def next_due(self) -> float | None:
        heap, current = self._heap, self._current
        while heap and current.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # drop superseded entries
        return heap[0][0] if heap else None

    async def wait(self) -> list[tuple[str, float]]:
        """Sleep until something is due (or an earlier timer is added), then return it."""
        while True:
            now = self._monotonic()
            due = self.pop_due(now)
            if due:
                return due
            nxt = self.next_due()
            self._changed = anyio.Event()
            with anyio.move_on_after(None if nxt is None else max(0.0, nxt - now)):
                await self._changed.wait()


#: Requests are spaced this much wider than ``1 / rate``: the milliseconds between a request
#: taking its slot and reaching the provider vary (an append, a busy event loop), and 5% (50 ms
#: in every second) keeps that variation from putting ``rate + 1`` requests into one second at
#: the provider, for 5% of the quota's throughput.
QUOTA_GUARD = 0.05


class RateQuota:
    """A provider's request quota shared by all its operations: GCRA, the generic cell rate
    algorithm (a leaky bucket kept as one "theoretical arrival time").

    The promise: with ``burst = 1`` (the default) requests are spaced at least ``interval``
    apart, so no window of ``L`` seconds holds more than ``ceil(rate * L)`` of them (no second
    more than ``rate``). With ``burst = B`` up to ``B`` may go at once after a quiet spell, and
    a window of ``L`` seconds holds at most ``B - 1 + ceil(rate * L)``.

    ``reserve`` always takes a slot: now (returns 0) or in the future (returns the seconds until
    it). A caller given a future slot records a ``local_quota`` delay and sends at that time
    without reserving again, so fifty operations due at once are spread out, not sent in waves.
    """

    def __init__(
        self, rate: float, burst: int = 1, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.interval = (1.0 + QUOTA_GUARD) / rate
        self._tolerance = (self.burst - 1) * self.interval
        self._monotonic = monotonic
        self._tat = monotonic()  # when the next request would conform with no burst used

    def retune(self, rate: float, burst: int) -> None:
        """Change the rate and burst while running, keeping the slots already handed out.

        The promise holds for the new figures from the last slot taken before the change:
        the next slot is spaced the new interval after that one, wider for a lowered rate,
        narrower for a raised one (the bound above only needs each slot spaced ``interval``
        after the one before)."""
        interval = (1.0 + QUOTA_GUARD) / rate
        self._tat += interval - self.interval
        self.rate = rate
        self.burst = max(1, burst)
        self.interval = interval
        self._tolerance = (self.burst - 1) * self.interval

    def reserve(self) -> float:
        now = self._monotonic()
        tat = max(self._tat, now)
        self._tat = tat + self.interval
        wait = tat - self._tolerance - now
        return wait if wait > 1e-9 else 0.0  # float noise in (B - 1) * interval is no wait

    def seed(self, sent: list[float]) -> None:
        """Count requests sent before this quota existed (monotonic times, by the previous
        process or node), so a restart or a takeover does not open a fresh burst on top of
        what the provider saw in the last window."""
        tat = self._tat
        for at in sorted(sent):
            tat = max(tat, at) + self.interval
        self._tat = max(self._tat, tat)

    def release(self) -> None:
        """Give back a slot that was reserved but not used (the poll was not sent)."""
        self._tat = max(self._monotonic(), self._tat - self.interval)
