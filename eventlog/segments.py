"""Segment files of a log directory, and reading them as lines with their offsets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

SEGMENT_RE = re.compile(r"^seg-(\d{8})\.jsonl$")
QUARANTINE_DIR = "quarantine"
#: Where a log whose first segments were archived keeps its boundary (:mod:`eventlog.boundary`).
BOUNDARY_FILE = "archived.json"


class _Archived(msgspec.Struct):
    segments: int
    seq: int
    genesis: str


def archived_start(log_dir: Path) -> tuple[int, int, bytes] | None:
    """(last archived segment, last archived record, genesis record line) of a log whose
    first segments were archived; None for a log that starts at its genesis record. Read
    without checking anything (:mod:`eventlog.boundary` checks the boundary)."""
    try:
        data = (log_dir / BOUNDARY_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        got = msgspec.json.decode(data, type=_Archived)
    except msgspec.DecodeError:
        return None
    return got.segments, got.seq, got.genesis.encode("utf-8")


def genesis_bytes(log_dir: Path) -> bytes | None:
    """The genesis record's line (no newline): the first line of the first segment, or the
    one the archive boundary keeps; None without one."""
    archived = archived_start(log_dir)
    if archived is not None:
        return archived[2]
    try:
        with (log_dir / segment_name(1)).open("rb") as f:
            first = f.readline(1 << 16)
    except FileNotFoundError:
        return None
    return first.rstrip(b"\n") or None


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
