"""Where one appender's floor is: the pieces of a durable append, each alone, in one run.

The one-appender goal compares the log with SQLite committing in its caller's thread. The
daemon cannot do that: its event loop must never block on ``fdatasync`` (every other poll,
answer and API client would wait), so each append crosses to a thread and back. These rows
take that cost apart, each against the same SQLite baseline measured in the same run:

    sqlite, direct              the baseline: WAL, ``synchronous=FULL``, a transaction per record
    sqlite, behind a hand-off   the same commits, driven from an asyncio loop the way any
                                non-blocking daemon must: queued to one thread, answered with
                                ``call_soon_threadsafe`` (what the log's writer thread does)
    hand-off alone              that round trip with no I/O at all
    write+fdatasync, growing    one ``write`` and ``fdatasync`` per record on an append-only file
    write+fdatasync, pre-written the same over a file already written (as SQLite's WAL is reused)
    ... behind a hand-off       both again, crossed to a thread and back
    ... through the kernel      both again from the asyncio loop, the ``fdatasync`` submitted
                                to the kernel (``eventlog.aio``) and answered on its eventfd:
                                no thread at all, what the log does where the kernel can

The log's own one-appender figure (``bench_append``) sits on top of "write+fdatasync, growing,
through the kernel" (or "behind a hand-off" where the kernel cannot), plus framing and
encryption.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eventlog.aio import open_ring

RECORD_BYTES = 700  # about one event line and its seal line, 256-byte payload
PREWRITTEN_BYTES = 64 * 1024 * 1024

Op = Callable[[], None]


def _rate(op: Op, seconds: float) -> float:
    count, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        op()
        count += 1
    return count / (time.perf_counter() - started)


def _behind_handoff(op: Op, seconds: float) -> float:
    """Records/s with one asyncio task awaiting each ``op``, run by a thread fed by a queue
    under a condition variable and answering with ``call_soon_threadsafe``."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        cv = threading.Condition()
        queue: list[asyncio.Future[None]] = []
        stopping = False

        def worker() -> None:
            while True:
                with cv:
                    while not queue and not stopping:
                        cv.wait()
                    if not queue:
                        return
                    taken = queue[:]
                    queue.clear()
                for _ in taken:
                    op()
                for future in taken:
                    loop.call_soon_threadsafe(future.set_result, None)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        count, started = 0, time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            future = loop.create_future()
            with cv:
                queue.append(future)
                cv.notify()
            await future
            count += 1
        elapsed = time.perf_counter() - started
        with cv:
            stopping = True
            cv.notify()
        thread.join()
        return count / elapsed

    return asyncio.run(main())


def _through_kernel(root: Path, prewritten: bool, seconds: float) -> float:
    """Records/s with one asyncio task writing each record and awaiting its ``fdatasync``,
    submitted to the kernel and answered on an eventfd the loop watches."""
    append, close = _file(root, prewritten)
    fd = append.fd  # type: ignore[attr-defined]
    record = os.urandom(RECORD_BYTES)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        ring = open_ring(fd)
        if ring is None:
            return 0.0
        waiting: list[asyncio.Future[None]] = []

        def ready() -> None:
            if ring.reap() is not None:
                waiting.pop().set_result(None)

        loop.add_reader(ring.fileno(), ready)
        count, started = 0, time.perf_counter()
        deadline = started + seconds
        try:
            while time.perf_counter() < deadline:
                os.write(fd, record)
                waiting.append(loop.create_future())
                ring.submit(fd)
                await waiting[-1]
                count += 1
            return count / (time.perf_counter() - started)
        finally:
            loop.remove_reader(ring.fileno())
            ring.close()

    try:
        return asyncio.run(main())
    finally:
        close()


def _sqlite(root: Path) -> tuple[Op, Callable[[], None]]:
    db = sqlite3.connect(
        root / f"state-{time.monotonic_ns()}.db", isolation_level=None, check_same_thread=False
    )
    assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
    payload = os.urandom(256)

    def commit() -> None:
        db.execute("BEGIN")
        db.execute("INSERT INTO events (payload) VALUES (?)", (payload,))
        db.execute("COMMIT")

    return commit, db.close


def _file(root: Path, prewritten: bool) -> tuple[Op, Callable[[], None]]:
    fd = os.open(root / f"file-{time.monotonic_ns()}", os.O_WRONLY | os.O_CREAT, 0o600)
    if prewritten:
        zeros = bytes(1024 * 1024)
        for _ in range(PREWRITTEN_BYTES // len(zeros)):
            os.write(fd, zeros)
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    record = os.urandom(RECORD_BYTES)

    def append() -> None:
        os.write(fd, record)
        os.fdatasync(fd)

    append.fd = fd  # type: ignore[attr-defined]
    return append, lambda: os.close(fd)


def run(work: Path, seconds: float, rounds: int = 3) -> dict[str, object]:
    """Records/s of every row, best of ``rounds`` (the rows take turns, so a slow spell of
    the disk falls on all of them), and each as a ratio to SQLite direct."""
    root = Path(tempfile.mkdtemp(prefix="floor-", dir=work))
    rows: dict[str, list[float]] = {}

    def measure(
        label: str,
        make: Callable[[], tuple[Op, Callable[[], None]]],
        driver: Callable[[Op, float], float],
    ) -> None:
        op, close = make()
        try:
            rows.setdefault(label, []).append(driver(op, seconds))
        finally:
            close()

    def nothing() -> tuple[Op, Callable[[], None]]:
        return (lambda: None), (lambda: None)

    for _ in range(rounds):
        sqlite = functools.partial(_sqlite, root)
        measure("sqlite, direct", sqlite, _rate)
        measure("sqlite, behind a hand-off", sqlite, _behind_handoff)
        measure("hand-off alone", nothing, _behind_handoff)
        for prewritten, name in ((False, "growing"), (True, "pre-written")):
            make = functools.partial(_file, root, prewritten)
            measure(f"write+fdatasync, {name}", make, _rate)
            measure(f"write+fdatasync, {name}, behind a hand-off", make, _behind_handoff)
            rows.setdefault(f"write+fdatasync, {name}, through the kernel", []).append(
                _through_kernel(root, prewritten, seconds)
            )
    base = max(rows["sqlite, direct"])
    return {
        label: {
            "records_per_s": round(max(rates)),
            "spread": [round(min(rates)), round(max(rates))],
            "us_per_record": round(1e6 / max(rates), 1),
            "ratio_vs_sqlite": round(max(rates) / base, 2),
        }
        for label, rates in rows.items()
    }
