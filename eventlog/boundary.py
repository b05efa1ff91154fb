"""The archive boundary of a live log: where its chain starts once old segments are archived.

``bide log archive`` moves a log's oldest whole segments to an archive directory
(:mod:`eventlog.archive`). The live directory then no longer starts at the genesis record, so
it keeps one small file, ``archived.json`` (:data:`BOUNDARY_FILE`), written before any segment
is removed, that says where its chain picks up:

* the last archived segment and record (``segments``, ``seq``, ``hash``): the next segment
  file's first record links to ``hash``;
* the *boundary checkpoint*: the last signed checkpoint in the archived segments, as its
  record line, with the genesis record and every key-certifying (or takeover) checkpoint
  before it (a :class:`~eventlog.headchain.Proof`). Anyone with ``verify.pub`` checks the
  boundary checkpoint through that chain of certified keys, as a witness checks a head, and
  then the live log from it: the next checkpoint must link to it (``prev_cp``) and verify
  under the epoch key it leaves in force;
* what the signatures do not cover but the next checks need, as the archiver's verification
  of the archived records found it: the unsigned run after the boundary checkpoint, and the
  epoch's start time and checkpoint count;
* where the archived segments went (``archives``), for the operator and the auditor.

So the live log alone verifies from the boundary (``bide verify``), and an archive plus the
live log verify as one chain (``bide verify --archive DEST``), record 0 to the head. What a
signature cannot show, the live log alone does not claim: that the records before the
boundary still exist. That is the archive's check.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from eventlog.envelope import Checkpoint, Genesis, decode_record, record_hash
from eventlog.errors import DamagedLogError
from eventlog.fsync import fsync_dir, write_new_file
from eventlog.headchain import ChainError, Proof, advance, through
from eventlog.keys import VerifyKey
from eventlog.position import LogPosition
from eventlog.segments import BOUNDARY_FILE
from eventlog.verify import ChainStart, Damage, Progress, Report, verify_log

BOUNDARY_VERSION = 1


class ArchiveRef(msgspec.Struct, frozen=True, kw_only=True):
    """One archive that took segments from this log."""

    dest: str  # the archive directory, as given to `bide log archive`
    first_segment: int
    last_segment: int
    first_seq: int
    last_seq: int
    created_at: str


class Boundary(msgspec.Struct, frozen=True, kw_only=True):
    """What the live log keeps of its archived beginning (see the module docstring)."""

    version: int = BOUNDARY_VERSION
    log_id: str
    segments: int  # the last archived segment's index
    seq: int  # the last archived record
    hash: str  # its hash: the first live record links to it
    checkpoint: str  # the boundary checkpoint's record line
    genesis: str  # the genesis record's line
    certs: list[str] = msgspec.field(default_factory=list)  # certifying checkpoints before it
    unsigned_run: int = 0  # event and recovery records after the boundary checkpoint
    epoch_t_us: int = 0  # when the epoch in force began (format 3)
    epoch_checkpoints: int = 0  # checkpoints signed in it so far (format 3)
    archives: list[ArchiveRef] = msgspec.field(default_factory=list)

    @property
    def checkpoint_seq(self) -> int:
        return decode_record(self.checkpoint.encode("utf-8")).seq


_DECODER = msgspec.json.Decoder(Boundary)


def read_boundary(log_dir: Path) -> Boundary | None:
    """The log's boundary, None when nothing was archived from it."""
    try:
        data = (log_dir / BOUNDARY_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise DamagedLogError(
            f"{log_dir / BOUNDARY_FILE} does not parse ({exc}); it says where the live log "
            f"starts after `bide log archive`: restore it from the archive's manifest.json "
            f"(its `boundary` field)"
        ) from None


def write_boundary(log_dir: Path, boundary: Boundary) -> None:
    """Replace the boundary file atomically and durably (temporary file, fsync, rename,
    fsync of the directory)."""
    tmp = log_dir / f".{BOUNDARY_FILE}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    write_new_file(tmp, msgspec.json.format(msgspec.json.encode(boundary)) + b"\n")
    os.replace(tmp, log_dir / BOUNDARY_FILE)
    fsync_dir(log_dir)


def archived_through(log_dir: Path) -> int:
    """The index of the last archived segment of the log (0: none)."""
    boundary = read_boundary(log_dir)
    return 0 if boundary is None else boundary.segments


class BoundaryError(Exception):
    """A boundary whose checkpoint does not verify; the message says why."""


def start_from(boundary: Boundary, verify_key: VerifyKey) -> ChainStart:
    """The chain state after the archived records, once the boundary checkpoint verified
    through the genesis record and the certified keys (offline, with ``verify.pub``)."""
    try:
        cp = decode_record(boundary.checkpoint.encode("utf-8"))
        genesis = decode_record(boundary.genesis.encode("utf-8"))
    except (msgspec.DecodeError, ValueError):
        raise BoundaryError("the boundary checkpoint or genesis record does not parse") from None
    if not isinstance(cp, Checkpoint) or not isinstance(genesis, Genesis):
        raise BoundaryError("the boundary names no checkpoint, or no genesis record")
    if cp.log != boundary.log_id or genesis.log != boundary.log_id:
        raise BoundaryError(f"the boundary's records are not of log {boundary.log_id}")
    if cp.seq > boundary.seq:
        raise BoundaryError(
            f"the boundary checkpoint {cp.seq} lies after the last archived record {boundary.seq}"
        )
    try:
        state = through(verify_key.raw, Proof(boundary.genesis, boundary.certs), cp.seq)
        state = advance(state, verify_key.raw, boundary.checkpoint)
    except ChainError as exc:
        raise BoundaryError(f"the boundary checkpoint {cp.seq} does not verify: {exc}") from None
    cp_hash = record_hash(boundary.checkpoint.encode("utf-8"))
    if cp.seq == boundary.seq and cp_hash != boundary.hash:
        raise BoundaryError(
            f"the boundary's last record {boundary.seq} is its checkpoint, whose hash is not "
            f"the one it names"
        )
    return ChainStart(
        segments=boundary.segments,
        log_id=boundary.log_id,
        seq=boundary.seq,
        hash=boundary.hash,
        last_cp_seq=cp.seq,
        last_cp_hash=cp_hash,
        checkpoint_every=genesis.checkpoint_every,
        unsigned_run=boundary.unsigned_run,
        format=state.format,
        epoch=state.epoch,
        epoch_key=state.epoch_key,
        epoch_cert_seq=state.cert_seq,
        epoch_t_us=boundary.epoch_t_us,
        epoch_checkpoints=boundary.epoch_checkpoints,
        lease_epoch=state.lease_epoch,
    )


def verify_live(
    log_dir: Path,
    verify_key: VerifyKey,
    *,
    anchor: tuple[int, str] | None = None,
    writer_live: bool | None = None,
    jobs: int = 1,
    resume: LogPosition | None = None,
    progress: Progress | None = None,
) -> Report:
    """:func:`~eventlog.verify.verify_log` of a live log, from its archive boundary when it
    has one (its boundary checkpoint checked first, through the certified keys)."""
    boundary = read_boundary(log_dir) if log_dir.is_dir() else None
    start = None
    if boundary is not None:
        try:
            start = start_from(boundary, verify_key)
        except BoundaryError as exc:
            report = Report(log_dir=log_dir)
            report.damage = Damage("bad_signature", boundary.seq, BOUNDARY_FILE, 0, str(exc))
            return report
    report = verify_log(
        log_dir,
        verify_key,
        anchor=anchor,
        writer_live=writer_live,
        jobs=jobs,
        resume=resume,
        progress=progress,
        start=start,
    )
    if boundary is not None:
        report.notes.insert(0, boundary_note(boundary))
        if anchor is not None and anchor[0] <= boundary.seq:
            report.notes.append(
                f"the anchor (record {anchor[0]}) is archived: check it with --archive DEST"
            )
    return report


def boundary_note(boundary: Boundary) -> str:
    where = ", ".join(ref.dest for ref in boundary.archives) or "an archive"
    return (
        f"records 0..{boundary.seq} (segments 1..{boundary.segments}) are archived in "
        f"{where}; verified from the boundary checkpoint {boundary.checkpoint_seq}, signed "
        f"(check them with `bide verify --archive DEST`)"
    )
