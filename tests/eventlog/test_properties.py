"""Property tests: envelope framing, record hashes, verify's classification, the reader."""

from __future__ import annotations

import base64
import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.envelope import (
    Checkpoint,
    EventRecord,
    Genesis,
    Record,
    Recovery,
    SealedEvent,
    Segment,
    decode_record,
    encode_record,
    record_hash,
    record_hashes,
)
from eventlog.reader import LogReader
from eventlog.segments import list_segments
from tests.eventlog._logtools import StoredLine, read_lines, verify, write_lines
from tests.eventlog.conftest import BaseLogs

# -- framing ----------------------------------------------------------------------------------

hexes = st.text("0123456789abcdef", min_size=1, max_size=64)
seqs = st.integers(min_value=0, max_value=2**63 - 1)
times = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=80)  # any str, escapes and non-ASCII included

records: st.SearchStrategy[Record] = st.one_of(
    st.builds(Genesis, seqs, hexes, st.integers(0, 2**31), hexes, hexes, times),
    st.builds(Segment, seqs, hexes, hexes, st.integers(1, 2**31)),
    st.builds(EventRecord, seqs, hexes, hexes, hexes, texts, texts),
    st.builds(Checkpoint, seqs, hexes, hexes, times, hexes, st.booleans(), texts),
    st.builds(
        Recovery,
        seqs,
        hexes,
        hexes,
        times,
        texts,
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        hexes,
        texts,
    ),
)


@given(records)
def test_envelope_round_trips(rec: Record) -> None:
    line = encode_record(rec)
    assert b"\n" not in line  # one record, one line
    assert decode_record(line) == rec
    assert encode_record(decode_record(line)) == line


@given(seqs, hexes, hexes, texts, st.binary(max_size=64), st.binary(max_size=600))
def test_the_writers_record_is_byte_for_byte_the_readers(
    seq: int, prev: str, log: str, kid: str, nonce: bytes, ct: bytes
) -> None:
    """The writer encodes raw nonce and ciphertext (msgspec writes the base64); the stored
    line must be exactly the ``EventRecord`` of their padded standard base64, or every hash
    and every reader would disagree with the writer."""
    written = encode_record(SealedEvent(seq, prev, log, kid, nonce, ct))
    expected = EventRecord(
        seq,
        prev,
        log,
        kid,
        base64.b64encode(nonce).decode("ascii"),
        base64.b64encode(ct).decode("ascii"),
    )
    assert written == encode_record(expected)
    assert decode_record(written) == expected


@given(records, st.data())
def test_any_change_to_a_record_changes_its_hash(rec: Record, data: st.DataObject) -> None:
    line = encode_record(rec)
    pos = data.draw(st.integers(0, len(line)))
    insert = data.draw(st.booleans())
    if insert or pos == len(line):
        changed = line[:pos] + data.draw(st.binary(min_size=1, max_size=3)) + line[pos:]
    else:
        new = data.draw(st.integers(0, 255).filter(lambda b: b != line[pos]))
        changed = line[:pos] + bytes([new]) + line[pos + 1 :]
    assert record_hash(changed) != record_hash(line)
    assert record_hashes([line, changed]) == [record_hash(line), record_hash(changed)]


# -- verify's classification ------------------------------------------------------------------

Op = Callable[
    [list[StoredLine], list[StoredLine]], tuple[list[StoredLine], str, int, tuple[int, str] | None]
]


def _body(lines: list[StoredLine]) -> list[int]:
    """Indexes of records that are neither the genesis nor a segment's first record."""
    return [i for i, line in enumerate(lines) if line.kind not in ("Genesis", "Segment")]


@st.composite
def operations(draw: st.DrawFn, n: int, body: list[int], other: int) -> tuple[str, tuple[int, ...]]:
    kind = draw(st.sampled_from(["delete", "duplicate", "swap", "splice", "insert", "truncate"]))
    if kind == "delete":
        p = draw(st.sampled_from(body))
        k = draw(st.integers(1, 4))
        return kind, (p, k)
    if kind == "swap":
        i, j = sorted(draw(st.lists(st.sampled_from(body), min_size=2, max_size=2, unique=True)))
        return kind, (i, j)
    if kind in ("splice", "insert"):
        return kind, (draw(st.sampled_from(body)), draw(st.integers(1, other - 1)))
    if kind == "truncate":
        return kind, (draw(st.integers(1, n - 1)),)
    return kind, (draw(st.sampled_from(body)),)


@pytest.fixture(scope="module")
def base_lines(base_logs: BaseLogs) -> tuple[list[StoredLine], list[StoredLine]]:
    return read_lines(base_logs.log), read_lines(base_logs.other)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_verify_names_the_class_of_a_single_operation(
    base_logs: BaseLogs, base_lines: tuple[list[StoredLine], list[StoredLine]], data: st.DataObject
) -> None:
    ours, theirs = base_lines
    lines = [StoredLine(line.segment, line.data) for line in ours]
    body = _body(lines)
    kind, args = data.draw(operations(len(lines), body, len(theirs)))
    anchor = None
    if kind == "delete":
        p, k = args
        k = min(k, len(lines) - 1 - p)  # keep a record after the gap: a cut end is truncation
        if k == 0 or any(i not in body for i in range(p, p + k)):
            k = 1
        if p + k >= len(lines):
            return
        expected = ("missing", lines[p].seq)
        del lines[p : p + k]
    elif kind == "duplicate":
        (p,) = args
        expected = ("duplicated", lines[p].seq)
        lines.insert(p + 1, StoredLine(lines[p].segment, lines[p].data))
    elif kind == "swap":
        i, j = args
        expected = ("reordered", lines[i].seq)
        lines[i].data, lines[j].data = lines[j].data, lines[i].data
    elif kind == "splice":
        p, q = args
        expected = ("spliced", lines[p].seq)
        lines[p].data = theirs[q].data
    elif kind == "insert":
        p, q = args
        expected = ("spliced", lines[p].seq)
        lines.insert(p, StoredLine(lines[p].segment, theirs[q].data))
    else:
        (p,) = args
        anchor = (lines[-1].seq, lines[-1].hash)
        expected = ("truncated", lines[p].seq)
        del lines[p:]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp)
        write_lines(log, lines)
        report = verify(log, base_logs.keys, anchor)
    assert report.verdict == "damaged", (kind, args)
    assert report.damage is not None
    assert (report.damage.kind, report.damage.seq) == expected, (kind, args, report.damage)


# -- the reader, fed whole or a piece at a time -----------------------------------------------


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunks=st.lists(st.integers(16, 1500), min_size=1, max_size=40))
def test_reader_fed_piecewise_agrees_with_reader_fed_whole(
    base_logs: BaseLogs, chunks: list[int]
) -> None:
    keyring = base_logs.keys.keyring()
    whole_reader = LogReader(base_logs.log, keyring)
    whole = [(s.seq, s.hash) for s in whole_reader.poll()]
    files = [(path.name, path.read_bytes()) for _, path in list_segments(base_logs.log)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp)
        reader = LogReader(log, keyring)
        got: list[tuple[int, str]] = []
        payloads: list[bytes] = []
        sizes = itertools.cycle(chunks)
        for name, data in files:
            (log / name).write_bytes(b"")  # created first, as the writer does
            pos = 0
            while pos < len(data):
                step = next(sizes)
                with (log / name).open("ab") as f:
                    f.write(data[pos : pos + step])
                pos += step
                for stored in reader.poll():
                    got.append((stored.seq, stored.hash))
                    if isinstance(stored.record, EventRecord):
                        payloads.append(reader.decrypt(stored))
    assert got == whole
    assert payloads == [p for _, p in LogReader(base_logs.log, keyring).payloads()]
