"""Durable append throughput: LogWriter with 1, 100, 1000 concurrent appenders vs SQLite.

The baseline is what a user would otherwise pick to keep poll state: SQLite in WAL mode with
``synchronous=FULL``, each record committed as its own transaction (an INSERT of a blob of the
same size), on one connection in one thread, sequentially. SQLite allows one writer at a time,
so more threads would only add lock contention to the same per-commit fsync; sequential is the
baseline's best case. Both write to the same file system.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path

import anyio

from eventlog import keys
from eventlog.store import LineStore
from eventlog.writer import LogWriter
from tests.bench import bench_floor, bench_many_floor

PAYLOAD_BYTES = 256


async def log_run(
    log_dir: Path, key_dir: Path, appenders: int, seconds: float, store: LineStore | None = None
) -> int:
    """Records appended durably by ``appenders`` concurrent tasks for ``seconds``, each
    awaiting its own append before the next; ``store``: each round also committed there."""
    payload = os.urandom(PAYLOAD_BYTES)
    count = 0
    async with LogWriter(
        log_dir,
        keys.load_keyring(key_dir),
        keys.load_signer(key_dir),
        checkpoint_every=1000,
        store=store,
    ) as log:
        deadline = time.perf_counter() + seconds

        async def appender() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                await log.append(payload)
                count += 1

        async with anyio.create_task_group() as tg:
            for _ in range(appenders):
                tg.start_soon(appender)
    return count


def log_throughput(work: Path, appenders: int, seconds: float) -> tuple[int, float]:
    """(records, seconds) appended durably by ``appenders`` concurrent tasks."""
    root = Path(tempfile.mkdtemp(prefix=f"append-{appenders}-", dir=work))
    keys.generate(root / "keys")
    started = time.perf_counter()
    count = anyio.run(log_run, root / "log", root / "keys", appenders, seconds)
    return count, time.perf_counter() - started


def sqlite_throughput(work: Path, seconds: float) -> tuple[int, float]:
    """(records, seconds) for one-transaction-per-record SQLite, WAL, synchronous=FULL."""
    root = Path(tempfile.mkdtemp(prefix="sqlite-", dir=work))
    db = sqlite3.connect(root / "state.db", isolation_level=None)
    try:
        assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
        payload = os.urandom(PAYLOAD_BYTES)
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            db.execute("BEGIN")
            db.execute("INSERT INTO events (payload) VALUES (?)", (payload,))
            db.execute("COMMIT")
            count += 1
        return count, time.perf_counter() - started
    finally:
        db.close()


def run(work: Path, seconds: float) -> dict[str, object]:
    base_n, base_t = sqlite_throughput(work, seconds)
    base = base_n / base_t
    rows = []
    for appenders in (1, 100, 1000):
        n, t = log_throughput(work, appenders, seconds)
        rows.append(
            {
                "appenders": appenders,
                "records": n,
                "seconds": round(t, 3),
                "records_per_s": round(n / t),
                "ratio_vs_sqlite": round(n / t / base, 2),
            }
        )
    many_floor: dict[str, float] = dict(bench_many_floor.run(PAYLOAD_BYTES, seconds))
    many_floor["ratio_vs_sqlite"] = round(many_floor["records_per_s"] / base, 2)
    return {
        "payload_bytes": PAYLOAD_BYTES,
        "floor": bench_floor.run(work, seconds),
        "many_floor": many_floor,
        "sqlite": {
            "mode": "WAL, synchronous=FULL, one transaction per record, sequential "
            "(one connection, one thread)",
            "records": base_n,
            "seconds": round(base_t, 3),
            "records_per_s": round(base),
        },
        "eventlog": rows,
    }
