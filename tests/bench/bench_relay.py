"""Registrations through a node that does not hold the operation's shard (the relay through
``bide_intake``) against the same registrations through the node that holds it, in one run.

Two nodes in this process (as ``tests/shards/support.py`` builds them: each shard a real
engine on its own file-store log, the catalog in a real PostgreSQL schema made for the run
and dropped after it), 2 shards, node ``b`` holding shard 1. ``count`` registrations of
distinct shard-1 ids are sent ``concurrency`` at a time, first straight to ``b``'s router
(recorded by b's engine, no relay), then to ``a``'s (each one sealed into a row, woken by
``NOTIFY``, taken by b's relay, recorded, answered into the row, read back by a). Reported:
registrations/s of each, their ratio, and this process's CPU per registration (both nodes
are in it; PostgreSQL's CPU is not counted). Each registration is durable (fsync) before it
is answered in both cases.

``python -m tests.bench.bench_relay [--dsn DSN] [--count N] [--concurrency C]``
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg import sql

from daemon.api.server import Response
from daemon.config import ApiConfig
from tests.pgsupport import base_dsn, drop_schemas
from tests.shards.support import Node, catalog, prepare, request, shard_ids, two_nodes

_API = ApiConfig(
    registrations_per_second=1e9, registrations_burst=1_000_000, max_live_per_principal=10_000_000
)


async def _register(node: Node, ids: list[str], concurrency: int) -> tuple[float, float]:
    """Wall seconds and process CPU seconds to register ``ids`` through ``node``."""
    pending = iter(ids)
    failures: list[Response] = []

    async def worker() -> None:
        for op in pending:
            body = {"provider": "sim", "job_id": f"job-{op}", "operation_id": op}
            got = await node.router.handle(request("POST", "/v1/operations", body))
            if got.status != 201:
                failures.append(got)

    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if failures:
        raise RuntimeError(f"{len(failures)} registrations failed: {failures[0].body[:200]!r}")
    return wall, cpu


def run(dsn: str, count: int, concurrency: int) -> dict[str, Any]:
    schema = f"bide_bench_{secrets.token_hex(4)}"
    admin = psycopg.connect(dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    here = psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}")
    try:
        with tempfile.TemporaryDirectory(prefix="bide-bench-relay-") as tmp:
            root = Path(tmp)
            prepare(root)
            layout = catalog(here, 2)
            ids = shard_ids(layout, 1, 2 * count, prefix="bench")
            result: dict[str, Any] = {}

            async def main() -> None:
                async with two_nodes(root, here, layout, api=_API) as (a, b):
                    await _register(b, shard_ids(layout, 1, 20, prefix="warm"), concurrency)
                    held = await _register(b, ids[:count], concurrency)
                    relayed = await _register(a, ids[count:], concurrency)
                for name, (wall, cpu) in (("holder", held), ("non_holder", relayed)):
                    result[name] = {
                        "registrations_per_second": round(count / wall, 1),
                        "cpu_ms_per_registration": round(1000 * cpu / count, 3),
                    }
                result["ratio_non_holder_to_holder"] = round(
                    result["non_holder"]["registrations_per_second"]
                    / result["holder"]["registrations_per_second"],
                    3,
                )

            anyio.run(main)
            return {"count": count, "concurrency": concurrency, **result}
    finally:
        drop_schemas(admin, schema)
        admin.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_relay", description=__doc__)
    p.add_argument("--dsn", default=base_dsn())
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args(argv)
    print(json.dumps(run(args.dsn, args.count, args.concurrency), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
