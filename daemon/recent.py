"""Results remembered while their key is in use, then let go.

:class:`RecentResults` stands in for ``functools.lru_cache`` where the keys come and go with
operations (a status URL lives as long as its operation is polled): an LRU of fixed size keeps
the keys of operations long retired until it fills, so its memory grows with every operation
that ever ended, up to the bound (about 0.5 KiB per operation for the HTTP shell's two URL
caches, issue 38). Here a key is kept while it was used within the last ``seconds`` to
``2 * seconds``: two generations, the older dropped at each turn, a key used in it moved to the
newer. Memory follows the keys in use recently, not the number ever seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RecentResults(Generic[K, V]):
    """``get(key)`` is ``compute(key)``, remembered while ``key`` is in use (see the module
    docstring). ``most`` bounds the newer generation too (a turn comes early when it fills),
    so at most ``2 * most`` are held whatever the rate of new keys."""

    def __init__(
        self,
        compute: Callable[[K], V],
        *,
        seconds: float,
        most: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._compute = compute
        self._seconds = seconds
        self._most = most
        self._clock = clock
        self._new: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self._turn_at = clock() + seconds

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def get(self, key: K) -> V:
        try:
            return self._new[key]
        except KeyError:
            pass
        now = self._clock()
        if now >= self._turn_at or len(self._new) >= self._most:
            self._old, self._new = self._new, {}
            self._turn_at = now + self._seconds
        value = self._old.pop(key) if key in self._old else self._compute(key)
        self._new[key] = value
        return value
