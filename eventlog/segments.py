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


class ArchivedStart(msgspec.Struct, frozen=True):
    """What a log whose first segments were archived keeps of them (part of
    :class:`eventlog.boundary.Boundary`, read without checking anything)."""

    segments: int  # the last archived segment
    seq: int  # the last archived record
    genesis: str  # the genesis record's line
    checkpoint: str = ""  # the boundary checkpoint's line
    certs: list[str] = msgspec.field(default_factory=list)  # certifying checkpoints before it


def archived_start(log_dir: Path) -> ArchivedStart | None:
    """The archived beginning of a log; None for a log that starts at its genesis record
    (:mod:`eventlog.boundary` checks it)."""
    try:
        data = (log_dir / BOUNDARY_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(data, type=ArchivedStart)
    except msgspec.DecodeError:
        return None


def genesis_bytes(log_dir: Path) -> bytes | None:
    """The genesis record's line (no newline): the first line of the first segment, or the
    one the archive boundary keeps; None without one."""
    archived = archived_start(log_dir)
    if archived is not None:
        return archived.genesis.encode("utf-8")
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
