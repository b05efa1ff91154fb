"""Segment files of a log directory, and reading them as lines with their offsets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SEGMENT_RE = re.compile(r"^seg-(\d{8})\.jsonl$")
QUARANTINE_DIR = "quarantine"


def segment_name(index: int) -> str:
    return f"seg-{index:08d}.jsonl"


def list_segments(log_dir: Path) -> list[tuple[int, Path]]:
    """(index, path) of every segment file, sorted by the index in its name."""
    found = []
    for path in log_dir.iterdir():
        m = SEGMENT_RE.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    found.sort()
    return found


@dataclass(frozen=True)
class Line:
    """One line of a segment. ``complete`` is False for a final fragment with no newline."""

    segment: Path
    ordinal: int  # the segment's position in the sorted listing, from 1
    offset: int
    data: bytes
    complete: bool
    first_in_segment: bool


def iter_lines(log_dir: Path) -> Iterator[Line]:
    for ordinal, (_, path) in enumerate(list_segments(log_dir), start=1):
        data = path.read_bytes()
        yield from split_lines(path, ordinal, data, 0)


def split_lines(path: Path, ordinal: int, data: bytes, offset: int) -> Iterator[Line]:
    """The lines of ``data``, read from ``path`` at byte ``offset`` (a line start)."""
    parts = data.split(b"\n")
    last = len(parts) - 1
    for i, part in enumerate(parts):
        if i == last:
            if part:
                yield Line(path, ordinal, offset, part, False, offset == 0)
            return
        yield Line(path, ordinal, offset, part, True, offset == 0)
        offset += len(part) + 1
