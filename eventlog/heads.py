"""Signed heads: what the daemon published, and how a log is judged against them.

A *head* is a signed checkpoint as others may keep it: the log id, the checkpoint's sequence
number and record hash, its epoch, its signature, its time, and the checkpoint record itself
(one clear-text line, ``cp``). Checkpoints link to the one before them (``prev_cp`` is its
record hash), so the checkpoint records between two heads prove, with no key, that the later
head extends the earlier one (:func:`extends`).

:class:`HeadStore` is the daemon's own memory of what it published: an append-only file of
heads in the state directory (``heads.jsonl``), one line per signed checkpoint, fsynced
before anything is sent to a witness. On open the writer refuses a log that ends before, or
forks from, the latest head in it (:func:`judge`): that is a log rolled back, cut, or
swapped, and continuing from it would silently rewrite what was already published.

Findings (also reported by ``bide verify --witness``):
    rolled_back   the log ends at a signed checkpoint older than a published head: an older
                  copy of the log, or one cut back exactly to an earlier checkpoint
    truncated     the log ends before a published head, with records no checkpoint signs
                  after its last checkpoint: its signed end was cut
    forked        the log holds a record at a published head's sequence number with another
                  hash, or is another log altogether
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from eventlog.envelope import Checkpoint, decode_record, record_hash
from eventlog.errors import DamagedLogError
from eventlog.segments import archived_start, list_segments

if TYPE_CHECKING:
    from eventlog.verify import Report

HEADS_FILE = "heads.jsonl"


class Head(msgspec.Struct, frozen=True, omit_defaults=True):
    """One published head; ``countersig``/``witness`` are set in a witness's state file."""

    log: str
    seq: int
    hash: str
    epoch: int
    sig: str
    t_us: int
    cp: str  # the checkpoint record line, as stored in the log
    countersig: str = ""
    witness: str = ""  # the witness key's fingerprint
    received_t_us: int = 0


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Head)


def encode_head(head: Head) -> bytes:
    return _encoder.encode(head)


def decode_head(line: bytes) -> Head:
    """Raises ``msgspec.DecodeError``/``ValidationError`` when ``line`` is no head."""
    return _decoder.decode(line)


def head_of(line: bytes) -> Head:
    """The head a checkpoint record line makes."""
    rec = decode_record(line)
    if not isinstance(rec, Checkpoint):
        raise ValueError(f"record {rec.seq} is not a checkpoint")
    return Head(
        rec.log, rec.seq, record_hash(line), rec.epoch, rec.sig, rec.t_us, line.decode("utf-8")
    )


def extends(held: Head | None, chain: Sequence[Head]) -> str | None:
    """Why the checkpoints ``chain`` (in order) do not extend ``held``; None when they do.

    Each checkpoint's ``prev_cp`` must be the record hash of the one before it, starting from
    ``held``; heads in ``chain`` at or before ``held`` must be ``held`` or lead to it. No key
    is needed: the links are record hashes.
    """
    prev = held
    for head in chain:
        try:
            rec = decode_record(head.cp.encode("utf-8"))
        except (msgspec.DecodeError, ValueError):
            return f"head {head.seq} carries no checkpoint record"
        if (
            not isinstance(rec, Checkpoint)
            or rec.seq != head.seq
            or rec.log != head.log
            or record_hash(head.cp.encode("utf-8")) != head.hash
        ):
            return f"head {head.seq} does not match the checkpoint record it carries"
        if prev is not None and head.log != prev.log:
            return f"head {head.seq} is of log {head.log}, not {prev.log}"
        if prev is not None and head.seq <= prev.seq:
            if head.seq == prev.seq and head.hash == prev.hash:
                continue  # sent again: already held
            if held is not None and prev is held:
                continue  # an older head than the one held: skipped, the chain must reach it
            return f"head {head.seq} does not follow head {prev.seq}"
        if prev is not None and rec.prev_cp != prev.hash:
            return (
                f"checkpoint {head.seq} links to checkpoint hash {rec.prev_cp[:16]}…, not "
                f"to the held head {prev.seq} ({prev.hash[:16]}…)"
            )
        prev = head
    return None


# -- the daemon's own record of what it published ---------------------------------------------


_TAIL = 64 * 1024  # holds well over a hundred heads


class HeadStore:
    """The append-only ``heads.jsonl`` in the state directory (see the module docstring).

    :meth:`record` is called by the writer's flusher thread once a write holding checkpoints
    is durable; listeners (the witness publisher) are then told, from that thread.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listeners: list[Callable[[Head], None]] = []
        self._lock = threading.Lock()
        #: (witness, the latest head it holds for the log about to open), gathered by
        #: ``bide run`` before the open: :meth:`check` holds the log to those too.
        self.witnessed: list[tuple[str, Head]] = []

    def add_listener(self, listener: Callable[[Head], None]) -> None:
        self._listeners.append(listener)

    def heads(self) -> list[Head]:
        """Every head in the file, in order; a torn last line (a crash) is skipped."""
        return read_heads(self.path)

    def read_from(self, offset: int) -> list[tuple[int, Head]]:
        """The heads whose lines start at byte ``offset`` or later, each with its line's
        offset: a reader that keeps its place reads only what is new, however long the file
        has grown (about 400 bytes a checkpoint)."""
        try:
            with self.path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return []
        out = []
        for line in data.split(b"\n")[:-1]:  # after the last newline: nothing, or torn
            if line.strip():
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    out.append((offset, decode_head(line)))
            offset += len(line) + 1
        return out

    def latest(self) -> Head | None:
        """The last complete head, read from the file's tail (not the whole file)."""
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - _TAIL)
                f.seek(start)
                tail = f.read()
        except FileNotFoundError:
            return None
        lines = tail.split(b"\n")[:-1]
        if start > 0:
            lines = lines[1:]  # the first may be the end of a line that starts earlier
        for line in reversed(lines):
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                return decode_head(line)
        if start == 0:
            return None
        every = self.heads()  # a tail with no whole head in it: read everything
        return every[-1] if every else None

    def record(self, lines: Iterable[bytes]) -> None:
        heads = [head_of(line) for line in lines]
        if not heads:
            return
        data = b"".join(encode_head(h) + b"\n" for h in heads)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)  # the file itself is 0600
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if _ends_torn(fd):
                    os.write(fd, b"\n")  # a crash tore the last line: start a fresh one
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        for head in heads:
            for listener in self._listeners:
                listener(head)

    def check(self, log_dir: Path, report: Report) -> None:
        """Refuse (:class:`RolledBackError`) a log behind or beside the latest head this
        daemon recorded, or behind the latest one a witness holds for it (``witnessed``)."""
        latest = self.latest()
        if latest is not None:
            finding = judge(log_dir, report, [latest])
            if finding is not None:
                raise RolledBackError(
                    f"log {log_dir} {finding.detail}; this daemon published head "
                    f"{latest.seq}:{latest.hash} of log {latest.log} (epoch {latest.epoch}), "
                    f"recorded in {self.path}. Refusing to continue from an older or "
                    f"different state ({finding.kind}): restore the log that holds that head. "
                    f"If the log was replaced on purpose, move {self.path} aside (witnesses "
                    f"keep the head and `bide verify --witness` will still report it)",
                    finding.kind,
                )
        for where, held in self.witnessed:
            finding = judge(log_dir, report, [held], other_log_is_fork=False)
            if finding is not None:
                raise RolledBackError(
                    f"log {log_dir} {finding.detail}; witness {where} holds head "
                    f"{held.seq}:{held.hash} of this log, which it accepted from this daemon. "
                    f"Refusing to continue from an older or different state ({finding.kind}): "
                    f"restore the log that holds that head (`bide verify --witness {where}` "
                    f"reports the same)",
                    finding.kind,
                )

    def check_empty(self, log_dir: Path) -> None:
        """Refuse to start a new log where this daemon already published another's heads."""
        latest = self.latest()
        if latest is not None:
            raise RolledBackError(
                f"log directory {log_dir} holds no log, but this daemon published head "
                f"{latest.seq}:{latest.hash} of log {latest.log} (recorded in {self.path}): "
                f"the log was removed. Restore it; to start a new log on purpose, move "
                f"{self.path} aside first",
                "truncated",
            )


class RolledBackError(DamagedLogError):
    """The log is behind, or forks from, a head already published."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _ends_torn(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def read_heads(path: Path) -> list[Head]:
    """The heads in a heads file or a witness state file; lines that are not heads (a torn
    last line) are skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            out.append(decode_head(line))
    return out


# -- judging a log against heads ---------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: str  # "rolled_back", "truncated" or "forked"
    head: Head  # the head the log fails
    detail: str


def hashes_at(log_dir: Path, seqs: Iterable[int]) -> dict[int, str]:
    """The record hashes at sequence numbers ``seqs`` of a verified log (record *n* is its
    line *n*, counting across segments, from the archive boundary when the log has one),
    read in one pass; records archived are not there."""
    wanted = sorted(set(seqs))
    out: dict[int, str] = {}
    if not wanted:
        return out
    archived = archived_start(log_dir)
    base, n = (0, 0) if archived is None else (archived.segments, archived.seq + 1)
    i = 0
    for index, path in list_segments(log_dir):
        if index <= base:
            continue
        with path.open("rb") as f:
            for line in f:
                while i < len(wanted) and wanted[i] < n:
                    i += 1
                if i >= len(wanted):
                    return out
                if wanted[i] == n and line.endswith(b"\n"):
                    out[n] = record_hash(line[:-1])
                n += 1
    return out


def judge(
    log_dir: Path, report: Report, heads: Sequence[Head], *, other_log_is_fork: bool = True
) -> Finding | None:
    """The first way the intact log at ``log_dir`` (``report``) fails ``heads``; None when it
    holds every one of them at its sequence number with the same hash.

    Heads of other logs are ignored, unless none is of this log and ``other_log_is_fork``
    (the daemon's own heads): then the log is another one than was published (``forked``).
    A witness may hold heads of many logs, so ``bide verify`` only notes that case."""
    mine = sorted((h for h in heads if h.log == report.log_id), key=lambda h: h.seq)
    if not mine:
        others = sorted({h.log for h in heads})
        if not others or not other_log_is_fork:
            return None
        head = max((h for h in heads), key=lambda h: h.t_us)
        return Finding(
            "forked",
            head,
            f"is log {report.log_id}, but the heads are of log "
            f"{', '.join(others)}: the log was swapped for another",
        )
    inside = [h for h in mine if h.seq <= report.head_seq]
    found = hashes_at(log_dir, (h.seq for h in inside))
    for h in inside:
        got = found.get(h.seq)
        if got != h.hash:
            return Finding(
                "forked",
                h,
                f"holds record {h.seq} with hash {got}, but head {h.seq} was "
                f"published with hash {h.hash}: the log forks from what was "
                f"published",
            )
    last = mine[-1]
    if last.seq > report.head_seq:
        if report.unsigned_tail == 0:
            return Finding(
                "rolled_back",
                last,
                f"ends at signed checkpoint {report.head_seq}, before published "
                f"head {last.seq}: it was rolled back to an earlier state",
            )
        return Finding(
            "truncated",
            last,
            f"ends at record {report.head_seq} ({report.unsigned_tail} record(s) "
            f"after its last checkpoint), before published head {last.seq}: its "
            f"signed end was cut",
        )
    return None
