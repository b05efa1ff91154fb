"""Seals: records appended with the data key alone are never adopted by the writer.

Every write of the writer ends with a checkpoint or a seal (an HMAC under a key derived from
the signing key). Whoever holds only the data key can append records that chain and decrypt
correctly; on open the writer copies them to quarantine, cuts them, records the cut
(``reason="unsealed"``) and signs over the cut log, never over them. ``bide verify`` (public
key only) accepts seals and notes a head no seal covers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import msgspec
import pytest

from eventlog.envelope import EventRecord, Recovery, Seal, Segment, encode_record, record_hash
from eventlog.mac import seal_ok
from eventlog.reader import read_payloads
from eventlog.segments import list_segments, segment_name
from eventlog.writer import LogWriter
from tests.eventlog._logtools import (
    KeySet,
    build_log,
    forge_event,
    read_lines,
    verify,
    verify_cli,
)

PRESEAL = Path(__file__).parent.parent / "vectors" / "eventlog_preseal"


async def _open(log: Path, ks: KeySet, segment_bytes: int = 2048) -> list[Recovery]:
    async with LogWriter(
        log,
        ks.keyring(),
        ks.signer(),
        checkpoint_every=5,
        checkpoint_interval=3600,
        segment_bytes=segment_bytes,
    ) as w:
        await w.append(b"after the open")
        return w.recoveries


def test_every_write_ends_with_a_seal_or_a_checkpoint(tmp_path: Path, ks: KeySet) -> None:
    build_log(tmp_path / "log", ks, 23, batch=2)
    lines = read_lines(tmp_path / "log")
    kinds = [line.kind for line in lines]
    assert "Seal" in kinds
    mac_key = ks.signer().mac_key
    for i, line in enumerate(lines):
        rec = line.record
        if isinstance(rec, Seal):
            assert seal_ok(mac_key, rec)
            assert rec.prev == lines[i - 1].hash
        if isinstance(rec, EventRecord) and i + 1 < len(lines):
            assert kinds[i + 1] in ("EventRecord", "Seal", "Checkpoint", "Segment")


def test_a_forged_event_after_a_clean_close_is_quarantined_not_adopted(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 12)
    forged_seq = forge_event(log, ks.keyring(), b"decision by alice: extend")
    before = verify(log, ks)
    assert before.verdict == "intact"  # verify cannot check the MAC, but it says so
    assert any("not followed by a seal" in note for note in before.notes), before.notes
    cli = verify_cli(log, ks.verify_pub)
    assert cli.status == 0
    notes = cli.report["notes"]
    assert isinstance(notes, list)
    assert any("not followed by a seal" in n for n in notes)

    recoveries = anyio.run(_open, log, ks)
    assert [r.reason for r in recoveries] == ["unsealed"]
    cut = recoveries[0]
    quarantined = (log / cut.quarantine).read_bytes()
    assert b'"seq":%d' % forged_seq in quarantined
    assert len(quarantined) == cut.cut_len
    assert cut.seq == forged_seq  # the recovery record takes the forged record's place
    payloads = [p for _, p in read_payloads(log, ks.keyring())]
    assert b"decision by alice: extend" not in payloads
    assert payloads[-1] == b"after the open"
    after = verify(log, ks)
    assert after.verdict == "intact"
    assert after.clean_close


def test_a_forged_run_after_the_last_seal_is_cut_the_sealed_records_stay(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"

    async def crash_without_closing() -> int:
        w = LogWriter(log, ks.keyring(), ks.signer(), checkpoint_every=50, checkpoint_interval=3600)
        await w.__aenter__()
        acked = (await w.append_many([b"one", b"two"]))[-1].seq
        # Simulate a SIGKILL: no final checkpoint, drop the lock.
        w._tg.cancel_scope.cancel()  # type: ignore[union-attr]
        await w._tg.__aexit__(None, None, None)  # type: ignore[union-attr]
        w._lock.release()
        return acked

    acked = anyio.run(crash_without_closing)
    for i in range(3):
        forge_event(log, ks.keyring(), b"forged %d" % i)
    recoveries = anyio.run(_open, log, ks)
    assert [r.reason for r in recoveries] == ["unsealed"]
    payloads = [p for _, p in read_payloads(log, ks.keyring())]
    assert payloads == [b"one", b"two", b"after the open"]
    assert recoveries[0].seq == acked + 2  # after the acknowledged records and their seal


def test_a_forged_seal_does_not_authenticate(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 7)
    forge_event(log, ks.keyring(), b"forged")
    path = list_segments(log)[-1][1]
    last = path.read_bytes()[:-1].rsplit(b"\n", 1)[-1]
    head = msgspec.json.decode(last)
    seal = Seal(head["seq"] + 1, record_hash(last), head["log"], "A" * 43 + "=")
    with path.open("ab") as f:
        f.write(encode_record(seal) + b"\n")
    assert verify(log, ks).verdict == "intact"
    recoveries = anyio.run(_open, log, ks)
    assert [r.reason for r in recoveries] == ["unsealed"]
    assert b"forged" not in [p for _, p in read_payloads(log, ks.keyring())]


def test_a_forged_segment_is_removed_whole(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 9)
    segments = list_segments(log)
    last_index, last_path = segments[-1]
    tail = last_path.read_bytes()[:-1].rsplit(b"\n", 1)[-1]
    head = msgspec.json.decode(tail)
    new = log / segment_name(last_index + 1)
    new.write_bytes(
        encode_record(Segment(head["seq"] + 1, record_hash(tail), head["log"], last_index + 1))
        + b"\n"
    )
    forge_event(log, ks.keyring(), b"forged in a new segment")
    recoveries = anyio.run(_open, log, ks, 1 << 20)
    assert [r.reason for r in recoveries] == ["unsealed"]
    assert recoveries[0].segment == new.name
    assert recoveries[0].offset == 0
    assert b"forged in a new segment" not in [p for _, p in read_payloads(log, ks.keyring())]
    assert verify(log, ks).verdict == "intact"


@pytest.mark.parametrize("events", [0, 1, 4])
def test_honest_logs_reopen_without_any_cut(tmp_path: Path, ks: KeySet, events: int) -> None:
    log = tmp_path / "log"
    build_log(log, ks, events)
    assert anyio.run(_open, log, ks) == []
    assert anyio.run(_open, log, ks) == []


def _preseal(tmp_path: Path) -> tuple[KeySet, Path]:
    """A copy of the logs a bide before seals wrote, with its keys at their proper modes."""
    root = tmp_path / "preseal"
    shutil.copytree(PRESEAL, root)
    (root / "keys").chmod(0o700)
    # Stored as *.testkey: the repository ignores *.key so that no real key is ever committed.
    for key in (root / "keys").glob("*.testkey"):
        key.rename(key.with_suffix(".key"))
    for key in (root / "keys").glob("*.key"):
        key.chmod(0o600)
    return KeySet(root / "keys"), root


def test_logs_written_before_seals_verify_and_a_clean_one_is_continued(tmp_path: Path) -> None:
    ks, root = _preseal(tmp_path)
    for name in ("clean", "crashed"):
        assert verify(root / name, ks).verdict == "intact"
        assert verify_cli(root / name, ks.verify_pub, "--jobs", "1").status == 0
    log = root / "clean"
    assert anyio.run(_open, log, ks) == []  # signed to its end: adopted as it is
    payloads = [p for _, p in read_payloads(log, ks.keyring())]
    assert len(payloads) == 13
    assert payloads[-1] == b"after the open"
    assert "Seal" in [line.kind for line in read_lines(log)]
    assert verify(log, ks).verdict == "intact"


def test_an_unsigned_tail_left_by_a_bide_before_seals_is_quarantined(tmp_path: Path) -> None:
    ks, root = _preseal(tmp_path)
    log = root / "crashed"
    old = [p for _, p in read_payloads(log, ks.keyring())]
    assert old == [b"old %d" % i for i in range(7)]
    recoveries = anyio.run(_open, log, ks)
    assert [r.reason for r in recoveries] == ["unsealed"]
    kept = [p for _, p in read_payloads(log, ks.keyring())]
    assert kept == [*old[:5], b"after the open"]  # signed by the checkpoint after event 5
    assert verify(log, ks).verdict == "intact"
