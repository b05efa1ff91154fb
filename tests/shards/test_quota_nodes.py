"""Two nodes, one quota: each node a process's pacing with slices (here two pacings in one
test process) and its quota exchange through a real PostgreSQL; node A runs two engines,
node B one, all polling the simulator on 127.0.0.1. Every 1 s window at the provider holds
the quota across both nodes: from the start (the first to exchange finds itself alone and
takes the quota, the other waits until it has lowered), while they share it by demand, and
after B leaves and A takes the whole of it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from daemon.engine.pacing import SharedPacing
from daemon.engine.supervisor import Supervisor
from daemon.shards.quota import QuotaExchange
from daemon.simulator import run_in_thread
from eventlog.pgstore import PgSettings
from eventlog.shards import init_catalog
from tests.e2e.harness import TOKEN
from tests.e2e.test_quota_windows import most_in_window
from tests.shards.test_quota_shared import arrivals, run_engines

RATE = 10
PERIOD, TTL = 0.25, 1.0


@pytest.fixture
def catalog(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn) as conn:
        init_catalog(conn, 2)
    return pg_dsn


def test_two_nodes_keep_one_quota_at_the_provider_and_a_leavers_share_returns(
    tmp_path: Path, catalog: str
) -> None:
    node_a, node_b = SharedPacing(sliced=True), SharedPacing(sliced=True)
    exchanges = {
        name: QuotaExchange(PgSettings(catalog), name, shared, period=PERIOD, ttl=TTL)
        for name, shared in (("A", node_a), ("B", node_b))
    }
    quota = f"[quota]\nrequests_per_second = {RATE}\nburst = 1\nmax_in_flight = 4\n"
    marks: dict[str, float] = {}
    with run_in_thread(token=TOKEN) as sim:

        async def scenario(engines: list[Supervisor]) -> None:
            async with anyio.create_task_group() as tg:
                b_scope = anyio.CancelScope()

                async def run_b() -> None:
                    with b_scope:
                        await exchanges["B"].run()

                tg.start_soon(exchanges["A"].run)
                tg.start_soon(run_b)
                await anyio.sleep(3.0)
                # Shared by demand: A's 20 live operations to B's 10.
                assert exchanges["A"].in_force("sim").rate == 6
                assert exchanges["B"].in_force("sim").rate == 4
                engines[2].request_stop()  # node B leaves: its engine stops ...
                b_scope.cancel()  # ... and its exchange deletes its rows
                marks["left"] = time.time()
                # A raises after ``raise_after`` (the ttl); the polls holding future slots
                # reserved under its old rate (about a second of them) keep their times.
                await anyio.sleep(4.5)
                assert exchanges["A"].in_force("sim").rate == RATE
                tg.cancel_scope.cancel()

        run_engines(tmp_path, sim, quota, [node_a, node_a, node_b], scenario)
        seen = sorted(arrivals(sim))
        from_b = arrivals(sim, 2)
        a_after = [t for t in arrivals(sim, 0) + arrivals(sim, 1) if t >= marks["left"] + 3.0]
    most = most_in_window(seen, 1.0)
    print(
        f"{len(seen)} requests; most in 1 s {most} (quota {RATE}); node B sent {len(from_b)}; "
        f"node A alone in its last 1.5 s: {len(a_after)}"
    )
    assert most <= math.ceil(RATE)
    assert from_b  # B was served while it had demand
    assert max(from_b) < marks["left"] + 0.5  # and sent nothing once it left
    assert len(a_after) >= 0.7 * RATE * 1.5  # A took B's share
