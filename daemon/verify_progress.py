"""The progress line ``bide verify`` draws on a terminal while it checks a large log.

One line on stderr, redrawn in place (``\\r`` and erase-to-end-of-line) at most
:data:`REDRAW_SECONDS` apart: records checked, records per second, bytes checked of the
total and an estimate of the time left. Nothing is drawn when stderr is not a terminal (a
script, a pipe, a journal), and the line is erased before the report is printed, so the
report reads the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

REDRAW_SECONDS = 0.25  # at most four redraws a second
_ERASE = "\r\x1b[K"


def progress_text(records: int, done: int, total: int, elapsed: float, label: str = "") -> str:
    """What the line says after ``elapsed`` seconds: ``records`` checked, ``done`` bytes of
    ``total`` (of ``label``, a sharded log's "shard 3/16", when given)."""
    share = done / total if total else 1.0
    what = f"verifying {label}" if label else "verifying"
    text = f"{what}: {records:,} records, {_size(done)} of {_size(total)} ({share:.0%})"
    if elapsed <= 0 or done <= 0:
        return text
    left = elapsed * (total - done) / done
    when = "under 1 s" if left < 0.5 else f"about {_duration(left)}"
    return f"{text}, {records / elapsed:,.0f} records/s, {when} left"


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressLine:
    """Called with (records, bytes checked, bytes to check) as verification goes; draws the
    line when the last drawing is :data:`REDRAW_SECONDS` old. :meth:`close` erases it."""

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        every: float = REDRAW_SECONDS,
        label: str = "",
    ) -> None:
        self.stream = stream
        self.label = label
        self.clock = clock
        self.every = every
        self.started = clock()
        self.drawn_at: float | None = None

    def __call__(self, records: int, done: int, total: int) -> None:
        now = self.clock()
        if done >= total:
            return  # the report follows at once
        if self.drawn_at is not None and now - self.drawn_at < self.every:
            return
        self.drawn_at = now
        text = progress_text(records, done, total, now - self.started, self.label)
        self.stream.write(_ERASE + text)
        self.stream.flush()

    def close(self) -> None:
        if self.drawn_at is not None:
            self.stream.write(_ERASE)
            self.stream.flush()


def progress_line(stream: TextIO, label: str = "") -> ProgressLine | None:
    """A progress line on ``stream`` when it is a terminal; None (quiet) otherwise."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file behind it
        tty = False
    return ProgressLine(stream, label=label) if tty else None
