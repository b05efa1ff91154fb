"""Archiving a log's first segments, in both signing modes (one key; forward-secure epochs):
the live log verifies from its boundary checkpoint alone, archives and live log verify as one
chain, the writer continues the archived log, and a forged boundary or a gap is caught."""

from __future__ import annotations

import gzip
import shutil
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec
import pytest

from eventlog.archive import (
    ArchiveError,
    Before,
    commit_archive,
    load_manifest,
    materialize,
    plan_archive,
    prepare_dest,
    verify_chain,
    write_archive,
)
from eventlog.boundary import read_boundary, start_from, verify_live
from eventlog.epochs import EpochSigning
from eventlog.errors import KeyFileError
from eventlog.keys import Signer
from eventlog.reader import ArchivedError, LogReader
from eventlog.segments import BOUNDARY_FILE, list_segments
from eventlog.store import local_head
from eventlog.writer import LogWriter
from tests.eventlog._logtools import EVERY_3, KeySet, epoch_dir, payload_for
from tests.eventlog.conftest import BaseLogs


@dataclass(frozen=True)
class Logs:
    keys: KeySet
    log: Path
    mode: str

    def signer(self, log: Path) -> Signer | EpochSigning:
        if self.mode == "single_key":
            return self.keys.signer()
        return self.keys.epoch_signing(epoch_dir(log), EVERY_3)


def _archive(log: Path, logs: Logs, dest: Path, before: int) -> None:
    plan = plan_archive(log, logs.keys.verify_key(), Before(seq=before), writer_live=False)
    manifest = write_archive(plan, dest, bide_version="test")
    commit_archive(log, manifest)


def _head(log: Path, logs: Logs) -> int:
    return verify_live(log, logs.keys.verify_key(), writer_live=False).head_seq


def _append(log: Path, logs: Logs, n: int) -> None:
    signer = logs.signer(log)

    async def run() -> None:
        async with LogWriter(
            log, logs.keys.keyring(), signer, segment_bytes=2048, checkpoint_every=5
        ) as w:
            for i in range(n):
                await w.append(payload_for(1000 + i))

    anyio.run(run)


@pytest.fixture
def logs(base_logs: BaseLogs, tmp_path: Path) -> Logs:
    """A private copy of the base log (and its epoch keys), to archive and damage."""
    log = tmp_path / "log"
    shutil.copytree(base_logs.log, log)
    if epoch_dir(base_logs.log).exists():
        shutil.copytree(epoch_dir(base_logs.log), epoch_dir(log))
    keys = tmp_path / "keys"
    shutil.copytree(base_logs.keys.directory, keys)
    return Logs(KeySet(keys), log, base_logs.mode)


def test_live_alone_and_archive_plus_live_verify(logs: Logs, tmp_path: Path) -> None:
    log = logs.log
    key = logs.keys.verify_key()
    whole = verify_live(log, key, writer_live=False)
    dest = tmp_path / "a1"
    _archive(log, logs, dest, whole.head_seq)
    assert not (log / "seg-00000001.jsonl").exists()
    live = verify_live(log, key, writer_live=False)
    assert live.verdict == "intact", live.damage
    assert live.head_seq == whole.head_seq
    assert live.records < whole.records
    assert local_head(log) == (live.head_seq, live.head_hash)  # the store's view agrees
    both = verify_chain([dest], log, key, writer_live=False)
    assert both.verdict == "intact", both.damage
    assert both.records == whole.records
    assert both.checkpoints == whole.checkpoints

    # The writer continues the archived log; both views stay intact.
    _append(log, logs, 40)
    assert verify_live(log, key, writer_live=False).verdict == "intact"
    dest2 = tmp_path / "a2"
    _archive(log, logs, dest2, _head(log, logs))
    assert verify_chain([dest2, dest], log, key, writer_live=False).verdict == "intact"
    assert verify_chain([dest2], log, key, writer_live=False).verdict == "intact"
    assert verify_live(log, key, writer_live=False).verdict == "intact"
    gap = verify_chain([dest], log, key, writer_live=False)
    assert gap.damage is not None
    assert gap.damage.kind == "missing"


def test_a_forged_boundary_is_bad_signature(logs: Logs, tmp_path: Path) -> None:
    log = logs.log
    _archive(log, logs, tmp_path / "a", _head(log, logs))
    boundary = read_boundary(log)
    assert boundary is not None
    cp = msgspec.json.decode(boundary.checkpoint)
    cp["t_us"] += 1
    forged = msgspec.structs.replace(boundary, checkpoint=msgspec.json.encode(cp).decode())
    (log / BOUNDARY_FILE).write_bytes(msgspec.json.encode(forged))
    report = verify_live(log, logs.keys.verify_key(), writer_live=False)
    assert report.damage is not None
    assert report.damage.kind == "bad_signature"
    if logs.mode == "epochs" and boundary.certs:
        stripped = msgspec.structs.replace(boundary, certs=[])
        (log / BOUNDARY_FILE).write_bytes(msgspec.json.encode(stripped))
        report = verify_live(log, logs.keys.verify_key(), writer_live=False)
        assert report.damage is not None
        assert report.damage.kind == "bad_signature"


def test_the_live_log_links_to_the_boundary(logs: Logs, tmp_path: Path) -> None:
    log = logs.log
    _archive(log, logs, tmp_path / "a", _head(log, logs))
    first = list_segments(log)[0][1]
    data = first.read_bytes()
    cut = data.index(b"\n") + 1
    first.write_bytes(data[cut:])  # the first record after the boundary is gone
    report = verify_live(log, logs.keys.verify_key(), writer_live=False)
    assert report.damage is not None


def test_readers_name_the_archive(logs: Logs, tmp_path: Path) -> None:
    log = logs.log
    dest = tmp_path / "archive-x"
    _archive(log, logs, dest, _head(log, logs))
    with pytest.raises(ArchivedError, match="archive-x"):
        LogReader(log, logs.keys.keyring())
    boundary = read_boundary(log)
    assert boundary is not None
    rest = LogReader(log, logs.keys.keyring(), from_boundary=True).poll()
    assert rest[0].seq == boundary.seq + 1


def test_shredding_reaches_across_the_boundary(logs: Logs, tmp_path: Path) -> None:
    """The archive holds ciphertext only; retiring the data key leaves every archived payload
    unreadable and the chain, archived and live, verifiable without any key but verify.pub."""
    log = logs.log
    dest = tmp_path / "a"
    _archive(log, logs, dest, _head(log, logs))
    text = b"".join(gzip.decompress(p.read_bytes()) for p in sorted(dest.glob("*.gz")))
    assert payload_for(3) not in text
    whole = materialize([dest], log, tmp_path / "whole")
    keyring = logs.keys.keyring()
    (logs.keys.directory / "data.key").unlink()  # shredded: no copy of the key is left
    assert len(list(LogReader(whole, keyring).payloads())) == 60  # read before, with the key
    with pytest.raises(KeyFileError):
        logs.keys.keyring()
    assert verify_chain([dest], log, logs.keys.verify_key(), writer_live=False).verdict == "intact"


def test_refusals(logs: Logs, tmp_path: Path) -> None:
    key = logs.keys.verify_key()
    with pytest.raises(ArchiveError, match="no signed checkpoint"):
        plan_archive(logs.log, key, Before(seq=0), writer_live=False)
    # The state snapshot's position bounds what may go.
    with pytest.raises(ArchiveError, match="state snapshot"):
        plan_archive(logs.log, key, Before(seq=10**9), writer_live=False, snapshot_seq=3)
    plan = plan_archive(logs.log, key, Before(seq=10**9), writer_live=True)
    live = list_segments(logs.log)
    assert plan.segments[-1][0] <= live[-3][0]  # the two newest stay with a writer running
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x").write_text("x")
    with pytest.raises(ArchiveError, match="not empty"):
        prepare_dest(dest, plan.log_id)


def test_manifest_describes_the_archive(logs: Logs, tmp_path: Path) -> None:
    log = logs.log
    before = {p.name: p.read_bytes() for _, p in list_segments(log)}
    dest = tmp_path / "a"
    _archive(log, logs, dest, _head(log, logs))
    m = load_manifest(dest)
    assert m.first_seq == 0
    assert m.start is None
    assert m.boundary == read_boundary(log)
    for e in m.segments:
        assert gzip.decompress((dest / e.file).read_bytes()) == before[e.name]
    start = start_from(m.boundary, logs.keys.verify_key())
    assert start.seq == m.last_seq


def test_putting_the_segments_back_makes_the_log_whole(logs: Logs, tmp_path: Path) -> None:
    """The operator's guide's way back: gunzip each archived segment into the log directory
    and remove archived.json; the log then verifies and reads from record 0 again."""
    log = logs.log
    whole = verify_live(log, logs.keys.verify_key(), writer_live=False)
    dest = tmp_path / "a"
    _archive(log, logs, dest, whole.head_seq)
    for e in load_manifest(dest).segments:
        (log / e.name).write_bytes(gzip.decompress((dest / e.file).read_bytes()))
    (log / BOUNDARY_FILE).unlink()
    again = verify_live(log, logs.keys.verify_key(), writer_live=False)
    assert again.verdict == "intact"
    assert again.records == whole.records
    assert len(list(LogReader(log, logs.keys.keyring()).payloads())) == 60
