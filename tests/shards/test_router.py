"""The node's one API on a sharded log: writes to the shard's holder (here, or through the
relay), reads and waits from any node's copy, lists merged over the shards in one node's
order, the node's health, and everything else as one node answers it."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.api.openapi import openapi_document
from daemon.api.schema import Health, Principal
from daemon.api.server import Handler, Request, Response
from daemon.shards.router import ShardRouter
from eventlog.shards import Layout
from replay.observations import WakeUp
from tests.shards.support import ME, Node, answer, catalog, prepare, request, shard_ids, two_nodes


def _watch(op_id: str | None, job: str = "job-1") -> dict[str, object]:
    body: dict[str, object] = {"provider": "sim", "job_id": job}
    if op_id is not None:
        body["operation_id"] = op_id
    return body


async def _copies_read(*nodes: Node) -> None:
    """Each node reads the records its copies gained (what the lease's follow does on a
    node: here the copy is the holder's own log files)."""
    for node in nodes:
        for reads in node.standbys.values():
            await reads.refresh()


def test_the_shard_of_an_action_or_a_scoped_id_is_its_operations() -> None:
    layout = Layout("public", 16)

    class Nowhere:
        name = "n"

        def held(self) -> set[int]:
            return set()

        def handler(self, shard: int) -> object:
            raise AssertionError("not asked")

    class NoRelay:
        async def forward_at(self, shard: int, request: Request) -> tuple[Response, int]:
            raise AssertionError("not asked")

    router = ShardRouter(layout, Nowhere(), NoRelay())  # type: ignore[arg-type]
    for op in ("nightly", "a/b c", "op-1.x"):
        k = layout.shard_of(op)
        assert router.shard_of(f"{op}.submit") == k
        assert router.shard_of(f"{op}.fetch.12") == k
        assert router.shard_of(f"{op}.cancel.1") == k
        assert router.shard_of(f"{op}~u1001") == k


def test_writes_reach_the_holder_and_reads_and_waits_any_nodes_copy(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (mine,) = shard_ids(layout, 0, 1)  # node a holds shard 0
    (theirs,) = shard_ids(layout, 1, 1)  # node b holds shard 1

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            for op in (mine, theirs):
                got = await a.router.handle(request("POST", "/v1/operations", _watch(op)))
                assert got.status == 201, got.body
            assert set(a.engines[0].ops) == {mine}
            assert set(b.engines[1].ops) == {theirs}
            # Node a answers a read of b's operation from its copy, which has it: a's answer
            # to the relayed registration waited for that.
            view = await a.router.handle(request("GET", f"/v1/operations/{theirs}"))
            assert (view.status, answer(view)["phase"]) == (200, "live")
            # A wait through a: it ends when a's copy shows the end, not before.
            waited: list[Response] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    waited.append(
                        await a.router.handle(
                            request("GET", f"/v1/operations/{theirs}", query={"wait": "20s"})
                        )
                    )

                tg.start_soon(wait)
                withdrawn = await a.router.handle(
                    request("POST", f"/v1/operations/{theirs}/withdrawal", {"note": "done"})
                )
                assert answer(withdrawn) == {
                    "operation_id": theirs,
                    "phase": "closed",
                    "withdrawn": True,
                }
                assert b.engines[1].ops[theirs].phase == "closed"  # recorded by the holder
                # a answered the withdrawal once its copy showed it: the wait there has ended.
                await anyio.wait_all_tasks_blocked()
                assert waited
            ended = answer(waited[0])
            assert (ended["done"], ended["phase"], ended["stop_reason"]) == (
                True,
                "closed",
                "withdrawn_by_owner",
            )

    anyio.run(main)


def test_an_agent_reads_its_relayed_write_at_once_through_the_node_it_asked(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Read your writes: a registration relayed to the holder is answered only once the
    asking node's copy shows it, so the agent's next read there finds it (not a 404), and
    so does a wait, which then sees the withdrawal relayed the same way."""
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    theirs = shard_ids(layout, 1, 3)  # node b holds shard 1; the agent asks node a

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, _):
            for op in theirs:
                got = await a.router.handle(request("POST", "/v1/operations", _watch(op)))
                assert got.status == 201, got.body
                view = await a.router.handle(request("GET", f"/v1/operations/{op}"))
                assert (view.status, answer(view)["phase"]) == (200, "live"), view.body
            gone = await a.router.handle(
                request("POST", f"/v1/operations/{theirs[0]}/withdrawal", {"note": "done"})
            )
            assert gone.status == 200, gone.body
            view = await a.router.handle(
                request("GET", f"/v1/operations/{theirs[0]}", query={"wait": "0s"})
            )
            assert (view.status, answer(view)["phase"]) == (200, "closed"), view.body

    anyio.run(main)


def test_a_read_of_an_operation_the_copy_does_not_know_yet_waits_for_the_copy(
    tmp_path: Path, pg_dsn: str
) -> None:
    """An operation registered at its holder (another agent, another node's API) and read
    at once through a node whose copy is behind is found, not a 404; one that does not
    exist is still a 404."""
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (theirs,) = shard_ids(layout, 1, 1)  # node b holds shard 1
    (never,) = shard_ids(layout, 1, 1, prefix="never")

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            got = await b.router.handle(request("POST", "/v1/operations", _watch(theirs)))
            assert got.status == 201, got.body
            view = await a.router.handle(request("GET", f"/v1/operations/{theirs}"))
            assert (view.status, answer(view)["phase"]) == (200, "live"), view.body
            missing = await a.router.handle(request("GET", f"/v1/operations/{never}"))
            assert (missing.status, answer(missing)["error"]) == (404, "not_found")

    anyio.run(main)


def test_a_registration_without_an_id_gets_one_and_is_recorded_in_its_shard(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            engines = {**a.engines, **b.engines}
            for _ in range(6):
                got = await a.router.handle(request("POST", "/v1/operations", _watch(None)))
                assert got.status == 201, got.body
                op = str(answer(got)["operation_id"])
                assert op.startswith("op-")
                assert op in engines[layout.shard_of(op)].ops
            bad = await a.router.handle(
                Request("POST", "/v1/operations", "/v1/operations", {}, {}, b"{not json", ME)
            )
            assert (bad.status, answer(bad)["error"]) == (400, "malformed_json")

    anyio.run(main)


@pytest.mark.parametrize("limit", [1, 3, 500])
def test_a_list_merged_over_shards_is_their_union_in_one_nodes_order(
    tmp_path: Path, pg_dsn: str, limit: int
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 3)  # a holds 0 and 2, b holds 1
    ops = [f"list-{i}" for i in range(10)]

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            for op in ops:  # registered in this order: one node lists them so
                got = await b.router.handle(request("POST", "/v1/operations", _watch(op)))
                assert got.status == 201, got.body
            for op in ops[::3]:
                await b.router.handle(request("POST", f"/v1/operations/{op}/withdrawal", {}))
            await _copies_read(a, b)
            assert {layout.shard_of(op) for op in ops} == {0, 1, 2}
            for query, expected in (
                ({}, ops),
                ({"phase": "closed"}, ops[::3]),
                ({"phase": "live"}, [op for op in ops if op not in ops[::3]]),
            ):
                for node in (a, b):
                    seen: list[str] = []
                    cursor = None
                    pages = 0
                    while True:
                        q = {**query, "limit": str(limit)}
                        if cursor is not None:
                            q["cursor"] = cursor
                        page = answer(
                            await node.router.handle(request("GET", "/v1/operations", query=q))
                        )
                        assert len(page["operations"]) <= limit
                        seen += [v["operation_id"] for v in page["operations"]]
                        pages += 1
                        cursor = page["next_cursor"]
                        if cursor is None:
                            break
                        assert cursor.startswith("s1.")  # shard-aware
                    assert seen == expected, (node.name, query)
                    assert pages <= len(expected) // limit + 1
            union: list[str] = []
            for k in range(layout.count):
                whole = answer(
                    await a.handler(k)(request("GET", "/v1/operations", query={"limit": "500"}))
                )
                union += [v["operation_id"] for v in whole["operations"]]
            assert sorted(union) == sorted(ops)
            # A refusal is the answer, as one node gives it.
            bad = await a.router.handle(request("GET", "/v1/operations", query={"limit": "0"}))
            assert (bad.status, answer(bad)["field"]) == (400, "limit")
            forged = await a.router.handle(
                request("GET", "/v1/operations", query={"cursor": "s1.bm9wZQ"})
            )
            assert (forged.status, answer(forged)["error"]) == (400, "invalid_cursor")

    anyio.run(main)


def test_health_is_the_nodes_and_other_paths_answer_as_one_node(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            for k in (0, 1):
                for op in shard_ids(layout, k, 2, prefix=f"h{k}"):
                    await a.router.handle(request("POST", "/v1/operations", _watch(op)))
            await _copies_read(a, b)
            health = answer(await a.router.handle(request("GET", "/v1/health")))
            assert (health["role"], health["live"], health["log_head_sequence"]) == (
                "active",
                4,
                -1,
            )
            assert health["shards"] == {
                "node": "a",
                "count": 2,
                "held": [0],
                "following": [1],
                "not_ready": [],
            }
            escalations = await b.router.handle(request("GET", "/v1/escalations"))
            assert answer(escalations) == {"escalations": []}
            doc = await b.router.handle(request("GET", "/v1/openapi.json"))
            assert (doc.status, doc.body) == (200, openapi_document())
            direct = await a.engines[0].api_handler()[0](request("GET", "/v1/nowhere"))
            for node in (a, b):
                routed = await node.router.handle(request("GET", "/v1/nowhere"))
                assert (routed.status, routed.body) == (404, direct.body)
            wrong = await b.router.handle(request("DELETE", "/v1/health"))
            assert (wrong.status, answer(wrong)["error"]) == (405, "method_not_allowed")

    anyio.run(main)


def test_escalations_of_every_shard_are_one_list_in_the_order_they_were_raised(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (first,) = shard_ids(layout, 1, 1, prefix="esc")  # raised first, on b's shard
    (second,) = shard_ids(layout, 0, 1, prefix="esc")

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            engines = {**a.engines, **b.engines}
            later = time.time() + 600
            for i, op in enumerate((first, second)):
                got = await a.router.handle(
                    request("POST", "/v1/operations", {**_watch(op), "deadline_seconds": 60})
                )
                assert got.status == 201, got.body
                sup = engines[layout.shard_of(op)]
                # The deadline has passed when the operation next wakes: an escalation.
                await sup.chain.handle(sup.ops[op], WakeUp(), now=later + i)
                assert sup.ops[op].phase == "escalated"
            await _copies_read(a, b)
            for node in (a, b):
                listed = answer(await node.router.handle(request("GET", "/v1/escalations")))
                assert [e["operation_id"] for e in listed["escalations"]] == [first, second]
                one = answer(await node.handler(1)(request("GET", "/v1/escalations")))
                assert listed["escalations"][0] == one["escalations"][0]

    anyio.run(main)


def test_a_shard_that_cannot_answer_yet_is_named_in_the_nodes_health() -> None:
    """A standby still reading its copy (or a shard changing hands) answers 503: the node's
    health names it, and a read of its operations is that 503."""
    layout = Layout("public", 3)

    async def ready(req: Request) -> Response:
        return Response(200, _shard_health())

    async def loading(req: Request) -> Response:
        return Response(
            503, b'{"error":"loading","detail":"reading","field":null}', [("Retry-After", "1")]
        )

    class Host:
        name = "n1"

        def held(self) -> set[int]:
            return {0}

        def handler(self, shard: int) -> Handler:
            return loading if shard == 2 else ready

        async def folded(self, shard: int, seq: int) -> None:
            raise AssertionError("not asked")

        async def caught_up(self, shard: int) -> None:
            raise AssertionError("not asked")

    class NoRelay:
        async def forward_at(self, shard: int, request: Request) -> tuple[Response, int]:
            raise AssertionError("not asked")

    router = ShardRouter(layout, Host(), NoRelay())

    async def main() -> None:
        health = answer(await router.handle(request("GET", "/v1/health")))
        assert health["live"] == 2  # the two shards that answered
        assert health["shards"] == {
            "node": "n1",
            "count": 3,
            "held": [0],
            "following": [1, 2],
            "not_ready": [2],
        }
        (op,) = shard_ids(layout, 2, 1)
        got = await router.handle(request("GET", f"/v1/operations/{op}"))
        assert (got.status, got.headers) == (503, [("Retry-After", "1")])
        listed = await router.handle(request("GET", "/v1/operations"))
        assert listed.status == 503

    anyio.run(main)


def _shard_health() -> bytes:
    """One shard's health, as its API gives it (one live operation)."""
    return msgspec.json.encode(
        Health(
            status="ok",
            version="0",
            log_head_sequence=3,
            log_head_hash="ab",
            live=1,
            escalated=0,
            you=Principal(name="root", uid=0, gid=0, pid=1, roles=["operator"]),
            log_store="postgresql",
        )
    )
