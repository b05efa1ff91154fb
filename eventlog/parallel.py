"""Reading a whole log on every core, or only the events whose plaintext holds a byte string.

Opening the records (base64 and AES-GCM-SIV), with the envelope decoding and hashing around
it, is most of what a read costs, and each record opens on its own. So the log is split into
newline-aligned units (as :mod:`eventlog.verify` splits it) that forked workers read,
chain-check and open; each sends back its plaintexts, or with a needle only the matching ones
(one operation's story: its events can be anywhere, but few). The parent joins the units'
chains end to end; wherever a unit does not prove out (a damaged line, a broken link, a
partial last line) it reads on from there with :class:`~eventlog.reader.LogReader`, so the
result, the unreadable records listed and any error raised are the serial reader's.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import msgspec

from eventlog.envelope import (
    RECORD_DECODER,
    ZERO_HASH,
    EventRecord,
    Genesis,
    Record,
    record_hashes,
)
from eventlog.errors import DecryptError, UnknownKeyError
from eventlog.keys import KeyRing
from eventlog.position import LogPosition
from eventlog.reader import EventOpener, LogReader
from eventlog.segments import list_segments
from eventlog.verify import PARALLEL_MIN_BYTES, UNIT_BYTES, plan_units, unit_lines

#: What a unit sends back: its first record's seq and prev, its last record's seq and hash,
#: the log id when it holds the genesis record, the matches and the unreadable records.
_Found = tuple[int, str, int, str, str | None, list[tuple[int, bytes]], list[tuple[int, str]]]
_Unit = tuple[str, int, int, int]  # path, segment ordinal, start, end

_keyring: KeyRing | None = None  # set before the workers fork: they inherit it, never piped


class ParallelReader:
    """:meth:`LogReader.payloads` of a whole log, read in ``jobs`` forked worker processes
    (default: one per core) when it is large enough to be worth forking for, and with a
    ``needle``, only the events whose plaintext contains it (what the workers send back).
    Afterwards ``next_seq`` is the serial reader's. It forks only from a process with one
    thread (a child of a threaded one could inherit a lock some other thread held); in any
    other it reads serially, as it does a small log."""

    def __init__(
        self,
        log_dir: Path,
        keyring: KeyRing,
        needle: bytes = b"",
        *,
        jobs: int | None = None,
        unit_bytes: int = UNIT_BYTES,
        min_bytes: int = PARALLEL_MIN_BYTES,
    ) -> None:
        self.log_dir, self.keyring, self.needle = log_dir, keyring, needle
        self.jobs = jobs or os.cpu_count() or 1
        self.unit_bytes, self.min_bytes = unit_bytes, min_bytes
        self.next_seq = 0
        self.workers = 0  # how many processes the last read forked (0: it read serially)

    def payloads(self, unreadable: list[tuple[int, str]]) -> Iterator[tuple[int, bytes]]:
        units = (
            []
            if self.jobs < 2 or threading.active_count() > 1
            else plan_units(list_segments(self.log_dir), (1, 0), self.unit_bytes)
        )
        if len(units) < 2 or sum(u[3] - u[2] for u in units) < self.min_bytes:
            yield from self._serial(LogReader(self.log_dir, self.keyring), unreadable)
            return
        global _keyring
        _keyring = self.keyring
        gc_was_enabled = gc.isenabled()
        gc.disable()  # many short-lived objects that hold no cycles
        try:
            context = multiprocessing.get_context("fork")
            workers = self.workers = min(self.jobs, len(units))
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                try:
                    yield from self._join(
                        unreadable, units, self._in_order(pool, units, 2 * workers)
                    )
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        finally:
            _keyring = None
            if gc_was_enabled:
                gc.enable()

    def _in_order(
        self, pool: ProcessPoolExecutor, units: list[_Unit], window: int
    ) -> Iterator[_Found | None]:
        """Each unit's result in order, with at most ``window`` units read ahead (what the
        workers found waits in memory only that far)."""
        pending: deque[Future[_Found | None]] = deque()
        ahead = iter(units)
        for unit in ahead:
            pending.append(pool.submit(_search_unit, unit, self.needle, self.unit_bytes))
            if len(pending) >= window:
                break
        while pending:
            found = pending.popleft().result()
            more = next(ahead, None)
            if more is not None:
                pending.append(pool.submit(_search_unit, more, self.needle, self.unit_bytes))
            yield found

    def _join(
        self, unreadable: list[tuple[int, str]], units: list[_Unit], found: Iterator[_Found | None]
    ) -> Iterator[tuple[int, bytes]]:
        head, log_id = ZERO_HASH, ""
        for (_, ordinal, start, _), unit in zip(units, found, strict=False):
            if (
                unit is None
                or unit[0] != self.next_seq
                or unit[1] != head
                or (unit[4] is None and self.next_seq == 0)
            ):
                if self.next_seq == 0:
                    reader = LogReader(self.log_dir, self.keyring)
                else:
                    at = LogPosition(
                        log_id=log_id,
                        seq=self.next_seq - 1,
                        hash=head,
                        segment=ordinal,
                        line_start=start,
                        end=start,
                        last_cp_seq=None,
                        last_cp_hash=ZERO_HASH,
                        checkpoint_every=0,
                        unsigned_run=0,
                    )
                    reader = LogReader(self.log_dir, self.keyring, start=at)
                yield from self._serial(reader, unreadable)
                return
            _, _, last_seq, last_hash, genesis_log, hits, bad = unit
            if genesis_log is not None:
                log_id = genesis_log
            unreadable += bad
            yield from hits
            self.next_seq, head = last_seq + 1, last_hash

    def _serial(
        self, reader: LogReader, unreadable: list[tuple[int, str]]
    ) -> Iterator[tuple[int, bytes]]:
        for seq, payload in reader.payloads(unreadable):
            if self.needle in payload:
                yield seq, payload
        self.next_seq = reader.next_seq


def _search_unit(unit: _Unit, needle: bytes, unit_bytes: int) -> _Found | None:
    """One unit read, chain-checked within itself and opened; None where anything is off
    (the parent's serial reader then says what)."""
    gc.disable()
    assert _keyring is not None
    lines = unit_lines(unit, unit_bytes)
    if lines is None:
        return None  # the serial reader reads what is off, in bounded chunks
    try:
        recs: list[Record] = list(map(RECORD_DECODER.decode, lines))
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
        return None
    hashes = record_hashes(lines)
    first = recs[0].seq
    if [r.seq for r in recs] != list(range(first, first + len(recs))) or [
        r.prev for r in recs[1:]
    ] != hashes[:-1]:
        return None
    genesis = next((r.log for r in recs if isinstance(r, Genesis)), None)
    opener = EventOpener(_keyring)
    hits: list[tuple[int, bytes]] = []
    bad: list[tuple[int, str]] = []
    for rec in recs:
        if not isinstance(rec, EventRecord):
            continue
        try:
            payload = opener.open(rec)
        except (UnknownKeyError, DecryptError) as exc:
            bad.append((rec.seq, str(exc)))
            continue
        if needle in payload:
            hits.append((rec.seq, payload))
    return first, recs[0].prev, recs[-1].seq, hashes[-1], genesis, hits, bad
