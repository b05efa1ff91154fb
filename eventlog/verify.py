"""Offline verification of a log: no secret key, only the public verify key.

Checks, record by record: the genesis record and its signer fingerprint; sequence continuity;
each record's link to the hash of the one before; the log id on every record; the segment chain
(every segment after the first opens with a segment record naming its index and the previous
segment's last hash); every checkpoint's Ed25519 signature and its link to the previous
checkpoint; an optional anchor (a sequence number and hash kept elsewhere).

The first damage found is reported with its class, sequence number, segment and byte offset.
Classes:
    modified        a record's bytes changed, or a line does not parse as a record
    missing         records absent (a gap in sequence numbers)
    reordered       records present but out of order
    duplicated      a record repeated
    spliced         a record carrying another log's id
    bad_signature   a checkpoint whose signature does not verify, or a log signed by another key
    segment_link    a segment file missing, renamed or out of order
    truncated       the log ends before the given anchor
A torn tail (an incomplete final line or trailing zero bytes at the very end of the last
segment) is a crash artifact, reported separately: the writer quarantines it on next open.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature

from eventlog.envelope import (
    FORMAT_VERSION,
    ZERO_HASH,
    Checkpoint,
    EventRecord,
    Genesis,
    Recovery,
    Segment,
    checkpoint_message,
    decode_record,
    record_hash,
)
from eventlog.keys import VerifyKey
from eventlog.lock import holder_pid, writer_alive
from eventlog.segments import Line, iter_lines, list_segments, segment_name

EXIT_INTACT = 0
EXIT_DAMAGED = 1
EXIT_TORN = 3


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
    damage: Damage | None = None
    torn: TornTail | None = None
    notes: list[str] = field(default_factory=list)

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
) -> Report:
    """Verify the whole log at ``log_dir``; never raises on damage, reports it.

    ``writer_live`` overrides the lock probe (the writer itself holds the lock when it verifies
    on open, and a live writer's partial last line is work in progress, not a torn tail).
    """
    report = Report(log_dir=log_dir)
    report.writer_live = writer_alive(log_dir) if writer_live is None else writer_live
    report.writer_pid = holder_pid(log_dir) if report.writer_live else None
    segments = list_segments(log_dir)
    report.segments = len(segments)
    if not segments:
        report.damage = Damage("missing", 0, "", 0, "no segment files: not a bide log, or empty")
        return report
    try:
        _scan(report, verify_key, segments, anchor)
    except _Found as found:
        report.damage = found.damage
    return report


def _scan(
    report: Report,
    verify_key: VerifyKey,
    segments: list[tuple[int, Path]],
    anchor: tuple[int, str] | None,
) -> None:
    expected_seq = 0
    prev = ZERO_HASH
    log_id = ""
    last_ordinal = len(segments)
    last_cp_seq: int | None = None
    pending: Line | None = None
    for line in iter_lines(report.log_dir):
        if pending is not None:
            # A fragment followed by more data is not at the very end: damage.
            raise _Found(_at(line_=pending, seq=expected_seq, kind="modified",
                             detail="record is cut short (no newline) before the end of the log"))
        if not line.complete or not line.data.strip(b"\x00"):
            if line.ordinal == last_ordinal:
                pending = line
                continue
            raise _Found(_at(line, expected_seq, "modified", "incomplete or zeroed line"))
        try:
            rec = decode_record(line.data)
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError) as exc:
            raise _Found(_at(line, expected_seq, "modified",
                             f"line does not parse as a record ({exc})")) from None
        # Kind and position.
        if isinstance(rec, Genesis):
            if line.ordinal != 1 or not line.first_in_segment:
                raise _Found(_at(line, rec.seq, "modified", "a genesis record after the start"))
            if rec.format != FORMAT_VERSION:
                raise _Found(_at(line, 0, "modified",
                                 f"format version {rec.format}, this bide reads {FORMAT_VERSION}"))
            if rec.signer != verify_key.fingerprint:
                raise _Found(_at(line, 0, "bad_signature",
                                 f"log is signed by key {rec.signer[:16]}…, the verify key is "
                                 f"{verify_key.fingerprint[:16]}… (wrong verify.pub, or the log "
                                 f"was rewritten and re-signed)"))
            log_id = rec.log
            report.log_id = log_id
        else:
            if expected_seq == 0:
                raise _Found(_at(line, rec.seq, "modified", "the log does not open with genesis"))
            if rec.log != log_id:
                raise _Found(_at(line, rec.seq, "spliced",
                                 f"record belongs to log {rec.log}, not {log_id}"))
            if line.first_in_segment != isinstance(rec, Segment):
                if line.first_in_segment:
                    raise _Found(_at(line, rec.seq, "segment_link",
                                     f"segment {line.segment.name} does not open with a "
                                     f"segment record (a segment before it is missing or "
                                     f"out of order)"))
                raise _Found(_at(line, rec.seq, "modified", "segment record inside a segment"))
            if isinstance(rec, Segment) and (
                rec.index != line.ordinal or line.segment.name != segment_name(rec.index)
            ):
                raise _Found(_at(line, rec.seq, "segment_link",
                                 f"file {line.segment.name} holds segment {rec.index}, expected "
                                 f"{segment_name(line.ordinal)} (a segment is missing, renamed "
                                 f"or out of order)"))
        # Sequence and link.
        if rec.seq != expected_seq:
            raise _Found(_classify_seq(report.log_dir, line, rec.seq, expected_seq))
        if rec.prev != prev:
            if line.first_in_segment and expected_seq > 0:
                raise _Found(_at(line, rec.seq, "segment_link",
                                 "segment does not link to the previous segment's last record"))
            raise _Found(_at(line, rec.seq - 1, "modified",
                             f"record {rec.seq - 1} does not hash to the link stored in record "
                             f"{rec.seq} (one of the two was altered)"))
        if isinstance(rec, Checkpoint):
            if rec.prev_cp != report.last_checkpoint_hash:
                raise _Found(_at(line, rec.seq, "missing",
                                 "checkpoint does not link to the previous checkpoint"))
            message = checkpoint_message(log_id, rec.seq, rec.prev, rec.t_us, rec.prev_cp,
                                         rec.final)
            try:
                verify_key.public.verify(_b64(rec.sig), message)
            except (InvalidSignature, ValueError):
                raise _Found(_at(line, rec.seq, "bad_signature",
                                 "checkpoint signature does not verify: records before it were "
                                 "changed, or the checkpoint was forged")) from None
            report.checkpoints += 1
            last_cp_seq = rec.seq
            report.last_checkpoint_t_us = rec.t_us
        elif not isinstance(rec, EventRecord | Recovery | Segment | Genesis):  # pragma: no cover
            raise AssertionError(rec)
        h = record_hash(line.data)
        if isinstance(rec, Checkpoint):
            report.last_checkpoint_hash = h
        report.clean_close = isinstance(rec, Checkpoint) and rec.final
        if anchor is not None and rec.seq == anchor[0] and h != anchor[1]:
            raise _Found(_at(line, rec.seq, "modified",
                             f"record {rec.seq} hashes to {h}, the anchor says {anchor[1]} "
                             f"(the log was rewritten or rolled back)"))
        prev = h
        expected_seq += 1
        report.records += 1
        report.head_seq = rec.seq
        report.head_hash = h
        report.last_segment = line.segment
        report.last_segment_index = line.ordinal
        report.last_segment_good_size = line.offset + len(line.data) + 1
    report.last_checkpoint_seq = last_cp_seq
    report.unsigned_tail = report.head_seq - (last_cp_seq if last_cp_seq is not None else -1)
    if pending is not None:
        if report.writer_live:
            report.notes.append("a writer is appending: its partial last line was not read")
        else:
            report.torn = TornTail(pending.segment, pending.offset, len(pending.data))
    if report.last_segment is None:
        report.last_segment = segments[-1][1]
        report.last_segment_index = len(segments)
    if anchor is not None and anchor[0] > report.head_seq:
        raise _Found(Damage("truncated", report.head_seq + 1, report.last_segment.name,
                            report.last_segment_good_size,
                            f"the log ends at record {report.head_seq}, before the anchor "
                            f"{anchor[0]}: records were cut from the end"))
    if not report.clean_close and not report.writer_live and report.unsigned_tail:
        report.notes.append(
            f"{report.unsigned_tail} record(s) after the last signed checkpoint and no clean "
            f"close: the writer crashed, or the log was cut after that checkpoint "
            f"(check against an anchor kept elsewhere: --anchor SEQ:HASH)"
        )


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _at(line_: Line, seq: int | None, kind: str, detail: str) -> Damage:
    return Damage(kind, seq, line_.segment.name, line_.offset, detail)


def _seq_of(data: bytes) -> int | None:
    try:
        return decode_record(data).seq
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
        return None


def _classify_seq(log_dir: Path, at: Line, seq: int, expected: int) -> Damage:
    """Tell duplicated, reordered and missing records apart (only runs once damage is found)."""
    if seq < expected:
        for line in iter_lines(log_dir):
            if line.complete and _seq_of(line.data) == seq:
                if line.data == at.data:
                    return _at(at, seq, "duplicated", f"record {seq} appears a second time")
                break
        return _at(at, seq, "reordered", f"record {seq} found after record {expected - 1}")
    later = False
    past = False
    for line in iter_lines(log_dir):
        if line is at or (line.segment == at.segment and line.offset == at.offset):
            past = True
            continue
        if past and line.complete and _seq_of(line.data) == expected:
            later = True
            break
    if later:
        return _at(at, expected, "reordered", f"record {expected} found after record {seq}")
    return _at(at, expected, "missing",
               f"records {expected}..{seq - 1} are missing" if seq - 1 > expected
               else f"record {expected} is missing")
