"""The node's heartbeat and what the database says about nodes and shards
(daemon.shards.membership), against a real PostgreSQL on a sharded layout."""

from __future__ import annotations

import subprocess

import anyio
import psycopg

from daemon.shards.membership import Membership
from eventlog.pgstore import PgSettings
from eventlog.shards import layout_of
from tests.e2e.harness import BIDE


def _init(dsn: str, shards: int) -> None:
    out = subprocess.run(
        [*BIDE, "log", "init", "--dsn", dsn, "--shards", str(shards)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_heartbeats_leaving_and_leases_as_the_database_sees_them(pg_dsn: str) -> None:
    _init(pg_dsn, 3)
    settings = PgSettings(pg_dsn)
    layout = layout_of(settings)
    a = Membership(settings, layout, "a", lease_seconds=30, renew_seconds=1)
    gone = Membership(settings, layout, "gone", lease_seconds=0.001, renew_seconds=1)

    async def run() -> None:
        await a.beat(2)
        await gone.beat(0)  # its row expires at once, by the database's clock
        view = await a.view()
        assert view.nodes == {"a": False}
        assert view.holders == {}
        # Shard 1's lease held (unexpired), shard 2's run out: only shard 1 has a holder.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{layout.schema(1)}".bide_lease SET holder = %s, epoch = 1, '
                "expires_at = now() + interval '1 minute'",
                ("b/123/abcdef",),
            )
            conn.execute(
                f'UPDATE "{layout.schema(2)}".bide_lease SET holder = %s, epoch = 1, '
                "expires_at = now() - interval '1 second'",
                ("c/456/abcdef",),
            )
        assert (await a.view()).holders == {1: "b/123/abcdef"}
        a.leaving = True
        await a.beat(2)
        assert (await a.view()).nodes == {"a": True}
        await a.leave()
        assert (await a.view()).nodes == {}

    try:
        anyio.run(run)
    finally:
        a.close()
        gone.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT node, held FROM bide_nodes ORDER BY node").fetchall()
    assert rows == [("gone", 0)]  # an expired row stays until someone removes it
