"""Where a log's records are durable: the writer's side of a store, and segment files as lines.

This is the part of the store interface the log writer uses (:class:`LineStore`); the whole
interface (the lease, following, the schema, export) is :mod:`eventlog.logstore`.

The writer (:mod:`eventlog.writer`) frames records and writes them to segment files, as it
always has. A *store* is where those same framed lines become durable beyond the host: each
write round's lines are handed to :meth:`LineStore.commit` (one transaction) after the local
``fdatasync`` and before any caller is told they are durable. The default store is the segment
files themselves (no ``LineStore``: the files are the truth, unchanged on disk); with
PostgreSQL (:mod:`eventlog.pgstore`) the database is the truth and the segment files are a
local copy any node can rebuild from it.

A line is stored with the segment index and byte offset it has in the file layout, so
:func:`write_segments` rebuilds segment files byte for byte (``bide log export``) and the
offline verifier checks them with no database at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventlog.envelope import record_hash
from eventlog.errors import DamagedLogError
from eventlog.fsync import fsync_dir, write_new_file
from eventlog.segments import (
    QUARANTINE_DIR,
    archived_start,
    iter_lines,
    list_segments,
    segment_name,
)


@dataclass(frozen=True)
class StoredLine:
    """One record's exact bytes (no newline) and where it sits in the segment layout."""

    seq: int
    segment: int  # the segment file's index (seg-00000001.jsonl is 1)
    offset: int  # the line's first byte in that file
    data: bytes

    @property
    def hash(self) -> str:
        return record_hash(self.data)


class LineStore(Protocol):
    """The durable home of a log's lines, one writer at a time."""

    def commit(self, lines: Sequence[StoredLine], prev_hash: str) -> None:
        """Make ``lines`` durable in one transaction, after the record whose hash is
        ``prev_hash``; returns only once they are. Raises
        :class:`~eventlog.errors.StoreError` (nothing committed, or unknown: the caller
        treats the round as failed and re-reads the store) or
        :class:`~eventlog.errors.FencedError` (another node holds the log)."""
        ...

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        """Up to ``limit`` lines with a sequence number above ``seq``, in order."""
        ...

    def save_snapshot(self, seq: int, record_hash: str, data: bytes) -> bool:
        """Keep a state snapshot's bytes (:mod:`eventlog.snapshot`) taken at record ``seq``
        (whose hash is ``record_hash``) for whichever node takes the log next; False when it
        was not kept (a newer one is there, or another node holds the log). Any thread: it
        does not use the writer's connection. Raises :class:`~eventlog.errors.StoreError`."""
        ...

    def load_snapshot(self) -> bytes | None:
        """The latest snapshot kept by :meth:`save_snapshot`, None when there is none."""
        ...


def file_lines(log_dir: Path) -> Iterator[StoredLine]:
    """The complete lines of a segment-file log, with their places (a torn final fragment is
    not a record and is left out); after an archive, from the first record it kept."""
    archived = archived_start(log_dir)
    base, first = (0, 0) if archived is None else (archived.segments, archived.seq + 1)
    kept = (line for line in iter_lines(log_dir) if int(line.segment.name[4:12]) > base)
    for seq, line in enumerate(kept, start=first):
        if not line.complete:
            return
        yield StoredLine(seq, int(line.segment.name[4:12]), line.offset, line.data)


def write_segments(lines: Iterable[StoredLine], log_dir: Path) -> int:
    """Write ``lines`` (in order, from record 0) as segment files under ``log_dir``, which must
    hold none yet; each file synced. Returns how many lines were written. Refuses lines whose
    places do not follow one another (a gap means a damaged store, never papered over)."""
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if any(p.name.startswith("seg-") for p in log_dir.iterdir()):
        raise DamagedLogError(f"{log_dir} already holds segment files; give an empty directory")
    fd = -1
    index, size, count = 0, 0, 0
    try:
        for line in lines:
            if line.seq != count:
                raise DamagedLogError(f"the store skips from record {count - 1} to {line.seq}")
            if line.segment != index:
                if line.segment != index + 1 or line.offset != 0:
                    raise DamagedLogError(
                        f"record {line.seq} is at segment {line.segment} offset {line.offset}, "
                        f"not at the start of segment {index + 1}"
                    )
                if fd >= 0:
                    os.fsync(fd)
                    os.close(fd)
                fd = os.open(
                    log_dir / segment_name(line.segment),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                    0o600,
                )
                index, size = line.segment, 0
            if line.offset != size:
                raise DamagedLogError(
                    f"record {line.seq} is at offset {line.offset} of segment "
                    f"{index}; the records before it end at {size}"
                )
            data = line.data + b"\n"
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            size += len(data)
            count += 1
    finally:
        if fd >= 0:
            os.fsync(fd)
            os.close(fd)
    fsync_dir(log_dir)
    return count


def place_lines(
    first_seq: int, lines: Sequence[bytes], segment: int, size: int, rotate_at: Sequence[int]
) -> list[StoredLine]:
    """Places of one write round's ``lines``: the first goes at ``size`` in ``segment``, and a
    new segment starts at each index in ``rotate_at`` (the writer's own layout)."""
    out: list[StoredLine] = []
    rotations = set(rotate_at)
    for i, data in enumerate(lines):
        if i in rotations:
            segment, size = segment + 1, 0
        out.append(StoredLine(first_seq + i, segment, size, data))
        size += len(data) + 1
    return out


def local_head(log_dir: Path) -> tuple[int, str] | None:
    """(seq, hash) of the last complete line of a local copy, None when it holds none; counts
    lines (it does not verify: the writer's open does)."""
    last: StoredLine | None = None
    for last in file_lines(log_dir):  # noqa: B007 - the last one is wanted
        pass
    return None if last is None else (last.seq, last.hash)


def cut_after(log_dir: Path, seq: int, record_hash: str) -> Path | None:
    """Cut a local copy back to record ``seq`` when that record is the one whose hash is
    ``record_hash``: what follows it (records a killed writer synced but never committed,
    so never acknowledged) is kept in ``quarantine/`` and removed from the segment files.
    Returns the quarantine file, or None (nothing changed) when the copy does not hold that
    record."""
    line = next((ln for ln in file_lines(log_dir) if ln.seq == seq), None)
    if line is None or line.hash != record_hash:
        return None
    segment = log_dir / segment_name(line.segment)
    cut_at = line.offset + len(line.data) + 1
    later = [p for i, p in list_segments(log_dir) if i > line.segment]
    with segment.open("rb") as f:
        f.seek(cut_at)
        tail = f.read()
    tail += b"".join(p.read_bytes() for p in later)
    qdir = log_dir / QUARANTINE_DIR
    qdir.mkdir(mode=0o700, exist_ok=True)
    kept = qdir / f"{segment.name}.{cut_at}.{time.time_ns()}.uncommitted"
    write_new_file(kept, tail)
    fsync_dir(qdir)
    fd = os.open(segment, os.O_WRONLY)
    try:
        os.ftruncate(fd, cut_at)
        os.fsync(fd)
    finally:
        os.close(fd)
    for p in later:
        p.unlink()
    fsync_dir(log_dir)
    return kept


def append_segments(lines: Iterable[StoredLine], log_dir: Path) -> int:
    """Append ``lines`` (which follow the copy's last record, at the places the store gives)
    to the local copy's segment files, each file synced; returns how many."""
    fd, index, count = -1, 0, 0
    try:
        for line in lines:
            if line.segment != index:
                if fd >= 0:
                    os.fsync(fd)
                    os.close(fd)
                path = log_dir / segment_name(line.segment)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                index = line.segment
            if os.fstat(fd).st_size != line.offset:
                raise DamagedLogError(
                    f"record {line.seq} belongs at offset {line.offset} of "
                    f"{segment_name(index)}, which ends elsewhere"
                )
            data = line.data + b"\n"
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            count += 1
    finally:
        if fd >= 0:
            os.fsync(fd)
            os.close(fd)
    if count:
        fsync_dir(log_dir)
    return count
