"""A point in a log up to which everything was verified: where a later check may resume.

The writer keeps one for its head (updated only after a write is durable), and a state
snapshot stores the one it was taken at. Verification and reading can then start at the
position instead of at the genesis record -- but only after :func:`matches` has confirmed
that the record the position names is still there, byte for byte, at the place it names.
Anything else (a rewritten, rotated, truncated or different log) is a mismatch, and the caller
goes back to reading the whole log.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from eventlog.envelope import decode_record, record_hash
from eventlog.segments import segment_name


class LogPosition(msgspec.Struct, frozen=True, kw_only=True):
    """The head record and what verification knew about the chain there.

    Attributes:
        log_id: The log's id.
        seq: The head record's sequence number.
        hash: The head record's hash.
        segment: The index of the segment file holding it.
        line_start: Where its line starts in that file.
        end: The offset just past its newline.
        last_cp_seq: The last checkpoint at or before it, if any.
        last_cp_hash: That checkpoint's hash (zeros if none).
        checkpoint_every: The checkpoint spacing the signed genesis record promises.
        unsigned_run: Event and recovery records since that checkpoint.
        format: The genesis record's format (2 one signing key, 3 epoch keys).
        epoch, epoch_key, epoch_cert_seq, epoch_t_us, epoch_checkpoints: format 3: the epoch
            in force at the head, its certified public key (base64), the record that
            certified it, when it began, and the checkpoints signed in it so far.
        lease_epoch: The lease epoch the last takeover record took (0: none), which the next
            one must exceed.
    """

    log_id: str
    seq: int
    hash: str
    segment: int
    line_start: int
    end: int
    last_cp_seq: int | None
    last_cp_hash: str
    checkpoint_every: int
    unsigned_run: int
    format: int = 2
    epoch: int = 0
    epoch_key: str = ""
    epoch_cert_seq: int = 0
    epoch_t_us: int = 0
    epoch_checkpoints: int = 0
    lease_epoch: int = 0


def mismatch(log_dir: Path, pos: LogPosition) -> str | None:
    """Why ``pos`` does not name a record of the log at ``log_dir``; None when it does."""
    path = log_dir / segment_name(pos.segment)
    length = pos.end - pos.line_start
    if length <= 1 or pos.line_start < 0:
        return "the position names no line"
    try:
        with path.open("rb") as f:
            f.seek(pos.line_start)
            data = f.read(length)
    except FileNotFoundError:
        return f"segment {path.name} is gone"
    if len(data) != length or not data.endswith(b"\n"):
        return f"{path.name} is shorter than the position (offset {pos.end})"
    line = data[:-1]
    try:
        rec = decode_record(line)
    except (msgspec.DecodeError, ValueError):
        return f"no record starts at {path.name} offset {pos.line_start}"
    if rec.seq != pos.seq or rec.log != pos.log_id or record_hash(line) != pos.hash:
        return (
            f"the record at {path.name} offset {pos.line_start} is not record {pos.seq} "
            f"with hash {pos.hash[:16]}…"
        )
    return None
