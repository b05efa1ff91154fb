"""The log in PostgreSQL: durable appends/s at 1, 100 and 1,000 concurrent appenders against
the file store and SQLite (one transaction per record) in the same run; takeover time after
SIGKILL of the active node and after its database link is cut (median and max).

Each PostgreSQL run uses a fresh schema on ``--dsn`` (default ``$BIDE_TEST_POSTGRES_DSN``, else
the local server) and drops it. The server is whatever that DSN names, with its own
``synchronous_commit`` and fsync settings: the figures say what that server does.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg import sql

from eventlog import keys, pgstore
from tests.bench import bench_append
from tests.e2e.harness import drop_registration, until, workspace, write_status_profile
from tests.e2e.pgnodes import LEASE, Node, node_config, standby, start, wait_active
from tests.e2e.tcpproxy import proxy_to
from tests.pgsupport import base_dsn

PAYLOAD_BYTES = bench_append.PAYLOAD_BYTES


@contextmanager
def fresh_schema(dsn: str) -> Iterator[str]:
    schema = f"bide_bench_{secrets.token_hex(5)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            scoped = psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}")
            with pgstore.connect(pgstore.PgSettings(scoped)) as conn:
                pgstore.init_schema(conn)
            yield scoped
        finally:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


async def _pg_run(
    log_dir: Path, key_dir: Path, dsn: str, appenders: int, seconds: float
) -> tuple[int, int]:
    with pgstore.connect(pgstore.PgSettings(dsn)) as conn:
        epoch = pgstore.take_lease(conn, "bench", 3600)
    assert epoch is not None
    store = pgstore.PgStore(pgstore.PgSettings(dsn), epoch)
    try:
        count = await bench_append.log_run(log_dir, key_dir, appenders, seconds, store)
    finally:
        store.close()
    return count, store.commits


def pg_throughput(work: Path, dsn: str, appenders: int, seconds: float) -> tuple[int, float, int]:
    root = Path(tempfile.mkdtemp(prefix=f"pg-{appenders}-", dir=work))
    keys.generate(root / "keys")
    with fresh_schema(dsn) as scoped:
        started = time.perf_counter()
        count, commits = anyio.run(_pg_run, root / "log", root / "keys", scoped, appenders, seconds)
        return count, time.perf_counter() - started, commits


def appends(work: Path, dsn: str, seconds: float) -> dict[str, Any]:
    base_n, base_t = bench_append.sqlite_throughput(work, seconds)
    base = base_n / base_t
    rows = []
    for appenders in (1, 100, 1000):
        fn, ft = bench_append.log_throughput(work, appenders, seconds)
        pn, pt, commits = pg_throughput(work, dsn, appenders, seconds)
        rows.append(
            {
                "appenders": appenders,
                "files_per_s": round(fn / ft),
                "postgres_per_s": round(pn / pt),
                "postgres_commits": commits,
                "postgres_vs_files": round((pn / pt) / (fn / ft), 2),
                "postgres_vs_sqlite": round((pn / pt) / base, 2),
            }
        )
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()
    return {
        "payload_bytes": PAYLOAD_BYTES,
        "sqlite_per_s": round(base),
        "server": {
            "synchronous_commit": row[0] if row else "?",
            "fsync": fsync[0] if fsync else "?",
        },
        "rows": rows,
    }


JOBS: dict[str, str | list[object]] = {f"long-{i}": "running" for i in range(4)}
CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.3
default_deadline_seconds = 600
default_max_status_requests = 5000
default_max_transport_failures = 500
"""


def takeovers(work: Path, dsn: str, runs: int) -> dict[str, Any]:
    """Kill (then cut the link of) the active one of two nodes ``runs`` times each; the time
    from the kill or cut to the first status request the other node sends."""
    from daemon.spool import Spool

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
    out: dict[str, Any] = {"lease_seconds": LEASE}
    root = Path(tempfile.mkdtemp(prefix="takeover-", dir=work)).resolve()
    with (
        fresh_schema(dsn) as scoped,
        proxy_to(host, port) as pa,
        proxy_to(host, port) as pb,
        workspace(root, jobs=JOBS) as ws,
    ):
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        nodes = [
            node_config(
                ws, name, psycopg.conninfo.make_conninfo(scoped, host="127.0.0.1", port=str(p.port))
            )
            for name, p in (("a", pa), ("b", pb))
        ]
        proxies = {"a": pa, "b": pb}
        for n in nodes:
            start(ws, n)
        current = wait_active(nodes)
        other = next(n for n in nodes if n is not current)
        assert other.daemon is not None
        until(partial(standby, other.daemon), 20, "a standby")
        spool = Spool(current.state / "spool")
        for job in JOBS:
            drop_registration(ws, f"op-{job}", job, spool=spool)
        ws.sim.wait_for_requests(2 * len(JOBS), kind="status", timeout=20)
        for kind in ("sigkill", "lost_link"):
            times = []
            for _ in range(runs):
                seen = len(ws.sim.requests(kind="status"))
                ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
                others = [n for n in nodes if n is not current]
                took = {n.name: _count(n, TOOK) for n in others}
                stood = _count(current, STANDBY)
                t0 = time.monotonic()
                if kind == "sigkill":
                    assert current.daemon is not None
                    current.daemon.kill()
                else:
                    proxies[current.name].cut()
                until(partial(_took_over, others, took), LEASE + 20, "the other node to take over")
                nxt = next(n for n in others if _count(n, TOOK) > took[n.name])
                after = len(ws.sim.requests(kind="status"))
                ws.sim.wait_for_requests(after + 1, kind="status", timeout=10)
                times.append(time.monotonic() - t0)
                if kind == "sigkill":
                    start(ws, current)
                    until(partial(_stood_by, current, 0), 30, "a restarted standby")
                else:
                    proxies[current.name].restore()
                    until(partial(_stood_by, current, stood), 30, "the cut node to stand by again")
                current = nxt
            out[kind] = {
                "runs": runs,
                "median_s": round(statistics.median(times), 3),
                "max_s": round(max(times), 3),
                "all_s": [round(t, 3) for t in times],
            }
        for n in nodes:
            if n is not current and n.daemon is not None:
                n.daemon.stop()
        if current.daemon is not None:
            current.daemon.stop()
    return out


TOOK = "took the log's lease"
STANDBY = 'msg="standby: following the log"'


def _count(node: Node, marker: str) -> int:
    return 0 if node.daemon is None else int(node.daemon.output().count(marker))


def _took_over(others: list[Node], took: dict[str, int]) -> bool:
    """One of ``others`` took the lease since ``took`` (name -> times it had) was counted."""
    return any(_count(n, TOOK) > took[n.name] for n in others)


def _stood_by(node: Node, stood: int) -> bool:
    """``node`` went (back) to standby more than ``stood`` times."""
    return _count(node, STANDBY) > stood


def run(work: Path, seconds: float, dsn: str | None, runs: int) -> dict[str, Any]:
    dsn = dsn or base_dsn()
    return {"appends": appends(work, dsn, seconds), "takeover": takeovers(work, dsn, runs)}


def print_table(r: dict[str, Any]) -> None:
    a = r["appends"]
    print(
        f"\ndurable appends to PostgreSQL, {a['payload_bytes']}-byte payloads (server: "
        f"synchronous_commit={a['server']['synchronous_commit']}, "
        f"fsync={a['server']['fsync']}); sqlite txn/record: {a['sqlite_per_s']}/s"
    )
    print(
        f"  {'appenders':>9}{'files/s':>10}{'postgres/s':>12}{'commits':>9}{'pg/files':>10}"
        f"{'pg/sqlite':>11}"
    )
    for row in a["rows"]:
        print(
            f"  {row['appenders']:>9}{row['files_per_s']:>10}{row['postgres_per_s']:>12}"
            f"{row['postgres_commits']:>9}{row['postgres_vs_files']:>9}x"
            f"{row['postgres_vs_sqlite']:>10}x"
        )
    t = r["takeover"]
    print(f"\ntakeover time (to the other node's first request), lease {t['lease_seconds']}s")
    for kind in ("sigkill", "lost_link"):
        row = t[kind]
        print(
            f"  {kind:<10} median {row['median_s']}s  max {row['max_s']}s  over {row['runs']} runs"
        )
