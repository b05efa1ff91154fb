"""Forward-secure checkpoints: epoch keys evolve, the old ones are destroyed, and a key stolen
now cannot re-sign what an earlier epoch signed. Real logs, real key files, `bide verify`."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import anyio
import msgspec
import pytest

from eventlog.envelope import Checkpoint, checkpoint_message_v2, encode_record, record_hash
from eventlog.epochs import epoch_key_files, read_epoch_key
from eventlog.errors import KeyFileError
from eventlog.keys import Signer
from eventlog.writer import LogWriter
from tests.eventlog._logtools import (
    EVERY_3,
    KeySet,
    StoredLine,
    build_log,
    epoch_dir,
    read_lines,
    verify,
    verify_cli,
    write_lines,
)


def _epoch_log(tmp_path: Path, ks: KeySet, events: int = 60) -> Path:
    log = tmp_path / "log"
    build_log(log, ks, events, epochs=EVERY_3)
    return log


def resign(lines: list[StoredLine], start: int, thief: Signer) -> list[StoredLine]:
    """What a thief of the current epoch key can do: change record ``start``, relink every
    record after it and re-sign every checkpoint with the stolen key, keeping their epoch
    numbers and certified keys as they were."""
    out = list(lines[:start])
    changed = msgspec.structs.replace(lines[start].record, ct=base64.b64encode(b"forged").decode())
    out.append(StoredLine(lines[start].segment, encode_record(changed)))
    last_cp = next((ln.hash for ln in reversed(out) if ln.kind == "Checkpoint"), "0" * 64)
    for line in lines[start + 1 :]:
        rec = msgspec.structs.replace(line.record, prev=out[-1].hash)
        if isinstance(rec, Checkpoint):
            next_key = base64.b64decode(rec.next_key) if rec.next_key else b""
            msg = checkpoint_message_v2(
                rec.log, rec.seq, rec.prev, rec.t_us, last_cp, rec.final, rec.epoch, next_key
            )
            rec = msgspec.structs.replace(
                rec, prev_cp=last_cp, sig=base64.b64encode(thief.sign(msg)).decode()
            )
        data = encode_record(rec)
        out.append(StoredLine(line.segment, data))
        if isinstance(rec, Checkpoint):
            last_cp = record_hash(data)
    return out


def test_a_log_spans_several_epochs_and_keeps_only_the_current_key(
    tmp_path: Path, ks: KeySet
) -> None:
    log = _epoch_log(tmp_path, ks)
    report = verify(log, ks)
    assert report.verdict == "intact"
    assert report.format == 3
    assert report.epoch >= 4, report.epoch  # 13 checkpoints, a new key every 3
    files = epoch_key_files(epoch_dir(log), report.log_id)
    assert [e for e, _ in files] == [report.epoch]  # every earlier key was destroyed
    path = files[0][1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    _, _, signer = read_epoch_key(path)
    assert base64.b64encode(signer.public_bytes).decode() == report.epoch_key
    seed = path.read_bytes().split(b'"seed":"')[1].split(b'"')[0]
    for _, segment in ((0, p) for p in log.iterdir() if p.is_file()):
        assert seed not in segment.read_bytes()  # the private key never reaches the log


def test_a_key_stolen_now_cannot_resign_an_earlier_epoch(tmp_path: Path, ks: KeySet) -> None:
    log = _epoch_log(tmp_path, ks)
    lines = read_lines(log)
    boundaries = [ln for ln in lines if isinstance(ln.record, Checkpoint) and ln.record.next_key]
    assert len(boundaries) >= 3
    ((_, path),) = epoch_key_files(epoch_dir(log), lines[0].record.log)
    _, _, thief = read_epoch_key(path)  # the current key, stolen
    # Rewrite an event of epoch 2, well before the last epoch boundary, and re-sign.
    first_boundary = lines.index(boundaries[0])
    target = next(
        i for i in range(first_boundary + 1, len(lines)) if lines[i].kind == "EventRecord"
    )
    forged = resign(lines, target, thief)
    write_lines(log, forged)
    first_cp = next(ln for ln in forged[target:] if ln.kind == "Checkpoint")
    result = verify_cli(log, ks.verify_pub)  # verify.pub alone
    assert result.status == 1, result.stdout
    assert result.damage["kind"] == "bad_signature"
    assert result.damage["seq"] == first_cp.seq
    detail = str(result.damage["detail"])
    assert f"checkpoint {first_cp.seq} does not verify under the epoch-2 key" in detail
    assert f"certified by checkpoint {boundaries[0].seq}" in detail


def test_claiming_the_stolen_epoch_for_an_earlier_checkpoint_is_caught(
    tmp_path: Path, ks: KeySet
) -> None:
    log = _epoch_log(tmp_path, ks)
    lines = read_lines(log)
    ((_, path),) = epoch_key_files(epoch_dir(log), lines[0].record.log)
    _, stolen_epoch, thief = read_epoch_key(path)
    i = next(i for i, ln in enumerate(lines) if ln.kind == "Checkpoint")
    rec = lines[i].record
    assert isinstance(rec, Checkpoint)
    assert rec.epoch == 1
    msg = checkpoint_message_v2(
        rec.log, rec.seq, rec.prev, rec.t_us, rec.prev_cp, rec.final, stolen_epoch, b""
    )
    lines[i] = StoredLine(
        lines[i].segment,
        encode_record(
            msgspec.structs.replace(
                rec, epoch=stolen_epoch, sig=base64.b64encode(thief.sign(msg)).decode()
            )
        ),
    )
    write_lines(log, lines)
    report = verify(log, ks)
    assert report.damage is not None
    assert report.damage.kind == "bad_signature"
    assert report.damage.seq == rec.seq
    assert f"claims epoch {stolen_epoch}, but the log is in epoch 1" in report.damage.detail


async def _append(log: Path, ks: KeySet, n: int, *, root: bool) -> None:
    signing = ks.epoch_signing(epoch_dir(log), EVERY_3, root=root)
    async with LogWriter(
        log, ks.keyring(), signing, checkpoint_every=5, checkpoint_interval=3600
    ) as w:
        for i in range(n):
            await w.append(b"more-%d" % i)


def test_the_root_key_is_needed_once_then_can_go_offline(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    with pytest.raises(KeyFileError, match="needs the root signing key"):
        anyio.run(lambda: _append(log, ks, 1, root=False))
    assert not list(log.glob("seg-*"))  # nothing was written
    build_log(log, ks, 20, epochs=EVERY_3)
    before = verify(log, ks).epoch
    anyio.run(lambda: _append(log, ks, 30, root=False))  # no signing.key: epoch keys only
    report = verify(log, ks)
    assert report.verdict == "intact"
    assert report.epoch > before


def test_a_crash_between_rotation_and_destruction_is_reconciled_on_open(
    tmp_path: Path, ks: KeySet
) -> None:
    log = _epoch_log(tmp_path, ks, 20)
    log_id = verify(log, ks).log_id
    ((epoch, path),) = epoch_key_files(epoch_dir(log), log_id)
    # What a crash leaves: the previous epoch's key (not yet destroyed) and a next key that
    # no checkpoint certified.
    stale = epoch_dir(log) / path.name.replace(f"{epoch:08d}", f"{epoch - 1:08d}")
    uncertified = epoch_dir(log) / path.name.replace(f"{epoch:08d}", f"{epoch + 1:08d}")
    for extra in (stale, uncertified):
        extra.write_bytes(path.read_bytes())
        os.chmod(extra, 0o600)
    anyio.run(lambda: _append(log, ks, 1, root=False))
    assert [e for e, _ in epoch_key_files(epoch_dir(log), log_id)] == [verify(log, ks).epoch]
    assert verify(log, ks).verdict == "intact"


def test_a_lost_epoch_key_is_refused_with_the_fix(tmp_path: Path, ks: KeySet) -> None:
    log = _epoch_log(tmp_path, ks, 20)
    for _, path in epoch_key_files(epoch_dir(log), verify(log, ks).log_id):
        path.unlink()
    with pytest.raises(KeyFileError, match=r"is in epoch \d+ .*missing or holds another key"):
        anyio.run(lambda: _append(log, ks, 1, root=True))


def test_a_single_key_log_continues_in_its_own_format(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)  # format 2
    anyio.run(lambda: _append(log, ks, 10, root=True))
    report = verify(log, ks)
    assert (report.verdict, report.format, report.epoch) == ("intact", 2, 0)
    assert not epoch_dir(log).exists() or not any(epoch_dir(log).iterdir())
    with pytest.raises(KeyFileError, match="format 2"):
        anyio.run(lambda: _append(log, ks, 1, root=False))
