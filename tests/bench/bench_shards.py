"""Nodes on a sharded log (issue 39): throughput with 1, 2 and 3 nodes in one run, registrations
through a node that does not hold the shard, and how long a shard takes to move:
``python -m tests.bench --only shards [--quick] [--window S]``.

Everything is real: ``bide run`` nodes (their own processes) on one log of 16 shards in a
private PostgreSQL cluster (``tests.e2e.shardnodes.roomy_cluster``: a node keeps about 24
connections for 16 shards, and the shared server's 100 serve every other test too), the
simulator in this process (a thread), the nodes' API over their Unix sockets.

    throughput      for N = 1, 2, 3 nodes, each on a fresh log: ``operations`` live
                    operations (registered through the node holding each one's shard, all
                    before the first one polls: their registrations/s), then every one always
                    due (backoff 0.2-0.3 s, a quota no node reaches), so the nodes poll as fast
                    as they can. Over ``window`` seconds after every operation
                    was polled once: status requests/s at the provider, the nodes' CPU
                    (utime+stime) per request, the database's (every process of the private
                    cluster) and this process's (the simulator, mostly), and the machine's
                    busy share of its cores (``/proc/stat``): where that is near 100 %, the
                    machine, not bide, is the limit. Ratios are against N = 1 of the same run.
    registrations   two nodes: ``count`` registrations of ids whose shard node b holds, sent
                    ``concurrency`` at a time through b's API (the holder records them) and
                    through a's (each relayed through ``bide_intake`` to b and answered when
                    recorded): registrations/s of each and their ratio (no operation polls
                    meanwhile: the first poll is an hour away).
    moves           under a quota of 100 requests/s (busy, not saturated: a saturated node's
                    lease renewals come late, and its shards then move by lease expiry, not
                    by handover), node a holds all 16 shards with 1,000 live operations; node
                    b joins (a hands over half, gracefully), then b is SIGKILLed (a takes them
                    back when their leases run out), then b restarts and a leaves by SIGTERM.
                    Per moved shard, from the database: a graceful move is the old term's last
                    record to the new term's first (the drain, release and take, the new
                    holder's replay included); a move after SIGKILL is the kill to the new
                    term's first record.
                    The nodes' own "shard first poll" lines add when the new holder's first
                    request left after its take.
"""

from __future__ import annotations

import math
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from eventlog.shards import shard_of
from tests.bench.bare_loop import machine_busy_seconds, process_cpu_seconds
from tests.e2e.harness import LeaseTimes, Workspace, workspace, write_status_profile
from tests.e2e.shardnodes import Cluster, Move, init_shards, roomy_cluster, schema_on
from tests.pgcluster import Cluster as PgCluster

SHARDS = 16
OPERATIONS = 3_000
WINDOW = 10.0
LEASE = LeaseTimes(seconds=3.0, renew=0.75, margin=0.3)
CONTRACT = """\
first_poll_after_seconds = {first}
state_pointer = "/status"
job_id_pointer = "/id"
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.3
rate_limited_delay_seconds = 1.0
min_hint_seconds = 0.05
default_deadline_seconds = 3600
default_max_status_requests = 1000000
limit_status_requests = 1000000
default_max_transport_failures = 1000000
limit_transport_failures = 1000000
default_max_rate_limited = 1000000
limit_rate_limited = 1000000
"""
#: A quota no node reaches: the nodes poll as fast as they can.
UNLIMITED = "[quota]\nrequests_per_second = 100000\nburst = 1000\nmax_in_flight = 64\n"
#: The provider's quota while shards move: the nodes busy, not saturated.
MOVES_QUOTA = "[quota]\nrequests_per_second = 100\nburst = 5\nmax_in_flight = 16\n"
_FIRST_POLL = re.compile(r'msg="shard first poll" shard=(\d+) after_take_seconds=([\d.]+)')


def _cluster_cpu(server: PgCluster) -> float:
    """utime+stime of every process of the private cluster (postmaster and children)."""
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    total = process_cpu_seconds(pid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextmanager
def _nodes(
    root: Path, dsn: str, jobs: int, names: str, first: float = 0.2, quota: str = UNLIMITED
) -> Iterator[tuple[Workspace, Cluster]]:
    """A workspace whose simulator runs ``jobs`` jobs that never end, a 16-shard log at
    ``dsn`` and the nodes ``names`` started, the shards divided among them; an operation's
    first poll ``first`` seconds after its registration."""
    root.mkdir(parents=True)
    script: dict[str, str | list[object]] = {f"j{i}": "running" for i in range(jobs)}
    with workspace(root, jobs=script) as ws:
        contract = CONTRACT.format(first=first)
        write_status_profile(ws, "sim", contract=contract, timeout_seconds=0.5, extra=quota)
        init_shards(dsn, SHARDS)
        c = Cluster(ws, dsn, LEASE)
        try:
            for name in names:
                c.start(name)
            c.wait_balanced(list(names), 120)
            for name in names:
                c.wait_api(name)
            yield ws, c
        finally:
            for name in c.alive():
                c.daemon(name).kill()


def _register_by_holder(c: Cluster, ops: int, start: int = 0) -> float:
    """Register ``ops`` operations, each through the node holding its shard, every node at
    once; the seconds it took."""
    holder = {k: n for n, ks in c.held_by().items() for k in ks}
    per_node: dict[str, list[tuple[str, str]]] = {}
    for i in range(start, start + ops):
        per_node.setdefault(holder[shard_of(f"op-{i}", SHARDS)], []).append((f"op-{i}", f"j{i}"))
    began = time.perf_counter()
    with ThreadPoolExecutor(len(per_node)) as pool:
        list(pool.map(lambda n: c.register(n, per_node[n], workers=8), per_node))
    return time.perf_counter() - began


def throughput(
    root: Path, server: PgCluster, count: int, operations: int, window: float
) -> dict[str, Any]:
    """One row of the throughput table: ``count`` nodes saturated."""
    dsn = schema_on(server, f"bench_nodes_{count}")
    names = "abc"[:count]
    # Saturated nodes answer registrations slowly (over 90 s once): every operation is
    # registered before the first one polls, and the window starts once all have polled.
    first = max(10.0, operations / 60)
    with _nodes(root / f"nodes-{count}", dsn, operations, names, first) as (ws, c):
        registered = _register_by_holder(c, operations)
        ws.sim.wait_for_requests(2 * operations, kind="status", timeout=300)
        pids = [c.daemon(n).proc.pid for n in names]
        before = (
            len(ws.sim.requests(kind="status")),
            sum(process_cpu_seconds(p) for p in pids),
            _cluster_cpu(server),
            _self_cpu(),
            machine_busy_seconds(),
            time.perf_counter(),
        )
        time.sleep(window)
        after = (
            len(ws.sim.requests(kind="status")),
            sum(process_cpu_seconds(p) for p in pids),
            _cluster_cpu(server),
            _self_cpu(),
            machine_busy_seconds(),
            time.perf_counter(),
        )
        c.stop_all()
    requests, nodes_cpu, db_cpu, sim_cpu, busy, wall = (
        a - b for a, b in zip(after, before, strict=True)
    )
    cores = os.cpu_count() or 1
    return {
        "nodes": count,
        "operations": operations,
        "registrations_per_s": round(operations / registered, 1),
        "requests_per_s": round(requests / wall, 1),
        "nodes_cpu_us_per_request": round(nodes_cpu / requests * 1e6, 1),
        "db_cpu_us_per_request": round(db_cpu / requests * 1e6, 1),
        "simulator_cpu_us_per_request": round(sim_cpu / requests * 1e6, 1),
        "nodes_cpu_share": round(nodes_cpu / wall / cores, 3),
        "db_cpu_share": round(db_cpu / wall / cores, 3),
        "simulator_cpu_share": round(sim_cpu / wall / cores, 3),
        "machine_busy_share": round(busy / wall / cores, 3),
    }


def registrations(
    root: Path, server: PgCluster, count: int, concurrency: int = 16
) -> dict[str, Any]:
    """Registrations/s through the shard's holder and through a node that does not hold it."""
    dsn = schema_on(server, "bench_relay")
    # No operation polls while they are registered: the doors alone are measured.
    with _nodes(root / "relay", dsn, 2 * count, "ab", first=3600.0) as (_, c):
        held = c.held_by()["b"]
        ids = [f"op-{i}" for i in range(20 * count) if shard_of(f"op-{i}", SHARDS) in held]
        ids = ids[: 2 * count]
        assert len(ids) == 2 * count
        pairs = [(op, f"j{k}") for k, op in enumerate(ids)]
        out: dict[str, Any] = {"count": count, "concurrency": concurrency}
        for label, name, chunk in (("holder", "b", pairs[:count]), ("relayed", "a", pairs[count:])):
            began = time.perf_counter()
            c.register(name, chunk, workers=concurrency)
            out[f"{label}_per_s"] = round(count / (time.perf_counter() - began), 1)
        c.stop_all()
    out["relayed_vs_holder"] = round(out["relayed_per_s"] / out["holder_per_s"], 2)
    return out


def _first_polls(text: str, since: int) -> dict[int, float]:
    return {int(k): float(s) for k, s in _FIRST_POLL.findall(text[since:])}


def _summary(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "median_s": round(statistics.median(xs), 3),
        "max_s": round(max(xs), 3),
        "min_s": round(min(xs), 3),
    }


def moves(root: Path, server: PgCluster, operations: int) -> dict[str, Any]:
    """Shard move times: a graceful join, a SIGKILL, a graceful leave. A move is any change
    of a shard's epoch between two readings, a node re-taking its own shard after its lease
    ran out included (``to_same_node`` counts those)."""
    dsn = schema_on(server, "bench_moves")
    out: dict[str, Any] = {"lease_seconds": LEASE.seconds, "operations": operations}
    # Under a quota (a saturated node's renewals come late and its leases run out: a move
    # would then be a lease expiry, not a handover).
    with _nodes(root / "moves", dsn, operations, "a", quota=MOVES_QUOTA) as (ws, c):
        _register_by_holder(c, operations)
        ws.sim.wait_for_requests(operations, kind="status", timeout=120)
        try:
            _moves(c, out)
        except (AssertionError, TimeoutError, OSError) as exc:
            out["failed"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
        for name in c.alive():
            c.daemon(name).kill()
    return out


def _moves(c: Cluster, out: dict[str, Any]) -> None:
    """Join, SIGKILL, restart and leave, each step's figures into ``out`` as it is done."""

    def gaps(moved: list[Move], start: float | None) -> list[float]:
        return [m.taken - (m.released if start is None else start) for m in moved]

    before = c.holders()
    c.start("b")
    c.wait_balanced(["a", "b"], 60)
    moved = c.moves(before)
    out["to_same_node"] = sum(1 for m in moved if m.before == m.after)
    out["graceful_join"] = _summary(gaps(moved, None))
    first = _first_polls(c.daemon("b").output(), 0)
    out["graceful_join_first_poll_after_take"] = _summary(
        [first[m.shard] for m in moved if m.shard in first]
    )
    before = c.holders()
    mark = len(c.daemon("a").output())
    killed = c.kill("b")
    c.wait_balanced(["a"], LEASE.seconds + 60)
    moved = c.moves(before)
    out["sigkill"] = _summary(gaps(moved, killed))
    first = _first_polls(c.daemon("a").output(), mark)
    out["sigkill_first_poll_after_take"] = _summary(
        [first[m.shard] for m in moved if m.shard in first]
    )
    c.start("b")
    c.wait_balanced(["a", "b"], 60)
    before = c.holders()
    c.leave("a")
    c.wait_balanced(["b"], 60)
    out["graceful_leave"] = _summary(gaps(c.moves(before), None))
    c.stop_all()


def run(out: Path, quick: bool = False, window: float | None = None) -> dict[str, Any]:
    """Each part's figures, or what stopped it (``failed``: a node exited, a wait ran out):
    the parts after it still run."""
    operations = 500 if quick else OPERATIONS
    window = window or (4.0 if quick else WINDOW)
    root = out.resolve() / f"shards-{os.getpid()}"  # the nodes run in their own directory
    result: dict[str, Any] = {"shards": SHARDS, "window_s": window, "cores": os.cpu_count()}
    with roomy_cluster() as server:
        rows: list[dict[str, Any]] = []
        for n in (1, 2, 3):
            rows.append(_part(partial(throughput, root, server, n, operations, window)))
            print(f"  shards: {n} node(s): {rows[-1]}", file=sys.stderr, flush=True)
        one = rows[0].get("requests_per_s", 0.0)
        for row in rows:
            if "requests_per_s" in row:
                row["ratio_vs_1_node"] = round(row["requests_per_s"] / one, 2) if one else math.nan
        result["throughput"] = rows
        count = 100 if quick else 500
        result["registrations"] = _part(partial(registrations, root, server, count))
        print(f"  shards: registrations: {result['registrations']}", file=sys.stderr, flush=True)
        result["moves"] = _part(partial(moves, root, server, min(operations, 1_000)))
    return result


def _part(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return measure()
    except (AssertionError, TimeoutError, OSError, httpx.HTTPError) as exc:
        return {"failed": f"{type(exc).__name__}: {str(exc)[-2000:]}"}


def print_table(r: dict[str, Any]) -> None:
    print(
        f"\nnodes on one log of {r['shards']} shards (PostgreSQL private cluster), "
        f"{r['cores']} cores, window {r['window_s']:g} s"
    )
    print(
        f"  {'nodes':>5}{'req/s':>9}{'x 1 node':>9}{'node us/req':>12}{'db us/req':>10}"
        f"{'sim us/req':>11}{'nodes cpu':>10}{'db cpu':>8}{'sim cpu':>8}{'machine':>8}"
        f"{'reg/s':>7}"
    )
    for row in r["throughput"]:
        if "failed" in row:
            print(f"  failed: {row['failed'][-300:]}")
            continue
        print(
            f"  {row['nodes']:>5}{row['requests_per_s']:>9}{row['ratio_vs_1_node']:>9}"
            f"{row['nodes_cpu_us_per_request']:>12}{row['db_cpu_us_per_request']:>10}"
            f"{row['simulator_cpu_us_per_request']:>11}{row['nodes_cpu_share']:>10}"
            f"{row['db_cpu_share']:>8}{row['simulator_cpu_share']:>8}"
            f"{row['machine_busy_share']:>8}{row['registrations_per_s']:>7}"
        )
    reg = r["registrations"]
    if "failed" in reg:
        print(f"  registrations failed: {reg['failed'][-300:]}")
    else:
        print(
            f"  registrations/s, {reg['count']} at {reg['concurrency']} in flight: through the "
            f"holder {reg['holder_per_s']}, through a non-holder (relayed) {reg['relayed_per_s']} "
            f"({reg['relayed_vs_holder']}x)"
        )
    m = r["moves"]
    print(f"  shard moves (lease {LEASE.seconds:g} s), median / max seconds (n):")
    for key in (
        "graceful_join",
        "graceful_join_first_poll_after_take",
        "sigkill",
        "sigkill_first_poll_after_take",
        "graceful_leave",
    ):
        got = m.get(key, {"n": 0})
        if got["n"]:
            print(f"    {key:<40}{got['median_s']:>8} / {got['max_s']:<8} ({got['n']})")
        else:
            print(f"    {key:<40}{'-':>8}")
    if "failed" in m:
        print(f"    failed: {m['failed'][-300:]}")
