"""Nodes on a sharded PostgreSQL log, checked from the provider's side (issue 39).

Every run is judged by :mod:`tests.e2e.shardchecks` from the simulator's request log and the
shards' chains in the database: every 1 s window at the provider within the provider's quota
across all nodes; every request under its own durable intent and within budget; no request
under a shard's epoch after the shard's next epoch began (no operation polled by two nodes at
once); every acknowledged operation in its shard's log and ended; ``bide verify --dsn`` and
``bide replay --check`` clean for every shard.

The first test proves the checks themselves on today's two-node HA log (one shard): they pass
on a real run with a takeover, and each fails on a deliberately broken copy of its input.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import msgspec
import psycopg
import pytest

from daemon.spool import Spool
from eventlog.shards import shard_of
from tests.e2e.harness import (
    LeaseTimes,
    Workspace,
    drop_registration,
    init_log,
    until,
    workspace,
    write_status_profile,
)
from tests.e2e.pgnodes import active, standby
from tests.e2e.shardchecks import (
    Attributed,
    ShardLog,
    attribute,
    check_ended,
    check_fencing,
    check_intents,
    check_quota,
    check_silent_after,
    read_shards,
    replay_checks,
    verify_shard,
)
from tests.e2e.shardnodes import Cluster, init_shards, roomy_server

CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.3
rate_limited_delay_seconds = 1.0
min_hint_seconds = 0.05
not_found_grace_seconds = 5
default_deadline_seconds = 300
default_max_status_requests = 400
default_max_transport_failures = 50
default_max_rate_limited = 10
"""
LEASE = LeaseTimes(seconds=2.0, renew=0.5, margin=0.2)
#: The scenarios run real nodes for minutes on a loaded machine: more than the suite's 300 s.
scenario = pytest.mark.timeout(900)


def quota(rate: float, burst: int, in_flight: int = 8) -> str:
    return (
        f"[quota]\nrequests_per_second = {rate:g}\nburst = {burst}\nmax_in_flight = {in_flight}\n"
    )


@contextmanager
def cluster(ws: Workspace, dsn: str, lease: LeaseTimes = LEASE) -> Iterator[Cluster]:
    c = Cluster(ws, dsn, lease)
    try:
        yield c
    finally:
        for name in c.alive():
            c.daemon(name).kill()


def _all_checks(
    ws: Workspace, dsn: str, name: str, ops: list[str], rate: float, burst: int
) -> tuple[list[ShardLog], list[Attributed], dict[str, int]]:
    received = ws.sim.requests(kind="status")
    shards = read_shards(ws.root, dsn, name)
    polled = attribute(shards, received)
    check_quota(
        [a.record.wall for a in polled],
        rate,
        burst,
        (1.0, 2.0),
        [a.node for a in polled],
    )
    assert check_intents(shards, received) == len(ops)
    per_node = check_fencing(shards, polled)
    check_ended(shards, ops)
    replay_checks(ws.root, shards)
    return shards, polled, per_node


HA_JOBS: dict[str, str | list[object]] = {
    f"ha-{i}": "running x12, succeeded with result" for i in range(6)
}


def test_the_checks_hold_on_two_node_ha_and_fail_on_broken_input(
    pg_dsn: str, tmp_path: Path
) -> None:
    rate, burst = 10.0, 2
    with workspace(tmp_path, jobs=HA_JOBS) as ws, cluster(ws, pg_dsn) as c:
        write_status_profile(
            ws, "sim", contract=CONTRACT, timeout_seconds=0.5, extra=quota(rate, burst)
        )
        init_log(pg_dsn)
        c.start("a")
        until(lambda: active(c.daemon("a")), 20, "node a to be active")
        c.start("b")
        until(lambda: standby(c.daemon("b")), 20, "node b to stand by")
        spool = Spool(c.nodes["a"].state / "spool")
        until(spool.incoming.is_dir, 10, "the spool")
        ops = [f"op-{job}" for job in HA_JOBS]
        for job, op in zip(HA_JOBS, ops, strict=True):
            drop_registration(ws, op, job, spool=spool)
        ws.sim.wait_for_requests(2 * len(ops), kind="status", timeout=20)
        c.kill("a")
        until(lambda: active(c.daemon("b")), LEASE.seconds + 15, "node b to take over")

        def ended() -> bool:
            done = ws.sim.requests(kind="status")
            return sum(1 for r in done if r.step_label == "succeeded") >= len(ops)

        until(ended, 60, "every job to succeed")
        c.stop_all()
        shards, polled, per_node = _all_checks(ws, pg_dsn, "ha", ops, rate, burst)
        assert len(shards) == 1
        assert set(per_node) == {"a", "b"}, per_node  # both nodes polled, each in its term

        # Each check fails on a broken copy of its input.
        received = ws.sim.requests(kind="status")
        one = received[len(received) // 2]
        crowd = [one.wall + i / (4 * rate) for i in range(int(2 * rate))]
        with pytest.raises(AssertionError, match="within 1 s"):
            check_quota([r.wall for r in received] + crowd, rate, burst)
        twice = [*received, msgspec.structs.replace(one, wall=one.wall + 0.001, seq=0)]
        with pytest.raises(AssertionError, match=r"bide intended|no intent of its own"):
            check_intents(shards, twice)
        stray = msgspec.structs.replace(one, job_id="never-registered")
        with pytest.raises(AssertionError, match="no shard has it"):
            attribute(shards, [stray])
        early = [a for a in polled if a.node == "a"][-1]
        took = shards[0].starts[max(shards[0].starts)]
        late = dataclasses.replace(
            early, record=msgspec.structs.replace(early.record, wall=took + 0.01)
        )
        with pytest.raises(AssertionError, match="after a later epoch began"):
            check_fencing(shards, [*polled, late])
        with pytest.raises(AssertionError, match="not in shard"):
            check_ended(shards, [*ops, "op-acknowledged-then-lost"])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE bide_records DISABLE TRIGGER bide_records_append_only")
            conn.execute(
                "UPDATE bide_records SET epoch = 1 WHERE seq = (SELECT max(seq) FROM bide_records)"
            )
        with pytest.raises(AssertionError, match="bide verify"):
            verify_shard(ws.root, pg_dsn)


#: The issue's 3,000 live operations; ``BIDE_SHARD_OPS`` scales them down on a slow host.
OPERATIONS = int(os.environ.get("BIDE_SHARD_OPS", "3000"))
SHARDS = 16
SHARD_LEASE = LeaseTimes(seconds=3.0, renew=0.75, margin=0.3)
RATE, BURST = 200.0, 5
#: How long the jobs keep the provider's quota busy: past the kill, pause, join and leave.
POLLING_SECONDS = 60.0


def _say(story: list[str], line: str) -> None:
    story.append(line)
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@scenario
def test_three_nodes_sixteen_shards_through_kill_pause_join_and_leave(tmp_path: Path) -> None:
    """Three nodes share 16 shards and 3,000 live operations on one provider with a quota;
    node c is SIGKILLed, node b SIGSTOPped past its lease and resumed, node d joins, node a
    leaves by SIGTERM. The shards move each time; the checks of the module hold over the
    whole run, node b sends nothing under its old terms after resuming, every operation
    acknowledged ends in its own shard's log."""
    polls = max(3, math.ceil(POLLING_SECONDS * RATE / OPERATIONS))  # the quota kept busy
    jobs: dict[str, str | list[object]] = {
        f"j{i}": f"running x{polls - 1}, succeeded with result" for i in range(OPERATIONS)
    }
    with (
        roomy_server() as pg_dsn,
        workspace(tmp_path, jobs=jobs) as ws,
        cluster(ws, pg_dsn, SHARD_LEASE) as c,
    ):
        write_status_profile(
            ws, "sim", contract=CONTRACT, timeout_seconds=0.5, extra=quota(RATE, BURST, 16)
        )
        init_shards(pg_dsn, SHARDS)
        for name in "abc":
            c.start(name)
        held = c.wait_balanced(list("abc"), 60)
        holder = {k: n for n, ks in held.items() for k in ks}
        per_node: dict[str, list[tuple[str, str]]] = {n: [] for n in "abc"}
        for i in range(OPERATIONS):
            op = f"op-{i}"
            per_node[holder[shard_of(op, SHARDS)]].append((op, f"j{i}"))
        story: list[str] = []
        began = time.monotonic()
        for name in per_node:
            c.wait_api(name)
        with ThreadPoolExecutor(len(per_node)) as pool:
            done = pool.map(lambda name: c.register(name, per_node[name]), per_node)
            acknowledged = [op for ops in done for op in ops]
        registered_in = time.monotonic() - began
        assert len(acknowledged) == OPERATIONS
        _say(story, f"{OPERATIONS} registered in {registered_in:.1f} s")
        ws.sim.wait_for_requests(min(OPERATIONS, int(RATE)), kind="status", timeout=60)

        before = c.holders()
        killed = c.kill("c")
        c.wait_balanced(list("ab"), SHARD_LEASE.seconds + 30)
        crash = [m.taken - killed for m in c.moves(before) if m.before == "c"]
        _say(story, f"SIGKILL c: {len(crash)} shards taken, median {_median(crash):.2f} s")

        before = c.holders()
        paused = c.pause("b")
        c.wait_balanced(["a"], SHARD_LEASE.seconds + 30)
        stalled = [m.taken - paused for m in c.moves(before) if m.before == "b"]
        _say(story, f"SIGSTOP b: {len(stalled)} shards taken, median {_median(stalled):.2f} s")
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 10, kind="status", timeout=30)
        resumed = c.resume("b")
        c.wait_balanced(list("ab"), 60)

        before = c.holders()
        c.start("d")
        c.wait_balanced(list("abd"), 60)
        joined = [m.taken - m.released for m in c.moves(before)]
        _say(story, f"d joins: {len(joined)} shards moved, gap median {_median(joined):.2f} s")

        before = c.holders()
        c.leave("a")
        c.wait_balanced(list("bd"), 60)
        left = [m.taken - m.released for m in c.moves(before)]
        _say(story, f"a leaves: {len(left)} shards moved, gap median {_median(left):.2f} s")

        def all_ended() -> bool:
            done = ws.sim.requests(kind="status")
            return sum(1 for r in done if r.step_label == "succeeded") >= OPERATIONS

        until(all_ended, POLLING_SECONDS * 2 + 60, "every job to succeed")
        _say(story, "every job succeeded")
        c.stop_all()
        _say(story, "every node stopped")
        shards, polled, requests_by = _all_checks(ws, pg_dsn, "shards", acknowledged, RATE, BURST)
        assert len(shards) == SHARDS
        fresh = check_silent_after(shards, polled, "b", resumed)
        print(
            f"\n{OPERATIONS} operations on {SHARDS} shards: registered in {registered_in:.1f} s;"
            f" requests per node {requests_by}; node b after SIGCONT: {fresh} under new terms"
        )
        for line in story:
            print("  " + line)
        assert set(requests_by) >= {"a", "b", "c", "d"}, requests_by


@scenario
def test_a_node_paused_past_its_leases_sends_nothing_under_them_after_resuming(
    tmp_path: Path,
) -> None:
    """Two nodes on 16 shards, the provider's quota kept busy. Node b is SIGSTOPped until a
    holds every shard, then SIGCONTed: every request b sends from then on is under a term it
    took after resuming (none under the terms it held when paused), and a and b share the
    shards again."""
    operations = 600
    jobs: dict[str, str | list[object]] = {
        f"j{i}": "running x9, succeeded with result" for i in range(operations)
    }
    with (
        roomy_server() as pg_dsn,
        workspace(tmp_path, jobs=jobs) as ws,
        cluster(ws, pg_dsn, SHARD_LEASE) as c,
    ):
        write_status_profile(
            ws, "sim", contract=CONTRACT, timeout_seconds=0.5, extra=quota(RATE, BURST, 16)
        )
        init_shards(pg_dsn, SHARDS)
        for name in "ab":
            c.start(name)
        held = c.wait_balanced(["a", "b"], 60)
        holder = {k: n for n, ks in held.items() for k in ks}
        per_node: dict[str, list[tuple[str, str]]] = {"a": [], "b": []}
        for i in range(operations):
            per_node[holder[shard_of(f"op-{i}", SHARDS)]].append((f"op-{i}", f"j{i}"))
        for name in "ab":
            c.wait_api(name)
        acknowledged = c.register("a", per_node["a"]) + c.register("b", per_node["b"])
        ws.sim.wait_for_requests(operations, kind="status", timeout=60)
        c.pause("b")
        c.wait_balanced(["a"], SHARD_LEASE.seconds + 30)
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 20, kind="status", timeout=30)
        resumed = c.resume("b")
        c.wait_balanced(["a", "b"], 60)

        def all_ended() -> bool:
            done = ws.sim.requests(kind="status")
            return sum(1 for r in done if r.step_label == "succeeded") >= operations

        until(all_ended, 120, "every job to succeed")
        c.stop_all()
        shards, polled, per = _all_checks(ws, pg_dsn, "paused", acknowledged, RATE, BURST)
        fresh = check_silent_after(shards, polled, "b", resumed)
        print(f"\nrequests per node {per}; node b after SIGCONT: {fresh}, all under new terms")
        assert fresh > 0  # b polled again, under terms taken after it resumed


@scenario
def test_an_agent_registers_and_waits_through_a_node_that_does_not_hold_its_shard(
    pg_dsn: str, tmp_path: Path
) -> None:
    """Node a holds half of four shards, node b the rest. An agent on a's host registers an
    operation whose shard b holds, through a's API, and waits on it there: the registration
    is relayed to b (durable in the shard's intake, answered once b recorded it), b polls,
    and a answers the wait from its copy of the shard. The provider hears from b alone."""
    jobs: dict[str, str | list[object]] = {"far": "running x3, succeeded with result"}
    with workspace(tmp_path, jobs=jobs) as ws, cluster(ws, pg_dsn, SHARD_LEASE) as c:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        init_shards(pg_dsn, 4)
        for name in "ab":
            c.start(name)
        held = c.wait_balanced(["a", "b"], 60)
        op = next(f"op-far-{i}" for i in range(100) if shard_of(f"op-far-{i}", 4) in held["b"])
        c.wait_api("a")
        with c.api("a") as api:
            got = api.post(
                "/v1/operations", json={"provider": "sim", "job_id": "far", "operation_id": op}
            )
            assert got.status_code == 201, got.text
            receipt = got.json()
            assert receipt["operation_id"] == op
            view = api.get(f"/v1/operations/{op}", params={"wait": "60s"})
            assert view.status_code == 200, view.text
            assert view.json()["done"], view.json()
            assert view.json()["phase"] == "succeeded", view.json()
        assert shard_of(op, 4) in c.held_by()["b"]  # it did not move meanwhile
        c.stop_all()
        shards, _, per_node = _all_checks(ws, pg_dsn, "relay", [op], 10.0, 1)
        assert per_node == {"b": 4}, per_node
        assert op in shards[shard_of(op, 4)].log.ops
