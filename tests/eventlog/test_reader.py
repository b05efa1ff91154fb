"""The reader: complete records only, incremental polls, follow, damage, `bide log head`."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from eventlog.envelope import EventRecord
from eventlog.errors import DamagedLogError
from eventlog.reader import LogReader, StoredRecord, read_payloads
from eventlog.segments import list_segments
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet, bide, build_log, read_lines, verify_cli


@pytest.mark.anyio
async def test_follow_yields_records_appended_by_a_writer_task(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    got: list[bytes] = []
    async with LogWriter(
        log,
        ks.keyring(),
        ks.signer(),
        segment_bytes=4096,
        checkpoint_every=10,
        checkpoint_interval=3600,
    ) as w:
        reader = LogReader(log, ks.keyring())
        stop = anyio.Event()

        async def follow() -> None:
            async for stored in reader.follow(stop):
                if isinstance(stored.record, EventRecord):
                    got.append(reader.decrypt(stored))
                    if len(got) == 60:
                        stop.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                for i in range(30):
                    await w.append(b"%d" % i)
                    await anyio.sleep(0.002)
                await w.append_many([b"%d" % i for i in range(30, 60)])
    assert got == [b"%d" % i for i in range(60)]


@pytest.mark.anyio
async def test_follow_sees_an_append_made_before_the_watch_started(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    async with LogWriter(log, ks.keyring(), ks.signer(), checkpoint_interval=3600) as w:
        reader = LogReader(log, ks.keyring())
        follow = reader.follow()
        first = await follow.__anext__()  # the genesis record, read before any watch exists
        assert first.seq == 0
        await w.append(b"late")  # lands before awatch is set up
        with anyio.fail_after(10):
            nxt: StoredRecord = await follow.__anext__()
        await follow.aclose()
        assert reader.decrypt(nxt) == b"late"


def test_reader_stops_at_a_broken_chain(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    path = list_segments(log)[1][1]
    lines = path.read_bytes().split(b"\n")
    lines[1], lines[2] = lines[2], lines[1]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DamagedLogError, match="breaks the chain"):
        list(read_payloads(log, ks.keyring()))


def test_partial_last_line_is_not_read_until_complete(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 5)
    path = list_segments(log)[-1][1]
    data = path.read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    path.write_bytes(data[: start + 10])
    reader = LogReader(log, ks.keyring())
    before = reader.poll()
    assert before[-1].seq == len(read_lines_prefix(log)) - 1
    with path.open("ab") as f:
        f.write(data[start + 10 :])
    after = reader.poll()
    assert len(after) == 1
    assert after[0].hash == read_lines(log)[-1].hash


def read_lines_prefix(log: Path) -> list[bytes]:
    data = b"".join(p.read_bytes() for _, p in list_segments(log))
    return data.split(b"\n")[:-1]


def test_log_head_prints_an_anchor_verify_accepts(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 12)
    proc = bide("log", "head", log)
    assert proc.returncode == 0, proc.stderr
    head = read_lines(log)[-1]
    assert proc.stdout.strip() == f"{head.seq}:{head.hash}"
    assert verify_cli(log, ks.verify_pub, "--anchor", proc.stdout.strip()).status == 0
    assert verify_cli(log, ks.verify_pub, "--anchor", "nonsense").status == 2
