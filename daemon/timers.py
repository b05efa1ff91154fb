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


class RateQuota:
    """A provider's request-rate quota shared by all its operations (a token bucket).

    ``reserve`` always takes a slot: now (returns 0) or in the future (returns the seconds until
    it). A caller given a future slot records a ``local_quota`` delay and sends at that time
    without reserving again, so fifty operations due at once are spread out, not sent in waves.
    """

    def __init__(self, rate: float, burst: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._tokens = self.burst
        self._monotonic = monotonic
        self._at = monotonic()

    def reserve(self) -> float:
        now = self._monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0.0 else -self._tokens / self.rate

    def release(self) -> None:
        """Give back a slot that was reserved but not used (the poll was not sent)."""
        self._tokens = min(self.burst, self._tokens + 1.0)
