"""The relay, end to end over a real PostgreSQL catalog: a write for a shard held elsewhere
is recorded by the holder and answered; the database never holds it in clear; a forged or
moved row is refused and never executed; a holder that does not answer gives a bounded 503;
a row a dead holder took is taken again by the next."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.api.peer import Peer
from daemon.api.server import Request, Response
from daemon.config import ApiConfig
from daemon.engine.intake import Authority
from daemon.shards.relay import ANSWER_DOMAIN, REQUEST_DOMAIN, Relay, work_channel
from eventlog import keys
from eventlog.pgstore import PgSettings
from eventlog.sealed import open_blob, seal_blob
from eventlog.shards import Layout
from tests.shards.support import (
    answer,
    catalog,
    execute,
    intake_rows,
    node_config,
    prepare,
    request,
    shard_ids,
    two_nodes,
    until,
)

JOB = "job-7f3a9c-secret-looking"


def _watch(op_id: str, job: str = JOB) -> dict[str, object]:
    return {"provider": "sim", "job_id": job, "operation_id": op_id}


def test_a_registration_through_a_non_holder_is_recorded_by_the_holder_never_in_clear(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (op,) = shard_ids(layout, 1, 1)  # shard 1: node b holds it

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout, serve=False) as (a, b):
            got: list[Response] = []
            async with anyio.create_task_group() as tg:

                async def register() -> None:
                    got.append(await a.router.handle(request("POST", "/v1/operations", _watch(op))))

                tg.start_soon(register)
                await until(lambda: len(intake_rows(pg_dsn)) == 1, "the relayed row")
                (row,) = intake_rows(pg_dsn)
                sealed = bytes(row[4])
                assert (row[1], row[2], row[3]) == (1, "POST operations", "")
                # Neither the job id nor the operation id is in the database in clear.
                assert JOB.encode() not in sealed
                assert op.encode() not in sealed
                assert b"sim" not in sealed.split(b"\n", 1)[1]
                serving = anyio.CancelScope()

                async def serve() -> None:
                    with serving:
                        await b.relay.serve(1, b.handlers[1])

                tg.start_soon(serve)
                await until(lambda: bool(got), "the answer")
                first = answer(got[0])
                assert (got[0].status, first["created"]) == (201, True)
                assert first["operation_id"] == op
                # Recorded by the holder of shard 1, and nowhere else.
                assert op in b.engines[1].ops
                assert op not in a.engines[0].ops
                # The same request again: the 200 of a retry, nothing recorded twice.
                again = await a.router.handle(request("POST", "/v1/operations", _watch(op)))
                assert again.status == 200
                assert answer(again) == {**first, "created": False}
                # A different request for the id: the holder's conflict, as one node says it.
                other = await a.router.handle(
                    request("POST", "/v1/operations", _watch(op, "another-job"))
                )
                assert (other.status, answer(other)["error"]) == (409, "operation_id_in_use")
                assert intake_rows(pg_dsn) == []  # each answered row deleted by its forwarder
                assert (a.relay.counts["forwarded"], a.relay.counts["answered"]) == (3, 3)
                assert b.relay.counts["served"] == 3
                serving.cancel()

    anyio.run(main)


def test_a_forged_row_is_refused_and_never_executed(tmp_path: Path, pg_dsn: str) -> None:
    keyring = prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    keys.generate(tmp_path / "other-keys")
    stranger = keys.load_keyring(tmp_path / "other-keys")
    # A request sealed with another key: its bytes look right, its key is not the log's.
    forged = seal_blob(stranger, REQUEST_DOMAIN, f"{layout.base}\n1\nforged".encode(), b"x")

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (_, b):
            await execute(
                pg_dsn,
                "INSERT INTO bide_intake (shard, kind, op_id, request, from_node, rid) "
                "VALUES (1, 'POST operations', '', %s, 'mallory', 'forged'), "
                "(1, 'POST operations', '', %s, 'mallory', 'garbage')",
                (forged, b"not a sealed request"),
            )
            await execute(pg_dsn, "SELECT pg_notify(%s, %s)", (work_channel(1), layout.base))
            await until(
                lambda: all(r[7] is not None for r in intake_rows(pg_dsn)), "both rows answered"
            )
            for row in intake_rows(pg_dsn):
                assert row[8] == 400
                bound = f"{layout.base}\n1\n{row[5]}".encode()
                opened = open_blob(keyring, ANSWER_DOMAIN, bound, bytes(row[9]), where="test")
                assert b"relay_refused" in opened
            assert not b.engines[1].ops  # nothing executed
            assert (b.relay.counts["refused"], b.relay.counts["served"]) == (2, 0)

    anyio.run(main)


def test_a_row_moved_to_another_shard_fails_and_is_never_executed(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (op,) = shard_ids(layout, 1, 1)

    async def main() -> None:
        # Only shard 0 is served (by node a); the row is written for shard 1 and moved to 0.
        async with two_nodes(tmp_path, pg_dsn, layout, serve=False) as (a, b):
            got: list[Response] = []
            async with anyio.create_task_group() as tg:

                async def register() -> None:
                    got.append(await a.router.handle(request("POST", "/v1/operations", _watch(op))))

                tg.start_soon(register)
                await until(lambda: len(intake_rows(pg_dsn)) == 1, "the relayed row")
                await execute(pg_dsn, "UPDATE bide_intake SET shard = 0")
                tg.start_soon(a.relay.serve, 0, a.handlers[0])
                await until(lambda: bool(got), "the answer")
                tg.cancel_scope.cancel()
            # Shard 0's holder could not open it: refused, and its refusal cannot pass for
            # shard 1's answer either.
            assert got[0].status == 503
            assert "could not be authenticated" in answer(got[0])["detail"]
            assert not a.engines[0].ops
            assert not b.engines[1].ops

    anyio.run(main)


def test_no_answer_in_time_is_a_503_and_the_untaken_row_is_withdrawn(
    tmp_path: Path, pg_dsn: str
) -> None:
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (op,) = shard_ids(layout, 1, 1)

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout, serve=False, answer_within=1.0) as (a, _):
            started = time.monotonic()
            got = await a.router.handle(request("POST", "/v1/operations", _watch(op)))
            assert 1.0 <= time.monotonic() - started < 5.0
            assert got.status == 503
            assert ("Retry-After", "1") in got.headers
            body = answer(got)
            assert body["error"] == "relay_unanswered"
            assert "nothing was recorded" in body["detail"]
            assert a.relay.counts["unanswered"] == 1
            assert intake_rows(pg_dsn) == []

    anyio.run(main)


@pytest.mark.parametrize("recorded_before", [False, True])
def test_a_row_a_dead_holder_took_is_taken_again_by_the_next(
    tmp_path: Path, pg_dsn: str, recorded_before: bool
) -> None:
    """The holder took the row and died (before recording it, or after recording it but
    before answering): the next holder takes it again; a registration recorded once is
    answered as its retry."""
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (op,) = shard_ids(layout, 1, 1)

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout, serve=False) as (a, b):
            first: dict[str, object] | None = None
            if recorded_before:
                direct = await b.handlers[1](request("POST", "/v1/operations", _watch(op)))
                assert direct.status == 201
                first = answer(direct)
            got: list[Response] = []
            async with anyio.create_task_group() as tg:

                async def register() -> None:
                    got.append(await a.router.handle(request("POST", "/v1/operations", _watch(op))))

                tg.start_soon(register)
                await until(lambda: len(intake_rows(pg_dsn)) == 1, "the relayed row")
                await execute(pg_dsn, "UPDATE bide_intake SET taken_at = now()")  # taken, then died
                tg.start_soon(b.relay.serve, 1, b.handlers[1])
                await until(lambda: bool(got), "the answer")
                tg.cancel_scope.cancel()
            if recorded_before:
                assert got[0].status == 200
                assert answer(got[0]) == {**(first or {}), "created": False}
            else:
                assert got[0].status == 201
            assert len([o for o in b.engines[1].ops if o == op]) == 1

    anyio.run(main)


def test_the_holder_takes_the_roles_the_forwarder_computed_never_its_own_groups(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The agent's groups are on the forwarder's host: its roles there decide, even where
    the holder's own config would admit the agent."""
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)
    (op,) = shard_ids(layout, 1, 1)
    stranger = Peer(pid=1, uid=41001, gid=41001)  # no account, in no group
    body = msgspec.json.encode(_watch(op))

    def register() -> Request:
        return Request("POST", "/v1/operations", "/v1/operations", {}, {}, body, stranger)

    async def main() -> None:
        async with two_nodes(tmp_path, pg_dsn, layout) as (a, b):
            admits_all = a.relay.authority
            # On the forwarder's host only the root group's members are agents.
            a.relay.authority = Authority(node_config(tmp_path, ApiConfig(agents_group="root")))
            refused = await a.router.handle(register())
            assert (refused.status, answer(refused)["error"]) == (403, "no_role")
            assert not b.engines[1].ops
            a.relay.authority = admits_all
            got = await a.router.handle(register())
            assert got.status == 201, got.body
            recorded = b.engines[1].ops[op]
            assert (recorded.registered_by_uid, recorded.registered_by) == (41001, "uid:41001")

    anyio.run(main)


def test_without_the_database_a_write_is_a_bounded_503_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    """Nothing answers on the catalog's port: the forwarder says so within its bound, and
    the holder's serve keeps trying (it never ends the shard's term)."""
    keyring = prepare(tmp_path)
    layout = Layout("public", 2)
    nowhere = PgSettings("postgresql://postgres@127.0.0.1:1/test", connect_timeout=1.0)
    cfg = node_config(tmp_path)
    relay = Relay(nowhere, layout, "a", keyring, authority=Authority(cfg), timeout=1.0)
    calls: list[Request] = []

    async def handler(req: Request) -> Response:
        calls.append(req)
        raise AssertionError("nothing to serve")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(relay.run)
            tg.start_soon(relay.serve, 1, handler)
            started = time.monotonic()
            got = await relay.forward(1, request("POST", "/v1/operations", _watch("x")))
            assert time.monotonic() - started < 5.0
            assert (got.status, answer(got)["error"]) == (503, "relay_unanswered")
            assert ("Retry-After", "1") in got.headers
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # serve was still running: it did not raise
        assert calls == []

    anyio.run(main)


def test_rows_older_than_an_hour_are_pruned_by_the_holder(tmp_path: Path, pg_dsn: str) -> None:
    """A forwarder that died while waiting leaves its row: the shard's holder removes it
    once it is an hour old (the table stays bounded); younger rows and other shards' stay."""
    prepare(tmp_path)
    layout = catalog(pg_dsn, 2)

    async def main() -> None:
        for shard, rid, age in (
            (1, "old", "2 hours"),
            (1, "young", "10 minutes"),
            (0, "other", "2 hours"),
        ):
            await execute(
                pg_dsn,
                "INSERT INTO bide_intake (shard, kind, op_id, request, from_node, rid,"
                " created_at, taken_at, answered_at, status, answer) VALUES"
                " (%s, 'POST operations', '', '', 'gone', %s, now() - %s::interval, now(),"
                " now(), 201, '')",
                (shard, rid, age),
            )
        async with (
            two_nodes(tmp_path, pg_dsn, layout, serve=False) as (_, b),
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(b.relay.serve, 1, b.handlers[1])
            await until(
                lambda: {r[5] for r in intake_rows(pg_dsn)} == {"young", "other"},
                "the old row of shard 1 pruned",
            )
            tg.cancel_scope.cancel()

    anyio.run(main)
