"""The garbage collector paused while the log is folded into state (start-up, offline readers).

A fold builds hundreds of thousands of long-lived objects that hold no reference cycles
(operations, actions, decoded events); the allocations trigger full collections that scan
them all and free nothing, several times over. Paused, loading a snapshot or replaying a
log is several times faster. The collector is process-wide state, so the switch lives here
in the I/O shell and not in the pure model (``replay/``), which only folds.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside; the collector's previous setting restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
