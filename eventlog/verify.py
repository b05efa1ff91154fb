"""Offline verification of a log: no secret key, only the public verify key.

Checks, record by record: the genesis record and its signer fingerprint; sequence continuity;
each record's link to the hash of the one before; the log id on every record; the segment chain
(every segment after the first opens with a segment record naming its index and the previous
segment's last hash, and each file's name matches the index it holds); every checkpoint's
Ed25519 signature (in canonical base64) and its link to the previous checkpoint; an optional
anchor (a sequence number and hash kept elsewhere).

The first damage found is reported with its class, a sequence number, segment and byte offset.
The sequence number is the first position in the chain that is not intact (for ``duplicated``:
the number of the record that appears again). Classes:
    modified        a record's bytes changed (including its own sequence number), or a line does
                    not parse as a record; when a link breaks, the record before the link is named
    missing         records absent (a gap in sequence numbers), or a checkpoint linking to a
                    checkpoint that is not in the log
    reordered       records present but out of order
    duplicated      a record repeated
    spliced         a record carrying another log's id
    bad_signature   a checkpoint whose signature is missing or does not verify, or a log signed
                    by another key
    segment_link    a segment file missing, emptied, renamed, out of order, or joined to another
    truncated       the log ends before the given anchor
A torn tail (an incomplete final line, trailing zero bytes, or an empty newest segment file, at
the very end of the last segment) is a crash artifact, reported separately: the writer
quarantines it on next open. The verdict does not depend on who holds the writer lock: a
partial last line under a held lock is re-read for a moment, and only a line that a writer
completes meanwhile counts as work in progress. A line longer than the longest record
(:data:`~eventlog.envelope.MAX_LINE_BYTES`) is damage, found reading in bounded chunks.

Seal records (see :mod:`eventlog.envelope`) are chained records to this verifier: their MACs
need the writer's key. A log whose last record is not a seal, a checkpoint or the genesis is
noted: records no seal covers, which the writer quarantines on its next open.

Theory of operation (speed): most of a log is intact, so the log is cut into newline-aligned
units of a few MB, and each unit is first checked by a fast path that does the per-record work
with C-level ``map`` calls (decode, hash, link, sequence, signatures) and either proves the unit
intact, returning a small summary of its boundary (first seq and link, last hash, checkpoints),
or gives up. Summaries are joined in order, checking every boundary link. From the first unit
the fast path gives up on, the slow path re-reads line by line, and it alone names and
classifies damage, so both paths accept exactly the same logs. With ``jobs > 1`` the fast path
runs in forked worker processes.
"""

from __future__ import annotations

import base64
import binascii
import gc
import multiprocessing
import operator
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate, compress, pairwise, repeat
from pathlib import Path
from typing import BinaryIO

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from eventlog.envelope import (
    FORMAT_SINGLE_KEY,
    FORMAT_VERSION,
    MAX_LINE_BYTES,
    READABLE_FORMATS,
    RECORD_DECODER,
    ZERO_HASH,
    Checkpoint,
    EventRecord,
    Genesis,
    Record,
    Recovery,
    Seal,
    Segment,
    checkpoint_message,
    checkpoint_message_v2,
    checkpoint_takeover,
    decode_record,
    genesis_message,
    genesis_message_v3,
    record_hash,
    record_hashes,
)
from eventlog.keys import VerifyKey, fingerprint
from eventlog.lock import holder_pid, writer_alive
from eventlog.nodekeys import ChainEnd, check_chain
from eventlog.position import LogPosition, mismatch
from eventlog.segments import Line, list_segments, segment_name, split_lines

_CHUNK_BYTES = 1024 * 1024  # the slow path's read size
_LIVE_WAIT = 0.5  # seconds a partial last line under a held lock may take to be completed

EXIT_INTACT = 0
EXIT_DAMAGED = 1
EXIT_TORN = 3

#: Told (records checked, bytes checked, bytes to check) as verification goes.
Progress = Callable[[int, int, int], None]

UNIT_BYTES = 4 * 1024 * 1024  # fast-path work unit
PARALLEL_MIN_BYTES = 16 * 1024 * 1024  # below this, forking workers costs more than it saves


@dataclass(frozen=True)
class Damage:
    kind: str
    seq: int | None
    segment: str
    offset: int
    detail: str


@dataclass(frozen=True)
class TornTail:
    segment: Path
    offset: int
    length: int
    seq: int  # the sequence number the torn record would have had


@dataclass(frozen=True)
class ChainStart:
    """Where a log directory's chain picks up when its first segments were archived: the
    state after record ``seq`` (the last one archived, in segment ``segments``), as the
    verification of the archive left it or as the boundary's signed checkpoint gives it
    (:mod:`eventlog.boundary`). Segment files numbered ``segments`` or below, still in the
    directory after an interrupted archive, are left out: they are the archive's."""

    segments: int
    log_id: str
    seq: int
    hash: str
    last_cp_seq: int | None
    last_cp_hash: str
    checkpoint_every: int
    unsigned_run: int
    format: int = FORMAT_SINGLE_KEY
    epoch: int = 0
    epoch_key: str = ""
    epoch_cert_seq: int = 0
    epoch_t_us: int = 0
    epoch_checkpoints: int = 0
    lease_epoch: int = 0


@dataclass
class Report:
    log_dir: Path
    log_id: str = ""
    records: int = 0
    segments: int = 0
    checkpoints: int = 0
    head_seq: int = -1
    head_hash: str = ZERO_HASH
    last_checkpoint_seq: int | None = None
    last_checkpoint_hash: str = ZERO_HASH
    last_checkpoint_t_us: int | None = None
    clean_close: bool = False
    unsigned_tail: int = 0
    writer_live: bool = False
    writer_pid: int | None = None
    last_segment: Path | None = None
    last_segment_index: int = 0
    last_segment_good_size: int = 0
    head_offset: int = 0  # where the head record's line starts in last_segment
    checkpoint_every: int = 0  # the spacing the signed genesis record promises
    unsigned_run: int = 0  # event and recovery records since the last checkpoint
    #: (segment ordinal, offset) just past the last record authentic without the MAC key:
    #: the genesis, the last checkpoint, or the position verification resumed from.
    trusted_end: tuple[int, int] = (1, 0)
    head_sealed: bool = False  # the head is a seal, a checkpoint or the genesis record
    damage: Damage | None = None
    torn: TornTail | None = None
    resumed_at: int | None = None  # the record verification resumed after, if it did
    notes: list[str] = field(default_factory=list)
    #: The genesis record's format: 2 one signing key, 3 forward-secure epoch keys.
    format: int = FORMAT_SINGLE_KEY
    epoch: int = 0  # the epoch the log ends in (format 3; 0 in format 2)
    epoch_key: str = ""  # base64 of that epoch's public key, as certified
    epoch_cert_seq: int = 0  # the record that certified it (0: the genesis record)
    epoch_t_us: int = 0  # when that epoch began (the certifying record's time)
    epoch_checkpoints: int = 0  # checkpoints signed in it so far
    #: The root public key verified with (format 2 checks every checkpoint with it).
    root_key: bytes = field(default=b"", repr=False)
    #: (seq, lease epoch, holder) of every checkpoint that records a takeover (the log in
    #: PostgreSQL), in order; each takes a higher lease epoch than the one before.
    takeovers: list[tuple[int, int, str]] = field(default_factory=list)
    lease_epoch: int = 0  # the last takeover's (kept across a resume, unlike ``takeovers``)
    #: (seq, node, node key index, enrolled key) of every record signed by an enrolled node's
    #: key (the genesis of a log a node made, its takeover checkpoints: ``eventlog.nodekeys``);
    #: the enrolled key tells a node enrolled again (a new chain, from key 1) from the old one.
    node_signed: list[tuple[int, str, int, str]] = field(default_factory=list)
    #: Where the chain began when the log's first segments are archived (None: record 0).
    started_at: ChainStart | None = None
    segment_base: int = 0  # segments archived before the directory's first kept one

    def chain_start(self) -> ChainStart:
        """The state after this report's head, for verifying the segments that follow it in
        another directory (an archive, then the next archive or the live log)."""
        if self.damage is not None or self.head_seq < 0:
            raise ValueError(f"log {self.log_dir} has no intact head to go on from")
        return ChainStart(
            segments=_index_of(self.last_segment) if self.last_segment else 0,
            log_id=self.log_id,
            seq=self.head_seq,
            hash=self.head_hash,
            last_cp_seq=self.last_checkpoint_seq,
            last_cp_hash=self.last_checkpoint_hash,
            checkpoint_every=self.checkpoint_every,
            unsigned_run=self.unsigned_run,
            format=self.format,
            epoch=self.epoch,
            epoch_key=self.epoch_key,
            epoch_cert_seq=self.epoch_cert_seq,
            epoch_t_us=self.epoch_t_us,
            epoch_checkpoints=self.epoch_checkpoints,
            lease_epoch=self.lease_epoch,
        )

    def position(self) -> LogPosition:
        """Where a later verification of this log may resume (only for an intact report)."""
        if self.damage is not None or self.last_segment is None or self.head_seq < 0:
            raise ValueError(f"log {self.log_dir} has no intact head to resume from")
        return LogPosition(
            log_id=self.log_id,
            seq=self.head_seq,
            hash=self.head_hash,
            segment=_index_of(self.last_segment),
            line_start=self.head_offset,
            end=self.last_segment_good_size,
            last_cp_seq=self.last_checkpoint_seq,
            last_cp_hash=self.last_checkpoint_hash,
            checkpoint_every=self.checkpoint_every,
            unsigned_run=self.unsigned_run,
            format=self.format,
            epoch=self.epoch,
            epoch_key=self.epoch_key,
            epoch_cert_seq=self.epoch_cert_seq,
            epoch_t_us=self.epoch_t_us,
            epoch_checkpoints=self.epoch_checkpoints,
            lease_epoch=self.lease_epoch,
        )

    @property
    def verdict(self) -> str:
        if self.damage is not None:
            return "damaged"
        if self.torn is not None:
            return "torn_tail"
        return "intact"

    @property
    def exit_status(self) -> int:
        return {"damaged": EXIT_DAMAGED, "torn_tail": EXIT_TORN}.get(self.verdict, EXIT_INTACT)

    def summary(self) -> str:
        return (
            f"records={self.records} segments={self.segments} checkpoints={self.checkpoints} "
            f"head={self.head_seq}:{self.head_hash} verdict={self.verdict}"
        )


class _Found(Exception):
    def __init__(self, damage: Damage) -> None:
        self.damage = damage


def verify_log(
    log_dir: Path,
    verify_key: VerifyKey,
    *,
    anchor: tuple[int, str] | None = None,
    writer_live: bool | None = None,
    jobs: int = 1,
    resume: LogPosition | None = None,
    progress: Progress | None = None,
    start: ChainStart | None = None,
) -> Report:
    """Verify the whole log at ``log_dir``; never raises on damage, reports it.

    ``resume`` skips what an earlier verification proved: when the record it names is still
    in place (see :mod:`eventlog.position`), checking starts just after it, from what it
    recorded about the chain; otherwise the whole log is verified and a note says why.

    ``writer_live`` overrides the lock probe (the writer itself holds the lock when it verifies
    on open, and a live writer's partial last line is work in progress, not a torn tail).
    ``jobs`` > 1 checks large logs in that many forked worker processes (only fork from a
    single-threaded process, such as the ``bide verify`` command).

    ``progress`` is told, after each work unit of the fast path, the records checked so far
    and the bytes checked of the total (a display; it decides nothing).

    ``start``: the log's first segments were archived (:mod:`eventlog.boundary`); checking
    begins with segment ``start.segments + 1`` from the chain state it gives.
    """
    report = Report(log_dir=log_dir)
    if writer_live is None:  # None from writer_alive: not ours to look at; assume it runs
        writer_live = writer_alive(log_dir) is not False
    report.writer_live = writer_live
    report.writer_pid = holder_pid(log_dir) if report.writer_live else None
    segments = list_segments(log_dir)
    base = 0
    if start is not None:
        base = start.segments
        # Segment files are addressed by their index everywhere below (ordinal == index):
        # the archived ones are placeholders that are never read.
        kept = [s for s in segments if s[0] > base]
        segments = [(i, log_dir / segment_name(i)) for i in range(1, base + 1)] + kept
        report.segments = len(kept)
    else:
        report.segments = len(segments)
    report.segment_base = base
    if report.segments == 0:
        report.damage = Damage("missing", 0, "", 0, "no segment files: not a bide log, or empty")
        return report
    report.root_key = verify_key.raw
    begin = (1, 0)
    if start is not None:
        _adopt_start(report, start)
        begin = (base + 1, 0)
    if resume is not None and anchor is not None and anchor[0] <= resume.seq:
        report.notes.append("verified from the start: the anchor lies before the resume point")
    elif resume is not None and resume.seq > report.head_seq:
        begin = _resume(report, segments, resume) or begin
    elif (
        resume is not None
        and start is not None
        and (resume.seq, resume.hash)
        == (
            start.seq,
            start.hash,
        )
    ):
        report.resumed_at = resume.seq  # a snapshot taken at the archive boundary
    try:
        slow_from = _fast(report, verify_key, segments, anchor, jobs, begin, progress)
        if slow_from is not None:
            _slow(report, verify_key, segments, slow_from[0], slow_from[1], anchor)
        _finish(report, segments, anchor)
    except _Found as found:
        report.damage = found.damage
    return report


def _adopt_start(report: Report, start: ChainStart) -> None:
    """Fill ``report`` from the chain state before the log's first kept segment."""
    report.started_at = start
    report.log_id, report.head_seq, report.head_hash = start.log_id, start.seq, start.hash
    report.last_checkpoint_seq, report.last_checkpoint_hash = start.last_cp_seq, start.last_cp_hash
    report.checkpoint_every, report.unsigned_run = start.checkpoint_every, start.unsigned_run
    report.format, report.epoch, report.epoch_key = start.format, start.epoch, start.epoch_key
    report.epoch_cert_seq, report.epoch_t_us = start.epoch_cert_seq, start.epoch_t_us
    report.epoch_checkpoints, report.lease_epoch = start.epoch_checkpoints, start.lease_epoch
    report.last_segment = report.log_dir / segment_name(start.segments)
    report.last_segment_index = start.segments
    report.trusted_end, report.head_sealed = (start.segments + 1, 0), True


def _resume(
    report: Report, segments: list[tuple[int, Path]], pos: LogPosition
) -> tuple[int, int] | None:
    """Fill ``report`` from ``pos`` and return where to go on, or None (verify it all)."""
    ordinals = {index: ordinal for ordinal, (index, _) in enumerate(segments, start=1)}
    why = mismatch(report.log_dir, pos)
    if why is None and ordinals.get(pos.segment) != pos.segment:
        why = f"segment {pos.segment} is not where it was"
    if why is None and pos.format != FORMAT_SINGLE_KEY and not pos.epoch_key:
        why = "it does not name the epoch key in force there"
    if why is not None:
        report.notes.append(f"verified from the start: the resume point does not match ({why})")
        return None
    report.log_id, report.head_seq, report.head_hash = pos.log_id, pos.seq, pos.hash
    report.records = pos.seq + 1
    report.last_checkpoint_seq, report.last_checkpoint_hash = pos.last_cp_seq, pos.last_cp_hash
    report.checkpoint_every, report.unsigned_run = pos.checkpoint_every, pos.unsigned_run
    report.last_segment = segments[pos.segment - 1][1]
    report.last_segment_index = pos.segment
    report.last_segment_good_size, report.head_offset = pos.end, pos.line_start
    report.resumed_at = pos.seq
    report.trusted_end, report.head_sealed = (pos.segment, pos.end), True
    report.format, report.epoch, report.epoch_key = pos.format, pos.epoch, pos.epoch_key
    report.epoch_cert_seq, report.epoch_t_us = pos.epoch_cert_seq, pos.epoch_t_us
    report.epoch_checkpoints, report.lease_epoch = pos.epoch_checkpoints, pos.lease_epoch
    if pos.format == FORMAT_SINGLE_KEY:
        report.epoch_key = ""
    return pos.segment, pos.end


def _index_of(segment: Path) -> int:
    return int(segment.name[4:12])


# -- fast path ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Summary:
    """What an intact unit contributes to the chain, for joining it to its neighbours."""

    records: int
    first_seq: int
    first_prev: str
    log_id: str
    last_seq: int
    last_hash: str
    first_prev_cp: str | None  # the first checkpoint's link to the checkpoint before the unit
    checkpoints: int
    last_cp_seq: int | None
    last_cp_hash: str | None
    last_cp_t_us: int | None
    clean_close: bool  # the unit's last record is a final checkpoint
    last_offset: int  # byte offset of the unit's last line
    end: int  # byte offset just past the unit's last newline
    checkpoint_every: int  # from the genesis record, when the unit holds it; else 0
    lead: int  # signed-policy records (events, recoveries) before the unit's first checkpoint
    max_gap: int  # the most of them between two of the unit's checkpoints
    trail: int | None  # after its last checkpoint (None: the unit has no checkpoint)
    signed_end: int | None  # offset just past its last checkpoint or genesis record
    last_sealed: bool  # its last record is a seal, a checkpoint or the genesis record
    #: Its checkpoints, in order: their signatures are checked when units are joined, where
    #: the key of each one's epoch is known (the chain of certified epoch keys).
    cps: tuple[Checkpoint, ...] = ()
    genesis: Genesis | None = None  # the genesis record, when the unit holds it


_Unit = tuple[str, int, int, int]  # path, ordinal, start offset, end offset

_decode = RECORD_DECODER.decode  # the bound method: no Python frame per record
_seq = operator.attrgetter("seq")
_prev = operator.attrgetter("prev")
_log = operator.attrgetter("log")
_public_keys: dict[bytes, Ed25519PublicKey] = {}


def _fast(
    report: Report,
    verify_key: VerifyKey,
    segments: list[tuple[int, Path]],
    anchor: tuple[int, str] | None,
    jobs: int,
    begin: tuple[int, int],
    progress: Progress | None = None,
) -> tuple[int, int] | None:
    """Join the summaries of intact units; return (ordinal, offset) where the slow path starts."""
    units = plan_units(segments, begin)
    total = sum(u[3] - u[2] for u in units)
    told = _told(units, total, progress)
    args = [(u, verify_key.raw, anchor) for u in units]
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the fast path allocates many short-lived objects that hold no cycles
    try:
        if jobs > 1 and len(units) > 1 and total >= PARALLEL_MIN_BYTES:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(min(jobs, len(units)), mp_context=context) as pool:
                try:
                    return _join(report, units, told(pool.map(_check_unit_args, args)))
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        return _join(report, units, told(map(_check_unit_args, args)))
    finally:
        if gc_was_enabled:
            gc.enable()


def _told(
    units: list[_Unit], total: int, progress: Progress | None
) -> Callable[[Iterator[_Summary | None]], Iterator[_Summary | None]]:
    """Pass the units' summaries through, telling ``progress`` after each one (records and
    bytes checked in this run, not counting what a resume skipped)."""

    def tell(summaries: Iterator[_Summary | None]) -> Iterator[_Summary | None]:
        done, records = 0, 0
        for (_, _, start, end), summary in zip(units, summaries, strict=True):
            yield summary
            done += end - start
            if progress is not None and summary is not None:
                records += summary.records
                progress(records, done, total)

    return tell


def plan_units(
    segments: list[tuple[int, Path]], begin: tuple[int, int], unit_bytes: int = UNIT_BYTES
) -> list[_Unit]:
    """Newline-aligned units of about ``unit_bytes`` covering the segment files from ``begin``
    (an ordinal and an offset in that file)."""
    units: list[_Unit] = []
    for ordinal, (_, path) in enumerate(segments, start=1):
        if ordinal < begin[0]:
            continue
        size = path.stat().st_size
        first = begin[1] if ordinal == begin[0] else 0
        if first and first >= size:
            continue
        cuts = [first]
        with path.open("rb") as f:
            pos = first + unit_bytes
            while pos < size:
                cut = _newline_after(f, pos)
                if cut is None or cut >= size:
                    break
                cuts.append(cut)
                pos = cut + unit_bytes
        cuts.append(size)
        units += [(str(path), ordinal, a, b) for a, b in pairwise(cuts)]
    return units


def _newline_after(f: BinaryIO, pos: int) -> int | None:
    """The offset just past the first newline at or after ``pos``; None if there is none."""
    f.seek(pos)
    while True:
        block = f.read(65536)
        if not block:
            return None
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)


def _join(
    report: Report, units: list[_Unit], summaries: Iterator[_Summary | None]
) -> tuple[int, int] | None:
    for (path, ordinal, start, _), s in zip(units, summaries, strict=True):
        if s is None or s.first_seq != report.head_seq + 1 or s.first_prev != report.head_hash:
            return ordinal, start
        if s.first_seq == 0:
            report.log_id = s.log_id
        elif s.log_id != report.log_id:
            return ordinal, start
        if s.first_prev_cp is not None and s.first_prev_cp != report.last_checkpoint_hash:
            return ordinal, start
        if s.first_seq == 0:
            assert s.genesis is not None
            _adopt_genesis(report, s.genesis)
        run = report.unsigned_run + s.lead
        if _over(report, run) or _over(report, s.max_gap):
            return ordinal, start  # the slow path names the unsigned run
        if not _cps_ok(report, s.cps):
            return ordinal, start  # the slow path names the checkpoint that does not verify
        report.unsigned_run = run if s.trail is None else s.trail
        if s.signed_end is not None:
            report.trusted_end = (ordinal, s.signed_end)
        report.head_sealed = s.last_sealed
        report.records += s.records
        report.head_seq, report.head_hash = s.last_seq, s.last_hash
        if s.checkpoints:
            report.checkpoints += s.checkpoints
            assert s.last_cp_hash is not None
            report.last_checkpoint_seq = s.last_cp_seq
            report.last_checkpoint_hash = s.last_cp_hash
            report.last_checkpoint_t_us = s.last_cp_t_us
        report.clean_close = s.clean_close
        report.last_segment = Path(path)
        report.last_segment_index = ordinal
        report.last_segment_good_size = s.end
        report.head_offset = s.last_offset
    return None


def _check_unit_args(args: tuple[_Unit, bytes, tuple[int, str] | None]) -> _Summary | None:
    unit, raw_key, anchor = args
    gc.disable()  # in a worker process; the parent disabled it for itself
    return _check_unit(unit, raw_key, anchor)


def unit_lines(unit: _Unit, unit_bytes: int = UNIT_BYTES) -> list[bytes] | None:
    """A unit's lines, without their newlines; None where it holds an overlong line (the slow
    path names it, reading in bounded chunks) or does not end in a whole line."""
    path, _, start, end = unit
    if end - start > unit_bytes + MAX_LINE_BYTES:
        return None
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not data.endswith(b"\n") or len(data) != end - start:
        return None
    return data[:-1].split(b"\n")


def _check_unit(unit: _Unit, raw_key: bytes, anchor: tuple[int, str] | None) -> _Summary | None:
    """Prove one unit intact on its own, or return None (the slow path will say why)."""
    path_text, ordinal, start, end = unit
    path = Path(path_text)
    lines = unit_lines(unit)
    if lines is None:
        return None
    try:
        recs: list[Record] = list(map(_decode, lines))
    except (msgspec.DecodeError, ValueError):
        return None
    n = len(recs)
    kinds = list(map(type, recs))
    first = recs[0]
    if start == 0:
        if ordinal == 1:
            if not (
                isinstance(first, Genesis)
                and first.format in READABLE_FORMATS
                and first.signer == fingerprint(raw_key)
                and path.name == segment_name(1)
                and _genesis_ok(raw_key, first)
            ):
                return None
        elif not (
            isinstance(first, Segment)
            and first.index == ordinal
            and path.name == segment_name(ordinal)
        ):
            return None
        if kinds.count(Genesis) + kinds.count(Segment) != 1:
            return None
    elif Genesis in kinds or Segment in kinds:
        return None
    logs = set(map(_log, recs))
    if len(logs) != 1:
        return None
    log_id = logs.pop()
    first_seq = first.seq
    if list(map(_seq, recs)) != list(range(first_seq, first_seq + n)):
        return None
    hashes = record_hashes(lines)
    prevs: list[str] = list(map(_prev, recs))
    if prevs[1:] != hashes[:-1]:
        return None
    first_prev_cp: str | None = None
    cp_hash: str | None = None
    cp_index = -1
    for i in compress(range(n), map(operator.is_, kinds, repeat(Checkpoint))):
        cp = recs[i]
        assert isinstance(cp, Checkpoint)
        if cp_hash is None:
            first_prev_cp = cp.prev_cp
        elif cp.prev_cp != cp_hash:
            return None
        cp_hash, cp_index = hashes[i], i
    if (
        anchor is not None
        and first_seq <= anchor[0] < first_seq + n
        and hashes[anchor[0] - first_seq] != anchor[1]
    ):
        return None
    last = recs[-1]
    cp_last = recs[cp_index] if cp_index >= 0 else None
    counted = list(accumulate(map(_SIGNED_POLICY.__contains__, kinds)))
    cps = [i for i, k in enumerate(kinds) if k is Checkpoint]
    if cps:
        lead = counted[cps[0]]
        max_gap = max((counted[b] - counted[a] for a, b in pairwise(cps)), default=0)
        trail: int | None = counted[-1] - counted[cps[-1]]
    else:
        lead, max_gap, trail = counted[-1], 0, None
    signed = [i for i, k in enumerate(kinds) if k is Checkpoint or k is Genesis]
    signed_end = start + sum(map(len, lines[: signed[-1] + 1])) + signed[-1] + 1 if signed else None
    return _Summary(
        records=n,
        first_seq=first_seq,
        first_prev=first.prev,
        log_id=log_id,
        last_seq=last.seq,
        last_hash=hashes[-1],
        first_prev_cp=first_prev_cp,
        checkpoints=kinds.count(Checkpoint),
        last_cp_seq=cp_last.seq if cp_last is not None else None,
        last_cp_hash=cp_hash,
        last_cp_t_us=cp_last.t_us if isinstance(cp_last, Checkpoint) else None,
        clean_close=isinstance(last, Checkpoint) and last.final,
        last_offset=end - 1 - len(lines[-1]),
        end=end,
        checkpoint_every=first.checkpoint_every if isinstance(first, Genesis) else 0,
        lead=lead,
        max_gap=max_gap,
        trail=trail,
        signed_end=signed_end,
        last_sealed=isinstance(last, _SEALING),
        cps=tuple(r for r in recs if isinstance(r, Checkpoint)),
        genesis=first if isinstance(first, Genesis) else None,
    )


#: The records a writer must cover with a signed checkpoint within ``checkpoint_every``.
_SIGNED_POLICY = frozenset({EventRecord, Recovery})
#: Records that end a write of the writer: what comes after them and no seal is unauthenticated.
_SEALING = (Seal, Checkpoint, Genesis)


def _over(report: Report, run: int) -> bool:
    """Whether ``run`` unsigned records break the genesis record's signed promise (+1 slack
    for a recovery record written on open before the next checkpoint)."""
    return report.checkpoint_every > 0 and run > report.checkpoint_every + 1


def _key_bytes(text: str) -> bytes | None:
    """A public key in canonical base64 (32 bytes), or None."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 32 or base64.b64encode(raw).decode("ascii") != text:
        return None
    return raw


def _adopt_genesis(report: Report, genesis: Genesis) -> None:
    """What a verified genesis record says about the rest of the log."""
    report.log_id = genesis.log
    report.checkpoint_every = genesis.checkpoint_every
    report.format = genesis.format
    report.epoch_cert_seq = 0
    report.epoch_checkpoints = 0
    report.node_signed = []
    if genesis.format == FORMAT_SINGLE_KEY:
        report.epoch, report.epoch_key, report.epoch_t_us = 0, "", 0
    else:
        report.epoch, report.epoch_key = 1, genesis.epoch_key
        report.epoch_t_us = genesis.t_us
        if genesis.cert is not None:
            cert = genesis.cert
            report.node_signed.append((0, cert.node, 1 + len(genesis.links), cert.key))


def _cps_ok(report: Report, cps: tuple[Checkpoint, ...]) -> bool:
    """Whether ``cps`` (consecutive checkpoints after the report's head) verify, each under
    its epoch's key; on success the report's epoch state moves past them."""
    state = (
        report.epoch,
        report.epoch_key,
        report.epoch_cert_seq,
        report.epoch_t_us,
        report.epoch_checkpoints,
        report.lease_epoch,
    )
    takeovers, node_signed = len(report.takeovers), len(report.node_signed)
    for cp in cps:
        if _cp_problem(report, cp) is not None:
            (
                report.epoch,
                report.epoch_key,
                report.epoch_cert_seq,
                report.epoch_t_us,
                report.epoch_checkpoints,
                report.lease_epoch,
            ) = state
            del report.takeovers[takeovers:]
            del report.node_signed[node_signed:]
            return False
        _advance_epoch(report, cp)
    return True


def _advance_epoch(report: Report, cp: Checkpoint) -> None:
    """Move the report past a checkpoint that verified: its takeover, its epoch key."""
    if cp.lease_epoch or cp.holder:
        report.takeovers.append((cp.seq, cp.lease_epoch, cp.holder))
        report.lease_epoch = cp.lease_epoch
    if cp.cert is not None:
        report.node_signed.append((cp.seq, cp.cert.node, 1 + len(cp.links), cp.cert.key))
    if report.format == FORMAT_SINGLE_KEY:
        return
    if cp.next_key:
        report.epoch += 1
        report.epoch_key = cp.next_key
        report.epoch_cert_seq, report.epoch_t_us, report.epoch_checkpoints = cp.seq, cp.t_us, 0
    else:
        report.epoch_checkpoints += 1


def _cp_problem(report: Report, cp: Checkpoint) -> str | None:
    """Why checkpoint ``cp`` does not verify at the report's epoch; None when it does."""
    if (cp.lease_epoch or cp.holder) and cp.lease_epoch <= report.lease_epoch:
        return (
            f"checkpoint {cp.seq} records a takeover at lease epoch {cp.lease_epoch}, "
            f"not above the last one the log recorded ({report.lease_epoch}): lease "
            f"epochs only grow, so one of the two was forged or replayed"
        )
    if report.format == FORMAT_SINGLE_KEY:
        if cp.epoch or cp.next_key or cp.cert is not None or cp.links:
            return (
                "a format-2 (single-key) log holds a checkpoint with epoch fields: it was "
                "forged or altered"
            )
        return (
            None
            if _signature_ok(report.root_key, report.log_id, cp)
            else "checkpoint signature does not verify: records before it were changed, or the "
            "checkpoint was forged"
        )
    cert = (
        "the genesis record"
        if report.epoch_cert_seq == 0
        else f"checkpoint {report.epoch_cert_seq}"
    )
    if cp.epoch != report.epoch:
        return (
            f"checkpoint {cp.seq} claims epoch {cp.epoch}, but the log is in epoch "
            f"{report.epoch} (its key certified by {cert}): it was forged or altered"
        )
    if cp.cert is not None or cp.links:
        return _node_cp_problem(report, cp)
    key = _key_bytes(report.epoch_key)
    next_key = _key_bytes(cp.next_key) if cp.next_key else b""
    if key is None or next_key is None or not _signature_v2_ok(key, report.log_id, cp, next_key):
        if cp.holder:
            return (
                f"takeover checkpoint {cp.seq} (by {cp.holder!r}) verifies neither under the "
                f"epoch-{report.epoch} key certified by {cert} nor as a node's: it carries no "
                f"node certificate, so the key that signed it was never enrolled (bide node "
                f"enroll), or the records before it were changed"
            )
        return (
            f"checkpoint {cp.seq} does not verify under the epoch-{report.epoch} key "
            f"certified by {cert}: records before it were changed and re-signed with "
            f"another key (a key of a later epoch cannot sign an earlier one), or the "
            f"checkpoint was forged"
        )
    return None


def _node_use_problem(report: Report, end: ChainEnd, what: str) -> str | None:
    """A node key used again: each signs one record, then is destroyed (eventlog.nodekeys)."""
    for seq, node, index, enrolled in reversed(report.node_signed):
        if (node, enrolled) == (end.node, end.enrolled) and index >= end.index:
            return (
                f"{what} is signed by node {end.node!r}'s key {end.index}, but record {seq} "
                f"was already signed by its key {index}: a node key signs once and is then "
                f"destroyed, so this one is a kept copy or a replay of an old chain"
            )
    return None


def _node_cp_problem(report: Report, cp: Checkpoint) -> str | None:
    """A checkpoint signed by a node key (a node taking the log): its certificate, its key
    chain, the key's single use, and the signature over the next epoch's key."""
    what = f"checkpoint {cp.seq}"
    end = check_chain(report.root_key, cp.cert, cp.links)
    if isinstance(end, str):
        return f"{what} is signed by a node key, but {end}"
    if cp.holder and cp.holder.split("/", 1)[0] != end.node:
        return (
            f"{what} records a takeover by {cp.holder!r} but is signed by node "
            f"{end.node!r}'s key: it was forged or altered"
        )
    problem = _node_use_problem(report, end, what)
    if problem is not None:
        return problem
    if cp.epoch != report.epoch or not cp.next_key:
        return (
            f"{what} is signed by node {end.node!r} but does not start the log's next epoch "
            f"(epoch {cp.epoch}, the log is in {report.epoch}): it was forged or altered"
        )
    next_key = _key_bytes(cp.next_key)
    if next_key is None or not _signature_v2_ok(end.key, report.log_id, cp, next_key):
        return (
            f"{what} does not verify under node {end.node!r}'s key {end.index} (certified "
            f"from its enrolment): records before it were changed, or it was forged"
        )
    return None


def _genesis_node_problem(raw_key: bytes, genesis: Genesis) -> str | None:
    """Why a node-signed genesis record's chain does not hold (None: it does, or the genesis
    is the root's)."""
    if genesis.cert is None and not genesis.links:
        return None
    end = check_chain(raw_key, genesis.cert, genesis.links)
    return end if isinstance(end, str) else None


def _signature_v2_ok(key: bytes, log_id: str, cp: Checkpoint, next_key: bytes) -> bool:
    public = _public_keys.get(key)
    if public is None:
        public = _public_keys[key] = Ed25519PublicKey.from_public_bytes(key)
    try:
        sig = base64.b64decode(cp.sig, validate=True)
        if base64.b64encode(sig).decode("ascii") != cp.sig:
            return False
        message = checkpoint_message_v2(
            log_id,
            cp.seq,
            cp.prev,
            cp.t_us,
            cp.prev_cp,
            cp.final,
            cp.epoch,
            next_key,
            checkpoint_takeover(cp),
        )
        public.verify(sig, message)
    except (InvalidSignature, binascii.Error, ValueError, struct.error, OverflowError):
        return False
    return True


def _genesis_ok(raw_key: bytes, genesis: Genesis) -> bool:
    """The genesis signature verifies, over the spacing it promises (at least one), and in
    format 3 over the epoch-1 key it certifies."""
    if genesis.checkpoint_every < 1:
        return False
    if genesis.format == FORMAT_SINGLE_KEY and genesis.epoch_key:
        return False
    epoch_key = b""
    if genesis.format != FORMAT_SINGLE_KEY:
        key = _key_bytes(genesis.epoch_key)
        if key is None:
            return False
        epoch_key = key
    signing_key = raw_key
    if genesis.cert is not None or genesis.links:
        if genesis.format == FORMAT_SINGLE_KEY:
            return False
        end = check_chain(raw_key, genesis.cert, genesis.links)
        if isinstance(end, str):
            return False
        signing_key = end.key
    public = _public_keys.get(signing_key)
    if public is None:
        public = _public_keys[signing_key] = Ed25519PublicKey.from_public_bytes(signing_key)
    try:
        if genesis.format == FORMAT_SINGLE_KEY:
            message = genesis_message(
                genesis.log, genesis.format, genesis.signer, genesis.t_us, genesis.checkpoint_every
            )
        else:
            message = genesis_message_v3(
                genesis.log, genesis.signer, genesis.t_us, genesis.checkpoint_every, epoch_key
            )
        sig = base64.b64decode(genesis.sig, validate=True)
        if base64.b64encode(sig).decode("ascii") != genesis.sig:
            return False
        public.verify(sig, message)
    except (InvalidSignature, ValueError, binascii.Error, struct.error):
        return False
    return True


def _signature_ok(raw_key: bytes, log_id: str, cp: Checkpoint) -> bool:
    """Whether ``cp`` carries a canonical base64 signature that verifies under ``raw_key``."""
    public = _public_keys.get(raw_key)
    if public is None:
        public = _public_keys[raw_key] = Ed25519PublicKey.from_public_bytes(raw_key)
    try:
        sig = base64.b64decode(cp.sig, validate=True)
        if base64.b64encode(sig).decode("ascii") != cp.sig:
            return False  # a non-canonical encoding: its unused bits were changed
        message = checkpoint_message(
            log_id, cp.seq, cp.prev, cp.t_us, cp.prev_cp, cp.final, checkpoint_takeover(cp)
        )
        public.verify(sig, message)
    except (InvalidSignature, binascii.Error, ValueError, struct.error, OverflowError):
        return False
    return True


# -- slow path: line by line, names and classifies the first damage ----------------------------


def _slow(
    report: Report,
    verify_key: VerifyKey,
    segments: list[tuple[int, Path]],
    start_ordinal: int,
    start_offset: int,
    anchor: tuple[int, str] | None,
) -> None:
    pending: Line | None = None
    last_ordinal = len(segments)
    for ordinal in range(start_ordinal, last_ordinal + 1):
        path = segments[ordinal - 1][1]
        offset = start_offset if ordinal == start_ordinal else 0
        if offset == 0 and path.stat().st_size == 0:
            if pending is not None:
                raise _Found(
                    _at(
                        pending,
                        report.head_seq + 1,
                        "modified",
                        "record is cut short before the end of the log",
                    )
                )
            if ordinal == last_ordinal:
                pending = Line(path, ordinal, 0, b"", False, True)
                continue
            raise _Found(
                Damage(
                    "segment_link",
                    report.head_seq + 1,
                    path.name,
                    0,
                    f"segment file {path.name} is empty (its records were removed)",
                )
            )
        for line in _read_lines(report, path, ordinal, offset):
            expected = report.head_seq + 1
            if pending is not None:
                # A fragment followed by more data is not at the very end: damage.
                raise _Found(
                    _at(
                        pending,
                        expected,
                        "modified",
                        "record is cut short (no newline) before the end of the log",
                    )
                )
            if not line.complete or not line.data.strip(b"\x00"):
                if ordinal == last_ordinal:
                    pending = line
                    continue
                raise _Found(_at(line, expected, "modified", "incomplete or zeroed line"))
            _check_line(report, verify_key, line, anchor)
    if pending is not None:
        if report.writer_live and _completed_meanwhile(segments, pending, report.segment_base):
            report.notes.append("a writer is appending: its partial last line was not read")
            return
        report.torn = TornTail(
            pending.segment, pending.offset, len(pending.data), report.head_seq + 1
        )
        if report.writer_live:
            report.notes.append(
                f"the writer lock is held (pid {holder_pid(report.log_dir)}), but the partial "
                f"last line did not change for {_LIVE_WAIT} s: a torn tail, not a write in "
                f"progress"
            )


class _Overlong(Exception):
    def __init__(self, offset: int) -> None:
        self.offset = offset


def _read_lines(report: Report, path: Path, ordinal: int, offset: int) -> Iterator[Line]:
    """The lines of ``path`` from ``offset`` (a line start), read in bounded chunks: memory
    stays about :data:`MAX_LINE_BYTES` however large and hostile the file."""
    try:
        yield from _chunked_lines(path, ordinal, offset)
    except _Overlong as too_long:
        raise _Found(
            Damage(
                "modified",
                report.head_seq + 1,
                path.name,
                too_long.offset,
                f"a line of more than {MAX_LINE_BYTES} bytes (the longest record "
                f"the writer makes) without a newline: not a record",
            )
        ) from None


def _chunked_lines(path: Path, ordinal: int, offset: int) -> Iterator[Line]:
    pending: list[bytes] = []
    pending_len = 0
    with path.open("rb") as f:
        f.seek(offset)
        while chunk := f.read(_CHUNK_BYTES):
            if chunk.find(b"\n") < 0:
                pending.append(chunk)
                pending_len += len(chunk)
                if pending_len > MAX_LINE_BYTES:
                    raise _Overlong(offset)
                continue
            if pending:
                pending.append(chunk)
                chunk = b"".join(pending)
                pending, pending_len = [], 0
            parts = chunk.split(b"\n")
            tail = parts.pop()
            for part in parts:
                if len(part) > MAX_LINE_BYTES:
                    raise _Overlong(offset)
                yield Line(path, ordinal, offset, part, True, offset == 0)
                offset += len(part) + 1
            if tail:
                pending, pending_len = [tail], len(tail)
    if pending:
        yield Line(path, ordinal, offset, b"".join(pending), False, offset == 0)


def _completed_meanwhile(segments: list[tuple[int, Path]], pending: Line, base: int = 0) -> bool:
    """Whether a writer completes the partial last line ``pending`` (or starts another
    segment) within :data:`_LIVE_WAIT`: a live writer finishes a write in milliseconds, while
    a torn tail stays as it is whoever holds the lock."""
    end = pending.offset + len(pending.data)
    deadline = time.monotonic() + _LIVE_WAIT
    while True:
        try:
            size = pending.segment.stat().st_size
        except FileNotFoundError:
            return True  # cut by a writer that opened the log meanwhile
        now = [s for s in list_segments(pending.segment.parent) if s[0] > base]
        if size != end or len(now) != len(segments) - base:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _check_line(
    report: Report, verify_key: VerifyKey, line: Line, anchor: tuple[int, str] | None
) -> None:
    expected = report.head_seq + 1
    prev = report.head_hash
    try:
        rec = decode_record(line.data)
    except (msgspec.DecodeError, ValueError) as exc:
        raise _Found(_unparsable(line, expected, exc)) from None
    name = line.segment.name
    if isinstance(rec, Genesis) and expected == 0:
        if rec.seq != 0 or rec.prev != ZERO_HASH:
            raise _Found(_at(line, 0, "modified", "genesis record with a sequence or link"))
        if name != segment_name(1):
            raise _Found(
                _at(
                    line,
                    0,
                    "segment_link",
                    f"the first segment file is named {name}, not {segment_name(1)}",
                )
            )
        if rec.format not in READABLE_FORMATS:
            raise _Found(
                _at(
                    line,
                    0,
                    "modified",
                    f"format version {rec.format}, this bide reads "
                    f"{FORMAT_SINGLE_KEY} to {FORMAT_VERSION}",
                )
            )
        if rec.signer != verify_key.fingerprint:
            raise _Found(
                _at(
                    line,
                    0,
                    "bad_signature",
                    f"log is signed by key {rec.signer[:16]}…, the verify key is "
                    f"{verify_key.fingerprint[:16]}… (wrong verify.pub, or the log "
                    f"was rewritten and re-signed)",
                )
            )
        if not _genesis_ok(verify_key.raw, rec):
            node = _genesis_node_problem(verify_key.raw, rec)
            raise _Found(
                _at(
                    line,
                    0,
                    "bad_signature",
                    f"the genesis record is signed by a node key: {node}"
                    if node
                    else "the genesis record's signature does not verify (its fields, "
                    "such as the checkpoint spacing it promises, were changed)",
                )
            )
        _adopt_genesis(report, rec)
        report.trusted_end = (line.ordinal, line.offset + len(line.data) + 1)
    elif expected == 0:
        raise _Found(_at(line, 0, "modified", "the log does not open with a genesis record"))
    else:
        if rec.log != report.log_id:
            raise _Found(
                _at(
                    line,
                    expected,
                    "spliced",
                    f"record (numbered {rec.seq}) belongs to log {rec.log}, not {report.log_id}",
                )
            )
        if line.first_in_segment and not isinstance(rec, Segment):
            raise _Found(
                _at(
                    line,
                    expected,
                    "segment_link",
                    f"segment {name} does not open with a segment record (a segment "
                    f"before it is missing or out of order)",
                )
            )
        if (
            isinstance(rec, Segment)
            and line.first_in_segment
            and (rec.index != line.ordinal or name != segment_name(rec.index))
        ):
            raise _Found(
                _at(
                    line,
                    expected,
                    "segment_link",
                    f"file {name} holds segment {rec.index}, expected "
                    f"{segment_name(line.ordinal)} (a segment is missing, renamed "
                    f"or out of order)",
                )
            )
        if rec.seq != expected:
            if rec.prev == prev:
                raise _Found(
                    _at(
                        line,
                        expected,
                        "modified",
                        f"record {expected} links to record {expected - 1} but is "
                        f"numbered {rec.seq} (its sequence number was altered)",
                    )
                )
            raise _Found(
                _classify_seq(report.log_dir, line, rec.seq, expected, report.segment_base)
            )
        if isinstance(rec, Genesis):
            raise _Found(_at(line, expected, "modified", "a genesis record after the start"))
        if isinstance(rec, Segment) and not line.first_in_segment:
            raise _Found(
                _at(
                    line,
                    expected,
                    "segment_link",
                    f"segment record for segment {rec.index} inside file {name} "
                    f"(segment files were joined)",
                )
            )
        if rec.prev != prev:
            assert report.last_segment is not None
            raise _Found(
                Damage(
                    "modified",
                    expected - 1,
                    report.last_segment.name,
                    report.head_offset,
                    f"record {expected - 1} does not hash to the link stored in "
                    f"record {expected} (at {name} offset {line.offset}): one of "
                    f"the two was altered",
                )
            )
    if isinstance(rec, Checkpoint):
        problem = _cp_problem(report, rec)
        if problem is not None:
            raise _Found(_at(line, rec.seq, "bad_signature", problem))
        if rec.prev_cp != report.last_checkpoint_hash:
            raise _Found(
                _at(
                    line,
                    rec.seq,
                    "missing",
                    "a correctly signed checkpoint links to a previous checkpoint "
                    "that is not in the log",
                )
            )
        _advance_epoch(report, rec)
        report.checkpoints += 1
        report.last_checkpoint_seq = rec.seq
        report.last_checkpoint_t_us = rec.t_us
        report.unsigned_run = 0
        report.trusted_end = (line.ordinal, line.offset + len(line.data) + 1)
    elif isinstance(rec, EventRecord | Recovery):
        report.unsigned_run += 1
        if _over(report, report.unsigned_run):
            raise _Found(
                _at(
                    line,
                    rec.seq,
                    "missing",
                    f"{report.unsigned_run} records without a signed checkpoint; the "
                    f"signed genesis promises one at least every "
                    f"{report.checkpoint_every} (checkpoints were removed)",
                )
            )
    elif not isinstance(rec, Segment | Genesis | Seal):  # pragma: no cover
        raise AssertionError(rec)
    h = record_hash(line.data)
    if isinstance(rec, Checkpoint):
        report.last_checkpoint_hash = h
    if anchor is not None and rec.seq == anchor[0] and h != anchor[1]:
        raise _Found(
            _at(
                line,
                rec.seq,
                "modified",
                f"record {rec.seq} hashes to {h}, the anchor says {anchor[1]} "
                f"(the log was rewritten or rolled back)",
            )
        )
    report.clean_close = isinstance(rec, Checkpoint) and rec.final
    report.head_sealed = isinstance(rec, _SEALING)
    report.records += 1
    report.head_seq = rec.seq
    report.head_hash = h
    report.last_segment = line.segment
    report.last_segment_index = line.ordinal
    report.last_segment_good_size = line.offset + len(line.data) + 1
    report.head_offset = line.offset


def _finish(
    report: Report, segments: list[tuple[int, Path]], anchor: tuple[int, str] | None
) -> None:
    last_cp_seq = report.last_checkpoint_seq
    report.unsigned_tail = report.head_seq - (last_cp_seq if last_cp_seq is not None else -1)
    if report.last_segment is None:
        report.last_segment = segments[-1][1]
        report.last_segment_index = len(segments)
    if anchor is not None and anchor[0] > report.head_seq:
        raise _Found(
            Damage(
                "truncated",
                report.head_seq + 1,
                report.last_segment.name,
                report.last_segment_good_size,
                f"the log ends at record {report.head_seq}, before the anchor "
                f"{anchor[0]}: records were cut from the end",
            )
        )
    if not report.clean_close and not report.writer_live and report.unsigned_tail:
        report.notes.append(
            f"{report.unsigned_tail} record(s) after the last signed checkpoint and no clean "
            f"close: the writer crashed, or the log was cut after that checkpoint "
            f"(check against an anchor kept elsewhere: --anchor SEQ:HASH)"
        )
    elif not report.clean_close and not report.writer_live:
        report.notes.append(
            "the log does not end with a clean-close checkpoint: the writer crashed, or records "
            "after the last checkpoint were cut (check against --anchor SEQ:HASH)"
        )
    if not report.head_sealed and not report.writer_live and report.head_seq >= 0:
        report.notes.append(
            f"the last record ({report.head_seq}) is not followed by a seal or checkpoint: "
            f"records the writer did not finish writing (a crash between two writes), or "
            f"appended by someone else; the daemon quarantines records no valid seal covers "
            f"on its next open"
        )


def _at(line_: Line, seq: int | None, kind: str, detail: str) -> Damage:
    return Damage(kind, seq, line_.segment.name, line_.offset, detail)


def _unparsable(line: Line, expected: int, exc: Exception) -> Damage:
    try:
        obj = msgspec.json.decode(line.data)
    except (msgspec.DecodeError, ValueError):
        obj = None
    if isinstance(obj, dict) and obj.get("kind") == "checkpoint" and "sig" not in obj:
        return _at(line, expected, "bad_signature", "checkpoint record without a signature")
    return _at(line, expected, "modified", f"line does not parse as a record ({exc})")


def _all_lines(log_dir: Path, base: int = 0) -> Iterator[Line]:
    kept = [s for s in list_segments(log_dir) if s[0] > base]
    for ordinal, (_, path) in enumerate(kept, start=base + 1):
        yield from split_lines(path, ordinal, path.read_bytes(), 0)


def _seq_of(data: bytes) -> int | None:
    try:
        return decode_record(data).seq
    except (msgspec.DecodeError, ValueError):
        return None


def _classify_seq(log_dir: Path, at: Line, seq: int, expected: int, base: int = 0) -> Damage:
    """Tell duplicated, reordered and missing records apart (only runs once damage is found).

    ``at`` carries ``seq`` where ``expected`` belongs, and does not link to the record before.
    """
    before = True
    for line in _all_lines(log_dir, base):
        if line.ordinal == at.ordinal and line.offset == at.offset:
            before = False
            continue
        if not line.complete:
            continue
        if before and seq < expected and _seq_of(line.data) == seq:
            if line.data == at.data:
                return _at(at, seq, "duplicated", f"record {seq} appears a second time")
            return _at(
                at,
                expected,
                "modified",
                f"a record numbered {seq} (not the one already read) where record "
                f"{expected} belongs",
            )
        if not before and line.data == at.data:
            return _at(
                at,
                seq,
                "duplicated",
                f"record {seq} appears here, where record {expected} belongs, and again later",
            )
    if seq < expected:  # pragma: no cover - the earlier record was read to get here
        return _at(at, expected, "modified", f"record numbered {seq} where {expected} belongs")
    for line in _all_lines(log_dir, base):
        if (
            (line.ordinal, line.offset) > (at.ordinal, at.offset)
            and line.complete
            and _seq_of(line.data) == expected
        ):
            return _at(at, expected, "reordered", f"record {expected} found after record {seq}")
    return _at(
        at,
        expected,
        "missing",
        f"records {expected}..{seq - 1} are missing"
        if seq - 1 > expected
        else f"record {expected} is missing",
    )


# -- for checking one checkpoint at a time (signed heads: ``eventlog.headchain``) --------------

#: Why checkpoint ``cp`` does not verify at the report's epoch (None when it does).
checkpoint_problem = _cp_problem
#: Move a report past a checkpoint that verified (its takeover, the key it certifies).
advance_epoch = _advance_epoch
#: Whether a genesis record's signature verifies under a raw root public key.
genesis_verifies = _genesis_ok
#: Take what a verified genesis record says (log id, format, epoch-1 key) into a report.
adopt_genesis = _adopt_genesis
