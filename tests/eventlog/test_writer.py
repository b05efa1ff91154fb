"""The writer: group commit, order, checkpoints, I/O failures, recovery cases, file modes."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import anyio
import pytest

from eventlog.aio import SyncRing
from eventlog.envelope import Checkpoint, EventRecord, Recovery, Segment
from eventlog.errors import DamagedLogError, LogIOError
from eventlog.reader import LogReader
from eventlog.segments import QUARANTINE_DIR, list_segments, segment_name
from eventlog.verify import verify_log
from eventlog.writer import LOOP_ROUND_RECORDS, LogWriter
from tests.eventlog._logtools import KeySet, build_log, read_lines, verify

pytestmark = pytest.mark.anyio


def writer(log: Path, ks: KeySet, **kw: float | str) -> LogWriter:
    return LogWriter(log, ks.keyring(), ks.signer(), checkpoint_interval=3600, **kw)  # type: ignore[arg-type]


def failure(w: LogWriter) -> LogIOError | None:
    return w.failed


def payloads(log: Path, ks: KeySet) -> dict[int, bytes]:
    return dict(LogReader(log, ks.keyring()).payloads())


def count_fdatasync(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, every ``os.fdatasync`` (the writer thread's, never the kernel path's)
    goes through and is listed by its descriptor."""
    synced: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return synced


@pytest.mark.parametrize("sync", ["auto", "thread"])
async def test_group_commit_shares_fsyncs(tmp_path: Path, ks: KeySet, sync: str) -> None:
    log = tmp_path / "log"
    results: dict[int, int] = {}
    async with writer(log, ks, checkpoint_every=100_000, sync=sync) as w:
        assert w.sync_mode == ("kernel" if sync == "auto" else "thread")
        before = w.flushes

        async def one(i: int) -> None:
            results[i] = (await w.append(b"%d" % i)).seq

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(one, i)
        rounds = w.flushes - before
    assert len(set(results.values())) == 1000
    assert rounds <= 50, f"{rounds} durable rounds (fdatasync calls) for 1000 records"
    assert verify(log, ks).verdict == "intact"
    stored = payloads(log, ks)
    assert all(stored[seq] == b"%d" % i for i, seq in results.items())


async def test_plain_rounds_are_made_durable_by_the_kernel_not_a_thread(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On this kernel the event loop writes plain rounds and submits their fdatasync (AIO):
    the writer thread, and so ``os.fdatasync``, is left to checkpoints and new segments."""
    log = tmp_path / "log"
    async with writer(log, ks, checkpoint_every=100_000) as w:
        synced = count_fdatasync(monkeypatch)
        for i in range(50):
            await w.append(b"p%d" % i)
        assert w.flushes >= 50
        assert synced == []
        await w.checkpoint()  # a checkpoint goes to the thread
        assert len(synced) == 1
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [b"p%d" % i for i in range(50)]


async def test_a_large_round_is_framed_by_the_thread_beside_the_loop(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many appenders at once make a round larger than the loop frames itself
    (``LOOP_ROUND_RECORDS``): the thread writes it, so its framing runs beside the loop."""
    log = tmp_path / "log"
    async with writer(log, ks, checkpoint_every=100_000) as w:
        synced = count_fdatasync(monkeypatch)
        async with anyio.create_task_group() as tg:
            for i in range(4 * LOOP_ROUND_RECORDS):
                tg.start_soon(w.append, b"q%d" % i)
        assert synced, "no round went to the thread"
        await w.append(b"alone")  # one record again: the loop's
        assert w.sync_mode == "kernel"
    assert verify(log, ks).verdict == "intact"
    assert len(payloads(log, ks)) == 4 * LOOP_ROUND_RECORDS + 1


async def test_each_task_keeps_its_order(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    async with writer(log, ks, segment_bytes=8192, checkpoint_every=7) as w:

        async def task(t: int) -> None:
            for i in range(20):
                if i % 4 == 3:
                    await w.append_many([b"%d:%d" % (t, i), b"%d:%d+" % (t, i)])
                else:
                    await w.append(b"%d:%d" % (t, i))

        async with anyio.create_task_group() as tg:
            for t in range(40):
                tg.start_soon(task, t)
    seen: dict[bytes, list[bytes]] = {}
    for _, payload in sorted(payloads(log, ks).items()):
        who, index = payload.split(b":")
        seen.setdefault(who, []).append(index)
    expected = []
    for i in range(20):
        expected.append(b"%d" % i)
        if i % 4 == 3:
            expected.append(b"%d+" % i)
    assert len(seen) == 40
    assert all(order == expected for order in seen.values())
    assert verify(log, ks).verdict == "intact"


async def test_checkpoint_every_n_records_and_final_on_close(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    async with writer(log, ks, checkpoint_every=5) as w:
        for i in range(12):
            await w.append(b"%d" % i)
    kinds = [(line.kind, line.record) for line in read_lines(log)]
    cps = [rec for kind, rec in kinds if isinstance(rec, Checkpoint)]
    events = [rec.seq for _, rec in kinds if isinstance(rec, EventRecord)]
    # Right after events 5 and 10 (each write of one event ends with a seal), then the final.
    assert [cp.seq for cp in cps] == [events[4] + 1, events[9] + 1, kinds[-1][1].seq]
    assert [cp.final for cp in cps] == [False, False, True]
    assert isinstance(kinds[-1][1], Checkpoint)
    report = verify(log, ks)
    assert report.clean_close
    assert report.unsigned_tail == 0


async def test_idle_writer_keeps_checkpointing(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    async with LogWriter(log, ks.keyring(), ks.signer(), checkpoint_interval=0.05) as w:
        await w.append(b"one")
        await anyio.sleep(0.5)
    cps = [line.record for line in read_lines(log) if line.kind == "Checkpoint"]
    assert len(cps) >= 4
    assert sum(cp.final for cp in cps if isinstance(cp, Checkpoint)) == 1
    times = [cp.t_us for cp in cps if isinstance(cp, Checkpoint)]
    assert times == sorted(times)
    assert verify(log, ks).verdict == "intact"


async def test_failed_write_stops_the_writer_until_reopen(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    real_write = os.write
    full = False

    def write(fd: int, data: bytes | memoryview) -> int:
        if full and bytes(data[:8]) == b'{"kind":':
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    async with writer(log, ks, checkpoint_every=4) as w:
        for i in range(10):
            await w.append(b"before %d" % i)
        full = True
        with pytest.raises(LogIOError, match="No space left"):
            await w.append(b"lost")
        assert failure(w) is not None
        full = False  # space is back, but the writer does not retry on its own
        with pytest.raises(LogIOError):
            await w.append(b"still refused")
        await w.reopen()
        assert failure(w) is None
        for i in range(5):
            await w.append(b"after %d" % i)
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [
        *(b"before %d" % i for i in range(10)),
        *(b"after %d" % i for i in range(5)),
    ]


async def test_failed_batch_is_cut_so_a_retry_does_not_duplicate(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    real_write = os.write
    torn = False

    def write(fd: int, data: bytes | memoryview) -> int:
        if torn and bytes(data[:8]) == b'{"kind":':
            # The disk fills up mid-write: the first record lands whole, the second half.
            first = bytes(data).index(b"\n") + 1
            real_write(fd, bytes(data[: first + (len(data) - first) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    async with writer(log, ks) as w:
        await w.append(b"kept")
        torn = True
        with pytest.raises(LogIOError):
            await w.append_many([b"x" * 100, b"y" * 100])
        torn = False
        await w.reopen()
        assert w.recovered is None  # nothing torn was left: the failed batch was cut whole
        await w.append_many([b"x" * 100, b"y" * 100])  # the caller's retry
        await w.append(b"later")
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [b"kept", b"x" * 100, b"y" * 100, b"later"]


async def test_failed_fsync_is_not_retried_on_the_same_descriptor(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "log"
    real = os.fdatasync
    failing: set[int] = set()
    used_after_failure: list[int] = []

    real_close = os.close

    def fdatasync(fd: int) -> None:
        if fd in failing:
            used_after_failure.append(fd)
        if broken:
            failing.add(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    def close(fd: int) -> None:
        failing.discard(fd)  # the number may be reused by the next open
        real_close(fd)

    broken = False
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "close", close)
    async with writer(log, ks, sync="thread") as w:
        await w.append(b"a")
        broken = True
        with pytest.raises(LogIOError, match="Input/output error"):
            await w.append(b"b")
        broken = False
        await w.reopen()
        await w.append(b"c")
    assert used_after_failure == []
    assert verify(log, ks).verdict == "intact"
    assert payloads(log, ks)[1] == b"a"


async def test_a_failed_kernel_fdatasync_fails_the_round_and_cuts_it(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk's EIO arrives as the AIO completion's result (injected here, at the kernel's
    answer): the round fails like a failed ``os.fdatasync``, its bytes are cut, the descriptor
    is never synced again, and after ``reopen`` appending goes on."""
    log = tmp_path / "log"
    real_reap, real_submit, real_close = SyncRing.reap, SyncRing.submit, os.close
    failing: set[int] = set()
    used_after_failure: list[int] = []
    submitted: list[int] = []

    def submit(ring: SyncRing, fd: int) -> None:
        if fd in failing:
            used_after_failure.append(fd)
        submitted.append(fd)
        real_submit(ring, fd)

    def reap(ring: SyncRing) -> int | None:
        result = real_reap(ring)
        if broken and result == 0:
            failing.add(submitted[-1])
            return -errno.EIO
        return result

    def close(fd: int) -> None:
        failing.discard(fd)
        real_close(fd)

    broken = False
    monkeypatch.setattr(SyncRing, "submit", submit)
    monkeypatch.setattr(SyncRing, "reap", reap)
    monkeypatch.setattr(os, "close", close)
    async with writer(log, ks) as w:
        assert w.sync_mode == "kernel"
        await w.append(b"a")
        size = sum(p.stat().st_size for _, p in list_segments(log))
        broken = True
        with pytest.raises(LogIOError, match="Input/output error"):
            await w.append(b"b")
        broken = False
        assert sum(p.stat().st_size for _, p in list_segments(log)) == size  # cut at once
        with pytest.raises(LogIOError):
            await w.append(b"refused until reopen")
        await w.reopen()
        await w.append(b"c")
    assert used_after_failure == []
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [b"a", b"c"]


async def test_a_refused_kernel_fdatasync_hands_the_round_to_the_thread(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the kernel refuses to start an fdatasync (io_submit fails after the round is
    written), nothing is lost: the thread makes that round durable, the writer says so, and
    every later round stays on the thread."""
    log = tmp_path / "log"
    problems: list[str] = []

    def refuse(ring: SyncRing, fd: int) -> None:
        raise OSError(errno.EAGAIN, "io_submit: Resource temporarily unavailable")

    async with LogWriter(
        log, ks.keyring(), ks.signer(), checkpoint_interval=3600, on_problem=problems.append
    ) as w:
        await w.append(b"a")
        monkeypatch.setattr(SyncRing, "submit", refuse)
        await w.append(b"b")
        assert w.sync_mode == "thread"
        assert w.failed is None
        await w.append(b"c")
    assert any("refused an asynchronous fdatasync" in p for p in problems)
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [b"a", b"b", b"c"]


def test_damaged_log_refuses_to_open(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    lines = read_lines(log)
    path = list_segments(log)[1][1]
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"seq":', b'"seq": ', 1))
    before = {p.name: p.read_bytes() for _, p in list_segments(log)}
    with pytest.raises(DamagedLogError, match="refusing to append"):
        build_log(log, ks, 1)
    assert {p.name: p.read_bytes() for _, p in list_segments(log)} == before
    assert len(lines) > 20


def _reopen_and_extend(log: Path, ks: KeySet, events: int) -> Recovery | None:
    async def run() -> Recovery | None:
        async with writer(log, ks, segment_bytes=2048, checkpoint_every=5) as w:
            for i in range(events):
                await w.append(b"more %d" % i)
            return w.recovered

    return anyio.run(run)


@pytest.mark.parametrize("content", [b"", b'{"kind":"segment","seq":'], ids=["empty", "torn"])
def test_crash_while_starting_a_segment(tmp_path: Path, ks: KeySet, content: bytes) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 30)
    index = list_segments(log)[-1][0]
    new = log / segment_name(index + 1)
    new.write_bytes(content)
    assert verify(log, ks).verdict == "torn_tail"
    recovered = _reopen_and_extend(log, ks, 40)  # enough to rotate into the same name again
    assert recovered is not None
    assert recovered.segment == new.name
    assert recovered.cut_len == len(content)
    assert (log / recovered.quarantine).read_bytes() == content
    report = verify(log, ks)
    assert report.verdict == "intact"
    assert report.segments > index + 1
    assert any(
        isinstance(line.record, Segment) and line.record.index == index + 1
        for line in read_lines(log)
    )


def test_crash_while_writing_genesis(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    fragment = b'{"kind":"genesis","seq":0,"pr'
    (log / segment_name(1)).write_bytes(fragment)
    recovered = _reopen_and_extend(log, ks, 3)
    assert recovered is not None
    assert recovered.seq == 1
    assert hashlib.sha256(fragment).hexdigest() == recovered.cut_sha256
    assert verify(log, ks).verdict == "intact"
    assert list(payloads(log, ks).values()) == [b"more 0", b"more 1", b"more 2"]


def test_file_modes(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "state" / "log"
    build_log(log, ks, 40)
    with list_segments(log)[-1][1].open("ab") as f:
        f.write(b"\x00\x00")  # a torn tail, so the quarantine gets created
    _reopen_and_extend(log, ks, 1)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(log) == 0o700
    assert len(list_segments(log)) > 3
    assert {mode(p) for _, p in list_segments(log)} == {0o600}
    assert mode(log / "LOCK") == 0o600
    assert mode(log / QUARANTINE_DIR) == 0o700
    assert {mode(p) for p in (log / QUARANTINE_DIR).iterdir()} == {0o600}
    assert mode(ks.directory) == 0o700
    assert mode(ks.directory / "data.key") == 0o600
    assert mode(ks.directory / "signing.key") == 0o600
    assert mode(ks.directory / "verify.pub") == 0o644


async def test_appends_return_their_seq_and_hash(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    async with writer(log, ks) as w:
        done = await w.append_many([b"a", b"b"])
        one = await w.append(b"c")
        assert w.head_seq == one.seq + 1  # the write's seal
    assert [line.kind for line in read_lines(log)][one.seq :] == [
        "EventRecord",
        "Seal",
        "Checkpoint",
    ]
    stored = {s.seq: s for s in LogReader(log).poll()}
    for a in [*done, one]:
        assert stored[a.seq].hash == a.hash
        assert isinstance(stored[a.seq].record, EventRecord)
    assert verify_log(log, ks.verify_key()).head_seq == one.seq + 2  # the final checkpoint


async def test_cancelled_appender_waits_for_its_record(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    async with writer(log, ks) as w:
        folded: list[int] = []
        with anyio.move_on_after(0) as scope:
            await w.append_many(
                [b"queued, then cancelled"], on_durable=lambda: folded.append(w.head_seq)
            )
        assert scope.cancelled_caught
        assert w.head_seq == 2  # the record (and its seal) was written before the
        assert folded == [2]  # cancellation went on, and its caller could still fold it
        await w.append(b"next")
    assert list(payloads(log, ks).values()) == [b"queued, then cancelled", b"next"]


async def test_several_cuts_on_one_reopen_keep_the_signed_checkpoint_promise(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed batch that spans a segment rotation, whose cut also fails, leaves two cuts for
    reopen to record; with the unsigned run nearly full, the recovery records and the next
    append must still verify (a checkpoint is signed before the run would overflow)."""
    log = tmp_path / "log"
    async with writer(log, ks, segment_bytes=1 << 20, checkpoint_every=5) as w:
        for i in range(4):
            await w.append(f"p{i}".encode())
        w._segment_bytes = w._segment_size + 1  # the batch's second record starts a segment
        real = os.fdatasync
        calls = 0

        def failing_second(fd: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError(errno.EIO, "EIO")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", failing_second)
        monkeypatch.setattr(LogWriter, "_roll_back", lambda self, index, size: False)
        with pytest.raises(LogIOError):
            await w.append_many([b"a", b"b"])
        monkeypatch.setattr(os, "fdatasync", real)
        await w.reopen()
        assert w.recovered is not None
        await w.append(b"after")
    report = verify(log, ks)
    assert report.verdict == "intact", report.damage


async def test_a_heads_file_failure_after_a_durable_write_fails_nothing(
    tmp_path: Path, ks: KeySet
) -> None:
    """The records are durable before the heads file is written: a failure there is reported,
    and the callers are told their records landed (told otherwise, they would append them
    again, and the log would hold them twice)."""
    from eventlog.heads import HeadStore

    log, blocked = tmp_path / "log", tmp_path / "heads.jsonl"
    problems: list[str] = []
    async with LogWriter(
        log,
        ks.keyring(),
        ks.signer(),
        heads=HeadStore(blocked),
        on_problem=problems.append,
        checkpoint_every=2,
        checkpoint_interval=3600,
    ) as w:
        blocked.mkdir()  # from now on, opening it for writing fails (EISDIR)
        for i in range(5):
            await w.append(b"p%d" % i)
        assert w.failed is None
    assert sorted(payloads(log, ks).values()) == [b"p%d" % i for i in range(5)]
    assert verify(log, ks).damage is None
    assert problems
    assert all("could not be recorded" in p and str(blocked) in p for p in problems)


async def test_a_bug_in_the_writer_thread_fails_the_append_instead_of_hanging(
    tmp_path: Path, ks: KeySet
) -> None:
    from eventlog.signing import SingleKey

    class Broken(SingleKey):
        def checkpoint(self, *args: object, **kwargs: object) -> Checkpoint:
            raise ValueError("a bug")

    problems: list[str] = []
    async with LogWriter(
        tmp_path / "log",
        ks.keyring(),
        Broken(ks.signer()),
        on_problem=problems.append,
        checkpoint_every=1,
        checkpoint_interval=3600,
    ) as w:
        with anyio.fail_after(10), pytest.raises(LogIOError, match="internal error"):
            await w.append(b"x")
        assert w.failed is not None
    assert any("ValueError: a bug" in p for p in problems)
