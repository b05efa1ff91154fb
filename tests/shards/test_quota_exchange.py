"""The quota exchange between nodes through ``bide_quota`` in a real PostgreSQL: three nodes'
exchanges (each with its own pacing, as each node process has) agree on slices that always
fit the provider's quota together, follow demand, return a dead node's share once its rows
expire, a leaving node's at once; a node that cannot reach the database keeps its slice until
its ttl and then has nothing, and says so."""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable

import anyio
import psycopg
import pytest

from daemon import logfmt
from daemon.engine.pacing import SharedPacing
from daemon.shards.quota import NOTHING, QuotaExchange
from eventlog.pgstore import PgSettings
from eventlog.shards import init_catalog
from tests.e2e.tcpproxy import proxy_to
from tests.exposition import parse_exposition

RATE, BURST, IN_FLIGHT = 30.0, 5, 6
PERIOD, TTL = 0.25, 1.0


@pytest.fixture
def catalog(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn) as conn:
        init_catalog(conn, 2)
    return pg_dsn


class Node:
    """One node's side: its pacing (configured from the profile) and its exchange; its demand
    is what the test sets, as a node's live operations would be."""

    def __init__(
        self, dsn: str, name: str, demand: int, ttl: float = TTL, raise_after: float = TTL
    ) -> None:
        self.name = name
        self.demand = demand
        self.shared = SharedPacing(sliced=True)
        self.shared.configure("sim", RATE, BURST, IN_FLIGHT)
        self.shared.attach(lambda op: False, lambda op: None, lambda: {"sim": self.demand})
        self.exchange = QuotaExchange(
            PgSettings(dsn), name, self.shared, period=PERIOD, ttl=ttl, raise_after=raise_after
        )

    @property
    def rate(self) -> float:
        return self.exchange.in_force("sim").rate


def check_sums(nodes: list[Node]) -> None:
    """What the slices in force promise together, and each pacing keeping to its own."""
    pieces = [n.exchange.in_force("sim") for n in nodes]
    served = [p for p in pieces if p.rate > 0]
    assert math.fsum(p.rate for p in pieces) <= RATE * (1 + 1e-12), pieces
    assert sum(p.in_flight for p in pieces) <= IN_FLIGHT, pieces
    assert sum(p.burst - 1 for p in served) <= BURST - 1, pieces
    for n, p in zip(nodes, pieces, strict=True):
        assert n.shared.is_open("sim") == (p.rate > 0)
        if p.rate > 0:
            assert n.shared.quotas["sim"].rate == p.rate
            assert n.shared.in_flight["sim"].limit == p.in_flight


async def until(predicate: Callable[[], bool], seconds: float) -> float:
    """Check ``predicate()`` every 10 ms until it holds (failing after ``seconds``); return
    the seconds it took."""
    start = time.monotonic()
    with anyio.fail_after(seconds):
        while True:
            if predicate():
                return time.monotonic() - start
            await anyio.sleep(0.01)


def rows(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT node FROM bide_quota")}


def test_slices_follow_demand_a_dead_nodes_share_returns_after_ttl(catalog: str) -> None:
    nodes = [Node(catalog, name, 10) for name in ("a", "b", "c")]
    a, b, c = nodes
    dead = anyio.Event()

    async def beat_until_dead(node: Node) -> None:
        """``c`` exchanges like ``run()`` until it dies: no goodbye, its rows stay."""
        while not dead.is_set():
            await node.exchange.exchange()
            with anyio.move_on_after(PERIOD):
                await dead.wait()
        await node.exchange.aclose()  # its connection drops as its process dies

    async def watch() -> None:
        while True:
            check_sums(nodes)
            await anyio.sleep(0.005)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            live_a, live_b = anyio.CancelScope(), anyio.CancelScope()

            async def run(node: Node, scope: anyio.CancelScope) -> None:
                with scope:
                    await node.exchange.run()

            tg.start_soon(run, a, live_a)
            tg.start_soon(run, b, live_b)
            tg.start_soon(beat_until_dead, c)
            # The first to exchange finds itself alone and takes its slice at once; the
            # others wait ``raise_after`` (the first lowers at once), then equal shares.
            await anyio.sleep(PERIOD / 2)
            assert sum(n.rate > 0 for n in nodes) <= 1
            took = await until(lambda: [n.rate for n in nodes] == [10.0] * 3, TTL + 2)
            assert took >= TTL - PERIOD

            b.demand = 40  # b's share grows; a and c lower theirs first
            await until(lambda: b.rate == 19.0, TTL + 2)
            assert (a.rate, c.rate) == (6.0, 5.0)

            dead.set()  # c dies: its rows stay until they expire
            died = time.monotonic()
            took = await until(lambda: a.rate + b.rate == RATE, 2 * TTL + 2)
            assert c.rate == 0  # its own slice expired first: it cannot know the others'
            assert took >= TTL - PERIOD  # not before its rows expired
            assert (a.rate, b.rate) == (7.0, 23.0)
            print(f"a dead node's share returned {took:.2f} s after it died (ttl {TTL} s)")
            assert time.monotonic() - died >= TTL - PERIOD

            live_a.cancel()  # a leaves: its rows go at once, b takes everything
            took = await until(lambda: b.rate == RATE, TTL + 2)
            print(f"a leaving node's share returned {took:.2f} s after it left")
            assert "a" not in rows(catalog)
            assert b.exchange.in_force("sim").in_flight == IN_FLIGHT
            live_b.cancel()
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert rows(catalog) == {"c"}  # the dead node's rows, expired; the leavers' deleted


def test_without_the_database_a_node_keeps_its_slice_until_ttl_then_has_nothing(
    catalog: str,
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(catalog)
    host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
    lines = io.StringIO()
    logfmt.set_stream(lines)
    try:
        with proxy_to(host, port) as proxy:
            dsn = psycopg.conninfo.make_conninfo(catalog, host="127.0.0.1", port=proxy.port)
            # A stalled exchange gives up in about 1 s: a ttl of 2 s shows the slice kept.
            node = Node(dsn, "n", 3, ttl=2 * TTL, raise_after=PERIOD)
            ex = node.exchange
            with psycopg.connect(catalog) as conn:  # another node with demand, for an hour
                conn.execute(
                    "INSERT INTO bide_quota (provider, node, demand, expires_at) "
                    "VALUES ('sim', 'other', 1, now() + interval '1 hour')"
                )
            share = 22.0  # of 30, for a demand of 3 to the other's 1 (one request each first)

            async def main() -> None:
                assert await ex.exchange()
                assert node.rate == 0  # not alone: a raise waits ``raise_after``
                await anyio.sleep(PERIOD)
                assert await ex.exchange()
                assert node.rate == share
                last_good = time.monotonic()
                proxy.stall()  # the database stops answering, with no reset to notice
                assert not await ex.exchange()
                print(f"a stalled exchange gave up after {time.monotonic() - last_good:.2f} s")
                assert node.rate == share
                assert node.shared.is_open("sim")
                await anyio.sleep(max(0.0, last_good + 2 * TTL - time.monotonic()) + 0.05)
                assert ex.in_force("sim") == NOTHING
                assert not node.shared.is_open("sim")  # the pacing closed it by itself
                proxy.cut()
                assert not await ex.exchange()
                proxy.restore()
                assert await ex.exchange()
                assert node.rate == 0  # back: from nothing, a raise waits again
                await anyio.sleep(PERIOD)
                assert await ex.exchange()
                assert node.rate == share
                await ex.aclose()

            anyio.run(main)
    finally:
        logfmt.set_stream(None)
    text = lines.getvalue()
    assert "quota exchange failed; keeping this node's slices until they expire" in text
    assert "quota slices expired without an exchange" in text
    assert "password" not in text


def test_metrics_show_the_slice_in_force(catalog: str) -> None:
    node = Node(catalog, "m", 1, raise_after=PERIOD)

    async def main() -> None:
        await node.exchange.exchange()
        await anyio.sleep(PERIOD)
        await node.exchange.exchange()
        await node.exchange.aclose()

    anyio.run(main)
    page = parse_exposition("\n".join(node.exchange.metrics_lines()) + "\n")
    sim = (("provider", "sim"),)
    assert page["bide_provider_quota_slice_rps"] == {sim: RATE}
    assert page["bide_provider_quota_slice_in_flight"] == {sim: IN_FLIGHT}
    node.exchange.until = 0.0  # once the slice expired, the metrics say nothing is left
    page = parse_exposition("\n".join(node.exchange.metrics_lines()) + "\n")
    assert page["bide_provider_quota_slice_rps"] == {sim: 0}


def test_an_exchange_period_must_be_shorter_than_its_ttl() -> None:
    shared = SharedPacing(sliced=True)
    with pytest.raises(ValueError, match="shorter than its ttl"):
        QuotaExchange(PgSettings("postgresql://bide@127.0.0.1/test"), "n", shared, period=2, ttl=1)


def test_a_node_alone_takes_its_slice_at_once(catalog: str) -> None:
    """A single node (or the first of several) waits for nobody: no other node has a row
    with demand, so none holds a slice."""
    node, idle = Node(catalog, "n", 3), Node(catalog, "idle", 0)

    async def main() -> None:
        assert await idle.exchange.exchange()  # a living row without demand
        assert await node.exchange.exchange()
        assert node.rate == RATE
        assert node.shared.is_open("sim")
        assert idle.rate == 0
        idle.demand = 1  # demand appears: the idle node waits, the other lowers at once
        assert await idle.exchange.exchange()
        assert idle.rate == 0
        assert await node.exchange.exchange()
        assert node.rate < RATE
        for n in (node, idle):
            await n.exchange.aclose()

    anyio.run(main)
