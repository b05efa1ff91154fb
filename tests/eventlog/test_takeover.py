"""A takeover in the chain: the checkpoint a node writes first after taking the log's lease
names the node and the lease epoch, under its signature; ``verify`` lists the takeovers and
refuses an altered one or one whose epoch does not grow."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from eventlog.envelope import Checkpoint, Takeover
from eventlog.signing import CheckpointSigning
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from tests.eventlog._logtools import (
    EVERY_3,
    KeySet,
    StoredLine,
    epoch_dir,
    payload_for,
    read_lines,
    verify,
    write_lines,
)


def _terms(
    log_dir: Path, ks: KeySet, epochs: list[int], signing: CheckpointSigning | None = None
) -> None:
    """One writer open per lease epoch: its takeover checkpoint, then a few events."""

    async def run() -> None:
        for i, epoch in enumerate(epochs):
            async with LogWriter(
                log_dir,
                ks.keyring(),
                signing or ks.signer(),
                checkpoint_every=4,
                checkpoint_interval=3600,
            ) as w:
                await w.checkpoint(Takeover(lease_epoch=epoch, holder=f"node-{i}/{100 + i}/ab"))
                for n in range(5):
                    await w.append(payload_for(10 * i + n))

    anyio.run(run)


def _takeover_lines(log_dir: Path) -> list[StoredLine]:
    return [
        ln
        for ln in read_lines(log_dir)
        if isinstance(ln.record, Checkpoint) and ln.record.lease_epoch
    ]


@pytest.mark.parametrize("forward_secure", [False, True], ids=["single-key", "epoch-keys"])
def test_takeovers_are_signed_records_that_verify_lists_in_order(
    ks: KeySet, tmp_path: Path, forward_secure: bool
) -> None:
    log_dir = tmp_path / "log"
    signing = ks.epoch_signing(epoch_dir(log_dir), EVERY_3) if forward_secure else None
    _terms(log_dir, ks, [1, 2, 5], signing)
    report = verify(log_dir, ks)
    assert report.damage is None
    assert [(epoch, holder) for _, epoch, holder in report.takeovers] == [
        (1, "node-0/100/ab"),
        (2, "node-1/101/ab"),
        (5, "node-2/102/ab"),
    ]
    assert [seq for seq, _, _ in report.takeovers] == [ln.seq for ln in _takeover_lines(log_dir)]


def test_an_altered_takeover_fails_its_signature(ks: KeySet, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    _terms(log_dir, ks, [1, 2])
    lines = read_lines(log_dir)
    target = _takeover_lines(log_dir)[1]
    i = next(k for k, ln in enumerate(lines) if ln.data == target.data)
    forged = msgspec.structs.replace(target.record, holder="intruder/1/ff")
    lines[i] = StoredLine(target.segment, msgspec.json.encode(forged))
    write_lines(log_dir, lines)
    report = verify(log_dir, ks)
    assert report.damage is not None
    assert (report.damage.kind, report.damage.seq) == ("bad_signature", target.seq)


def test_a_takeover_whose_lease_epoch_does_not_grow_is_damage(ks: KeySet, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    _terms(log_dir, ks, [3, 3])  # signed by the key, but a lease epoch is never taken twice
    report = verify(log_dir, ks)
    assert report.damage is not None
    second = _takeover_lines(log_dir)[1].seq
    assert (report.damage.kind, report.damage.seq) == ("bad_signature", second)
    assert "lease epochs only grow" in report.damage.detail


def test_a_resumed_verification_still_requires_the_lease_epoch_to_grow(
    ks: KeySet, tmp_path: Path
) -> None:
    """The writer verifies on open from the snapshot's position: the last takeover's epoch
    travels in that position, so a later takeover that does not exceed it is still caught."""
    log_dir = tmp_path / "log"
    _terms(log_dir, ks, [4])
    first = verify(log_dir, ks)
    assert first.damage is None
    position = first.position()
    assert position.lease_epoch == 4
    _terms(log_dir, ks, [4])  # a second term claiming the same epoch, after the position
    resumed = verify_log(log_dir, ks.verify_key(), resume=position)
    assert resumed.resumed_at == position.seq
    assert resumed.damage is not None
    assert "lease epochs only grow" in resumed.damage.detail
