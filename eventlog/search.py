"""Finding the events whose plaintext holds a byte string, on every core.

One operation's story needs only its own events, but which events those are is sealed inside
each record: every record must be opened. Opening is most of a read's cost, and what a search
keeps is small, so the log is split into newline-aligned units (as :mod:`eventlog.verify`
splits it) that forked workers read, chain-check and open on their own, sending back only the
matches. The parent joins the units' chains end to end; wherever a unit does not prove out
(a damaged line, a broken link, a partial last line) it reads on from there with
:class:`~eventlog.reader.LogReader`, so the result, the unreadable records listed and any
error raised are the serial reader's.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec

from eventlog.envelope import (
    MAX_LINE_BYTES,
    RECORD_DECODER,
    ZERO_HASH,
    EventRecord,
    Genesis,
    Record,
    associated_data,
    record_hashes,
)
from eventlog.errors import DecryptError, UnknownKeyError
from eventlog.keys import KeyRing
from eventlog.position import LogPosition
from eventlog.reader import LogReader
from eventlog.seal import Sealer
from eventlog.segments import list_segments
from eventlog.verify import PARALLEL_MIN_BYTES, UNIT_BYTES, plan_units

#: What a unit sends back: its first record's seq and prev, its last record's seq and hash,
#: the log id when it holds the genesis record, the matches and the unreadable records.
_Found = tuple[int, str, int, str, str | None, list[tuple[int, bytes]], list[tuple[int, str]]]
_Unit = tuple[str, int, int, int]  # path, segment ordinal, start, end

_keyring: KeyRing | None = None  # set before the workers fork: they inherit it, never piped


def search_payloads(log_dir: Path, keyring: KeyRing, needle: bytes,
                    unreadable: list[tuple[int, str]], *, jobs: int | None = None,
                    unit_bytes: int = UNIT_BYTES, min_bytes: int = PARALLEL_MIN_BYTES
                    ) -> tuple[list[tuple[int, bytes]], int]:
    """(seq, plaintext) of every event whose plaintext contains ``needle``, in log order, and
    the head's sequence number: what filtering ``LogReader(log_dir, keyring).payloads(
    unreadable)`` gives, in ``jobs`` worker processes (default: one per core) when the log
    is large enough to be worth forking for. Only fork from a single-threaded process."""
    global _keyring
    jobs = jobs or os.cpu_count() or 1
    segments = list_segments(log_dir)
    units = plan_units(segments, (1, 0), unit_bytes)
    if jobs < 2 or len(units) < 2 or sum(u[3] - u[2] for u in units) < min_bytes:
        return _serial(LogReader(log_dir, keyring), needle, unreadable, [])
    _keyring = keyring
    gc_was_enabled = gc.isenabled()
    gc.disable()  # many short-lived objects that hold no cycles
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(min(jobs, len(units)), mp_context=context) as pool:
            found = pool.map(_search_unit, units, [needle] * len(units),
                             [unit_bytes] * len(units))
            return _join(log_dir, keyring, needle, unreadable, units, found)
    finally:
        _keyring = None
        if gc_was_enabled:
            gc.enable()


def _join(log_dir: Path, keyring: KeyRing, needle: bytes, unreadable: list[tuple[int, str]],
          units: list[_Unit], found: Iterator[_Found | None]
          ) -> tuple[list[tuple[int, bytes]], int]:
    matches: list[tuple[int, bytes]] = []
    next_seq, head, log_id = 0, ZERO_HASH, ""
    for (_, ordinal, start, _), unit in zip(units, found, strict=True):
        if unit is None or unit[0] != next_seq or unit[1] != head or (
                unit[4] is None and next_seq == 0):
            if next_seq == 0:
                return _serial(LogReader(log_dir, keyring), needle, unreadable, matches)
            at = LogPosition(log_id=log_id, seq=next_seq - 1, hash=head, segment=ordinal,
                             line_start=start, end=start, last_cp_seq=None,
                             last_cp_hash=ZERO_HASH, checkpoint_every=0, unsigned_run=0)
            return _serial(LogReader(log_dir, keyring, start=at), needle, unreadable, matches)
        _, _, last_seq, last_hash, genesis_log, hits, bad = unit
        if genesis_log is not None:
            log_id = genesis_log
        matches += hits
        unreadable += bad
        next_seq, head = last_seq + 1, last_hash
    return matches, next_seq - 1


def _serial(reader: LogReader, needle: bytes, unreadable: list[tuple[int, str]],
            matches: list[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], int]:
    matches += [(seq, p) for seq, p in reader.payloads(unreadable) if needle in p]
    return matches, reader.next_seq - 1


def _search_unit(unit: _Unit, needle: bytes, unit_bytes: int) -> _Found | None:
    """One unit read, chain-checked within itself and opened; None where anything is off
    (the parent's serial reader then says what)."""
    gc.disable()
    assert _keyring is not None
    path, _, start, end = unit
    if end - start > unit_bytes + MAX_LINE_BYTES:
        return None  # an overlong line: the serial reader reads it in bounded chunks
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if not data.endswith(b"\n") or len(data) != end - start:
        return None
    lines = data[:-1].split(b"\n")
    try:
        recs: list[Record] = list(map(RECORD_DECODER.decode, lines))
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
        return None
    hashes = record_hashes(lines)
    first = recs[0].seq
    if ([r.seq for r in recs] != list(range(first, first + len(recs)))
            or [r.prev for r in recs[1:]] != hashes[:-1]):
        return None
    genesis = next((r.log for r in recs if isinstance(r, Genesis)), None)
    sealers: dict[str, Sealer] = {}
    hits: list[tuple[int, bytes]] = []
    bad: list[tuple[int, str]] = []
    for rec in recs:
        if not isinstance(rec, EventRecord):
            continue
        try:
            sealer = sealers.get(rec.kid)
            if sealer is None:
                sealer = sealers[rec.kid] = Sealer(_keyring.get(rec.kid))
            payload = sealer.open(rec.nonce, rec.ct, associated_data(rec.log, rec.seq,
                                                                     rec.prev, rec.kid),
                                  where=f"record {rec.seq} (data key {rec.kid})")
        except (UnknownKeyError, DecryptError) as exc:
            bad.append((rec.seq, str(exc)))
            continue
        if needle in payload:
            hits.append((rec.seq, payload))
    return first, recs[0].prev, recs[-1].seq, hashes[-1], genesis, hits, bad
