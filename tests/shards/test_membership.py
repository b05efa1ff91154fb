"""The node's heartbeat and what the database says about nodes and shards
(daemon.shards.membership), against a real PostgreSQL on a sharded layout."""

from __future__ import annotations

import subprocess

import anyio
import psycopg

from daemon.shards.membership import PRUNE_BATCH, Membership
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
        # Joining (its copies catching up): live, its name taken, not counted in the share.
        a.joining = True
        await a.beat(0)
        assert (await a.view()).nodes == {"a": True}
        assert await a.nodes() == {"a": True}
        a.joining = False
        await a.beat(2)
        assert (await a.view()).nodes == {"a": False}
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


def test_rows_of_nodes_gone_for_more_than_a_day_are_pruned_a_batch_at_a_time(
    pg_dsn: str,
) -> None:
    _init(pg_dsn, 2)
    settings = PgSettings(pg_dsn)
    a = Membership(settings, layout_of(settings), "a", lease_seconds=30, renew_seconds=0.05)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # Crashed nodes: expired two days ago (more than a batch of them), an hour ago.
        conn.execute(
            "INSERT INTO bide_nodes (node, expires_at) SELECT 'crashed-' || i, "
            "now() - interval '2 days' - make_interval(secs => i) "
            "FROM generate_series(1, %s) AS i",
            (PRUNE_BATCH + 20,),
        )
        conn.execute(
            "INSERT INTO bide_nodes (node, expires_at) VALUES ('recent', now() - interval '1 hour')"
        )

    def names() -> set[str]:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            return {str(r[0]) for r in conn.execute("SELECT node FROM bide_nodes")}

    async def run() -> None:
        await a.beat(0)
        assert await a.prune() == PRUNE_BATCH  # bounded: one batch, the oldest first
        left = names()
        assert left == {"a", "recent"} | {f"crashed-{i}" for i in range(1, 21)}
        # The heartbeat prunes the rest; the live node and the recently expired one stay.
        with anyio.move_on_after(1):
            await a.keep(lambda: 0)
        assert names() == {"a", "recent"}

    try:
        anyio.run(run)
    finally:
        a.close()
