"""Reading a log while a writer may be appending to it.

The reader yields only complete records (a line with its newline), checks sequence numbers and
hash links as it goes (a break raises :class:`DamagedLogError`), and decrypts event payloads
when given the keyring. It never writes and never takes the writer lock. ``follow`` waits for
new records with watchfiles (inotify) instead of polling the files. Signatures are the
auditor's business (``bide verify``); the reader trusts its own host's files to that extent.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import anyio
import msgspec
import watchfiles

from eventlog.boundary import Boundary, read_boundary
from eventlog.envelope import (
    RECORD_DECODER,
    ZERO_HASH,
    EventRecord,
    Genesis,
    Record,
    aad_prefix,
    associated_data_from,
    decode_record,
    record_hash,
    record_hashes,
)
from eventlog.errors import DamagedLogError, DecryptError, EventLogError, UnknownKeyError
from eventlog.keys import KeyRing
from eventlog.position import LogPosition
from eventlog.seal import Sealer
from eventlog.segments import list_segments, segment_name

_SEQ = operator.attrgetter("seq")
_PREV = operator.attrgetter("prev")


class StoredRecord(msgspec.Struct, frozen=True, gc=False):
    """One record as read, with its sequence number and hash (a Struct: a million of them
    are made on a full read, at a seventh of a dataclass's cost each)."""

    seq: int
    hash: str
    record: Record


class ArchivedError(EventLogError):
    """The records asked for were archived (``bide log archive``); the message names where."""


def archive_names(boundary: Boundary) -> str:
    where = ", ".join(ref.dest for ref in boundary.archives)
    return f"in {where}" if where else "by `bide log archive`"


class EventOpener:
    """Decrypts event records: one :class:`Sealer` per data key, and the associated data's
    log and key parts converted to bytes once, not per record."""

    def __init__(self, keyring: KeyRing) -> None:
        self._keyring = keyring
        self._keys: dict[str, tuple[Sealer, bytes]] = {}
        self._prefixes: dict[str, bytes] = {}

    def open(self, rec: EventRecord) -> bytes:
        """The plaintext payload of ``rec``.

        Raises:
            UnknownKeyError: Its data key is not in the keyring (retired: crypto-shredded).
            DecryptError: The payload failed authentication; the message names the record.
        """
        known = self._keys.get(rec.kid)
        if known is None:
            known = self._keys[rec.kid] = (
                Sealer(self._keyring.get(rec.kid)),
                rec.kid.encode("ascii"),
            )
        prefix = self._prefixes.get(rec.log)
        if prefix is None:
            prefix = self._prefixes[rec.log] = aad_prefix(rec.log)
        aad = associated_data_from(prefix, rec.seq, bytes.fromhex(rec.prev), known[1])
        try:
            return known[0].open(rec.nonce, rec.ct, aad)
        except DecryptError as exc:
            raise DecryptError(f"record {rec.seq} (data key {rec.kid}): {exc}") from None


class LogReader:
    """Incremental reader: each :meth:`poll` returns the records appended since the last one.

    ``start`` begins just after a position's record instead of at the genesis record; the
    caller has checked that it matches the log (:func:`eventlog.position.mismatch`), and the
    chain is checked from its hash on.

    A log whose first segments were archived (:mod:`eventlog.boundary`) cannot be read from
    its genesis record: without ``start`` (or with one before the boundary) the reader
    raises :class:`ArchivedError`, naming the archive, unless ``from_boundary`` asks for the
    records after the boundary only (a head, a follower).
    """

    def __init__(
        self,
        log_dir: Path,
        keyring: KeyRing | None = None,
        *,
        start: LogPosition | None = None,
        from_boundary: bool = False,
    ) -> None:
        if not log_dir.is_dir():
            raise EventLogError(
                f"log directory {log_dir} does not exist; check [paths] state_dir in the config, "
                f"or start `bide run` once to create the log"
            )
        self.log_dir = log_dir
        self._opener = EventOpener(keyring) if keyring is not None else None
        self._index = 0  # the segment file being read (its index); 0 = not started
        self._segment: Path | None = None
        self._offset = 0
        self.next_seq = 0
        self.head_hash = ZERO_HASH
        self.log_id = ""
        boundary = read_boundary(log_dir)
        self.archived = boundary  # the log's archive boundary; None: it starts at record 0
        self._archived = 0 if boundary is None else boundary.segments
        if boundary is not None and (start is None or start.seq <= boundary.seq):
            if start is None and not from_boundary:
                raise ArchivedError(
                    f"records 0..{boundary.seq} of log {log_dir} are archived "
                    f"({archive_names(boundary)}); reading from the start needs them: the "
                    f"offline readers take them with --archive DEST (`bide story OP "
                    f"--offline --archive DEST`), and the daemon starts from its state "
                    f"snapshot, which must be at or after record {boundary.seq}"
                )
            if start is not None and start.seq < boundary.seq:
                raise ArchivedError(
                    f"reading log {log_dir} from record {start.seq + 1} (the state snapshot's "
                    f"position) needs records {start.seq + 1}..{boundary.seq}, which are "
                    f"archived ({archive_names(boundary)}): restore a newer state snapshot, "
                    f"or restore the archived segments into the log directory"
                )
            self._index = boundary.segments
            self.next_seq, self.head_hash, self.log_id = (
                boundary.seq + 1,
                boundary.hash,
                boundary.log_id,
            )
        elif start is not None:
            self._index = start.segment
            self._segment = log_dir / segment_name(start.segment)
            self._offset = start.end
            self.next_seq, self.head_hash, self.log_id = start.seq + 1, start.hash, start.log_id

    def poll(self) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        for chunk in self._chunks():
            out += chunk
        return out

    def _chunks(self) -> Iterator[list[StoredRecord]]:
        """The new records, one segment file at a time (memory stays one segment's worth)."""
        segments = [s for s in list_segments(self.log_dir) if s[0] > self._archived]
        while True:
            if self._segment is None:
                later = [s for s in segments if s[0] > self._index]
                if not later:
                    return
                self._index, self._segment = later[0]
                self._offset = 0
            with self._segment.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
            end = data.rfind(b"\n")
            if end >= 0:
                lines = data.split(b"\n")
                lines.pop()  # after the last newline: empty, or a record still arriving
                chunk = self._accept_all(lines)
                self._offset += end + 1
                yield chunk
            if segments and segments[-1][0] > self._index and end == len(data) - 1:
                self._segment = None  # this segment is finished; a later one exists
                continue
            return

    def _accept_all(self, lines: list[bytes]) -> list[StoredRecord]:
        """Parse and chain-check many lines with C-level loops; where anything is off, go
        line by line instead, which names the first bad record."""
        try:
            recs: list[Record] = list(map(RECORD_DECODER.decode, lines))
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
            return self._accept_each(lines)
        n = len(recs)
        seqs: list[int] = list(map(_SEQ, recs))
        hashes = record_hashes(lines)
        prevs: list[str] = list(map(_PREV, recs))
        if (
            seqs != list(range(self.next_seq, self.next_seq + n))
            or prevs[0] != self.head_hash
            or prevs[1:] != hashes[:-1]
        ):
            return self._accept_each(lines)
        if isinstance(recs[0], Genesis):
            self.log_id = recs[0].log
        self.next_seq += n
        self.head_hash = hashes[-1]
        return list(map(StoredRecord, seqs, hashes, recs))

    def _accept_each(self, lines: list[bytes]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        offset = self._offset
        for line in lines:
            out.append(self._accept(line, offset))
            offset += len(line) + 1
        return out

    def _accept(self, line: bytes, offset: int) -> StoredRecord:
        where = f"{self._segment} offset {offset}"
        try:
            rec = decode_record(line)
        except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
            raise DamagedLogError(
                f"{where}: record {self.next_seq} does not parse; run `bide verify`"
            ) from None
        if rec.seq != self.next_seq or rec.prev != self.head_hash:
            raise DamagedLogError(
                f"{where}: record {rec.seq} breaks the chain (expected record {self.next_seq} "
                f"linking to {self.head_hash[:16]}…); run `bide verify`"
            )
        if isinstance(rec, Genesis):
            self.log_id = rec.log
        h = record_hash(line)
        self.next_seq += 1
        self.head_hash = h
        return StoredRecord(rec.seq, h, rec)

    def decrypt(self, stored: StoredRecord) -> bytes:
        """The plaintext payload of an event record; needs the keyring."""
        rec = stored.record
        if not isinstance(rec, EventRecord):
            raise TypeError(f"record {stored.seq} is a {type(rec).__name__}, not an event")
        if self._opener is None:
            raise EventLogError("reading payloads needs the data keys (keys_dir in the config)")
        return self._opener.open(rec)

    def payloads(
        self, unreadable: list[tuple[int, str]] | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """(seq, plaintext) of every event appended since the last poll.

        An event whose data key is not in the keyring (retired: crypto-shredded) or whose
        payload fails authentication raises; given ``unreadable``, it is listed there as
        (seq, why) instead and skipped, and reading goes on. Chain damage always raises.
        """
        for chunk in self._chunks():
            for stored in chunk:
                if isinstance(stored.record, EventRecord):
                    try:
                        payload = self.decrypt(stored)
                    except (UnknownKeyError, DecryptError) as exc:
                        if unreadable is None:
                            raise
                        unreadable.append((stored.seq, str(exc)))
                        continue
                    yield stored.seq, payload

    async def follow(self, stop: anyio.Event | None = None) -> AsyncGenerator[StoredRecord, None]:
        """Yield records as they are appended, forever or until ``stop`` is set.

        Woken by watchfiles (inotify); records appended between the first read and the watch
        starting are picked up by a re-read at least once a second, so none waits forever.
        """
        for stored in self.poll():
            yield stored
        async for _ in watchfiles.awatch(
            self.log_dir,
            stop_event=stop,
            debounce=0,
            step=5,
            rust_timeout=1000,
            yield_on_timeout=True,
            watch_filter=lambda _change, path: Path(path).name.startswith("seg-"),
        ):
            for stored in self.poll():
                yield stored


def read_payloads(log_dir: Path, keyring: KeyRing) -> Iterator[tuple[int, bytes]]:
    """Every event payload of the log, in order."""
    yield from LogReader(log_dir, keyring).payloads()
