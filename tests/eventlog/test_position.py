"""Resuming verification and reading at a position: same verdicts, less work, safe fallback."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from eventlog.errors import DamagedLogError
from eventlog.position import LogPosition, mismatch
from eventlog.reader import LogReader
from eventlog.segments import list_segments
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet, payload_for
from tests.eventlog.conftest import BaseLogs

pytestmark = pytest.mark.anyio


def position_of(log: Path, ks: KeySet) -> LogPosition:
    report = verify_log(log, ks.verify_key(), writer_live=False)
    assert report.damage is None
    return report.position()


async def extend(
    log: Path, ks: KeySet, start: int, count: int, resume: LogPosition | None = None
) -> LogWriter:
    async with LogWriter(
        log,
        ks.keyring(),
        ks.signer(),
        segment_bytes=2048,
        checkpoint_every=5,
        checkpoint_interval=3600,
        resume=resume,
    ) as w:
        for i in range(start, start + count):
            await w.append(payload_for(i))
    return w


async def test_writer_position_is_what_a_full_verification_finds(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    w = await extend(log, ks, 0, 23)
    assert w.position == position_of(log, ks)


async def test_resumed_open_verifies_only_the_tail_and_agrees(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    first = await extend(log, ks, 0, 40)
    assert first.position is not None
    second = await extend(log, ks, 40, 17, resume=first.position)
    assert second.resumed_at == first.position.seq
    full = verify_log(log, ks.verify_key(), writer_live=False)
    resumed = verify_log(log, ks.verify_key(), writer_live=False, resume=first.position)
    assert full.verdict == resumed.verdict == "intact"
    assert resumed.resumed_at == first.position.seq
    assert resumed.position() == full.position() == second.position
    assert resumed.unsigned_tail == full.unsigned_tail


async def test_reader_from_a_position_yields_exactly_the_tail(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    first = await extend(log, ks, 0, 30)
    await extend(log, ks, 30, 12)
    assert first.position is not None
    tail = [p for _, p in LogReader(log, ks.keyring(), start=first.position).payloads()]
    assert tail == [payload_for(i) for i in range(30, 42)]


def test_a_position_that_no_longer_matches_falls_back_to_full_verification(
    base_logs: BaseLogs, log: Path
) -> None:
    pos = position_of(log, base_logs.keys)
    wrong_hash = msgspec.structs.replace(pos, hash="0" * 64)
    other = position_of(base_logs.other, base_logs.keys)  # another log's head
    beyond = msgspec.structs.replace(pos, end=pos.end + 10, line_start=pos.line_start + 10)
    for bad in (wrong_hash, other, beyond):
        assert mismatch(log, bad) is not None
        report = verify_log(log, base_logs.keys.verify_key(), writer_live=False, resume=bad)
        assert report.resumed_at is None
        assert report.verdict == "intact"
        assert any("resume point does not match" in n for n in report.notes)


def test_damage_after_the_position_is_still_found(
    base_logs: BaseLogs, log: Path, tmp_path: Path
) -> None:
    early = 30
    # Take a position from a shorter copy of the same log: everything up to record ``early``.
    short = tmp_path / "short"
    shutil.copytree(log, short)
    _cut_after(short, early)
    early_pos = verify_log(short, base_logs.keys.verify_key(), writer_live=False).position()
    assert early_pos.seq == early
    # Alter a record after it: the resumed verification names it.
    last_seg = list_segments(log)[-1][1]
    data = bytearray(last_seg.read_bytes())
    i = data.rindex(b'"ct":"') + 8
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    last_seg.write_bytes(bytes(data))
    report = verify_log(log, base_logs.keys.verify_key(), writer_live=False, resume=early_pos)
    assert report.resumed_at == early
    assert report.verdict == "damaged"


def _cut_after(log: Path, seq: int) -> None:
    """Keep records 0..seq (segment files after it removed, its own file cut after it)."""
    from eventlog.envelope import decode_record

    for _, path in list_segments(log):
        kept = b""
        for line in path.read_bytes().split(b"\n"):
            if line and decode_record(line).seq <= seq:
                kept += line + b"\n"
        if kept:
            path.write_bytes(kept)
        else:
            path.unlink()


async def test_writer_given_a_stale_position_verifies_everything(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    other = tmp_path / "other"
    await extend(log, ks, 0, 12)
    w_other = await extend(other, ks, 0, 12)
    w = await extend(log, ks, 12, 3, resume=w_other.position)
    assert w.resumed_at is None
    assert verify_log(log, ks.verify_key(), writer_live=False).verdict == "intact"


async def test_damage_before_the_position_is_found_by_a_full_verification(
    tmp_path: Path, ks: KeySet
) -> None:
    """The trade a resumed open makes, pinned: it trusts what it verified before; the
    auditor's `bide verify` (no resume) still finds damage there."""
    log = tmp_path / "log"
    first = await extend(log, ks, 0, 20)
    assert first.position is not None
    seg1 = list_segments(log)[0][1]
    data = bytearray(seg1.read_bytes())
    i = data.index(b'"ct":"') + 8
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    seg1.write_bytes(bytes(data))
    assert verify_log(log, ks.verify_key(), writer_live=False).verdict == "damaged"
    with pytest.raises(DamagedLogError):
        await extend(log, ks, 20, 1)
    w = await extend(log, ks, 20, 1, resume=first.position)
    assert w.resumed_at == first.position.seq
