"""The database itself enforces the fencing, against a holder of the daemons' role (the role a
node connects as, granted by ``bide log init --writer-role``): no row of its own in the
records, no value of its own in the lease; only the node functions write, and they refuse a
round under a stale epoch, out of sequence, off the chain or off the segment layout."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from daemon.lease import Lease
from eventlog import pgstore
from eventlog.envelope import ZERO_HASH, record_hash
from eventlog.errors import SchemaError, StoreError
from eventlog.store import write_segments
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from tests.e2e.harness import until
from tests.eventlog._logtools import KeySet, payload_for
from tests.pgsupport import role

MAX_BIGINT = 2**63 - 1
APPEND = (
    "SELECT lease_epoch, in_term, head_seq, head_hash, refused FROM bide_append(%s, %s, "
    "%s::bigint[], %s::integer[], %s::bigint[], %s::bytea[])"
)
TAKE = "SELECT taken_epoch, term FROM bide_take_lease(%s, %s)"


@pytest.fixture
def writer_dsn(pg_dsn: str) -> Iterator[str]:
    """The schema initialised by its owner, and a DSN for the daemons' role it granted."""
    name = f"bidep_w_{secrets.token_hex(4)}"
    with contextmanager(role)(pg_dsn, name) as dsn:
        with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
            pgstore.init_schema(conn, writer=name)
        yield dsn


def _line(seq: int, prev: str, body: str = "x") -> bytes:
    return f'{{"kind":"event","seq":{seq},"prev":"{prev}","log":"{body}"}}'.encode()


def _take(conn: psycopg.Connection[Any], holder: str, seconds: float) -> tuple[int, str]:
    row = conn.execute(TAKE, (holder, seconds)).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM bide_records").fetchone()
    assert row is not None
    return int(row[0])


def test_the_writer_role_cannot_write_the_tables_directly(writer_dsn: str) -> None:
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        for statement in (
            "INSERT INTO bide_records (seq, segment, byte_offset, line, hash, epoch) "
            "VALUES (0, 1, 0, 'junk', 'h', 0)",
            f"UPDATE bide_lease SET epoch = {MAX_BIGINT}",
            "UPDATE bide_lease SET expires_at = 'infinity'",
            "DELETE FROM bide_lease",
            "INSERT INTO bide_snapshots (name, seq, data) VALUES ('state', 0, 'junk')",
            "UPDATE bide_meta SET value = '1'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        assert _count(conn) == 0
        assert conn.execute("SELECT epoch FROM bide_lease").fetchone() == (0,)


def test_a_round_off_the_chain_or_under_a_stale_epoch_is_refused(writer_dsn: str) -> None:
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        epoch, term = _take(conn, "node-a", 30)
        assert epoch == 1
        first = _line(0, ZERO_HASH)
        second_at = len(first) + 1
        ok = conn.execute(APPEND, (1, term, [0], [1], [0], [first])).fetchone()
        assert ok == (1, True, None, None, None)
        stored = conn.execute("SELECT hash, epoch FROM bide_records").fetchone()
        assert stored == (record_hash(first), 1)  # computed by the database, not given
        good = _line(1, record_hash(first))
        for why, args in {
            "wrong prev": (1, term, [1], [1], [second_at], [_line(1, "f" * 64)]),
            "a gap": (1, term, [2], [1], [second_at], [_line(2, record_hash(first))]),
            "record 0 again": (1, term, [0], [1], [0], [_line(0, ZERO_HASH, "y")]),
            "seq column and line disagree": (
                1,
                term,
                [1],
                [1],
                [second_at],
                [_line(5, record_hash(first))],
            ),
            "not a record": (1, term, [1], [1], [second_at], [b"junk"]),
            "off the layout": (1, term, [1], [1], [second_at + 7], [good]),
            "a later line off the chain": (
                1,
                term,
                [1, 2],
                [1, 1],
                [second_at, second_at + len(good) + 1],
                [good, _line(2, "0" * 64)],
            ),
            "a stale epoch": (0, term, [1], [1], [second_at], [good]),
            "an epoch ahead": (2, term, [1], [1], [second_at], [good]),
            # Whoever holds the role can read the epoch, not the term's secret.
            "the epoch in force without its secret": (1, "f" * 64, [1], [1], [second_at], [good]),
            "no secret": (1, "", [1], [1], [second_at], [good]),
        }.items():
            row = conn.execute(APPEND, args).fetchone()
            assert row is not None
            assert row[4] is not None, why
            assert _count(conn) == 1, why
        assert conn.execute(APPEND, (1, term, [1], [1], [second_at], [good])).fetchone() == (
            1,
            True,
            0,
            record_hash(first),
            None,
        )
        assert _count(conn) == 2
        # A snapshot only at a record the database holds, by the term in force.
        keep = "SELECT bide_keep_snapshot(%s, %s, %s, %s, %s)"
        assert conn.execute(keep, (1, term, 1, "f" * 64, b"forged")).fetchone() == (False,)
        assert conn.execute(keep, (0, term, 1, record_hash(good), b"stale")).fetchone() == (False,)
        assert conn.execute(keep, (1, "f" * 64, 1, record_hash(good), b"no secret")).fetchone() == (
            False,
        )
        assert conn.execute(keep, (1, term, 1, record_hash(good), b"kept")).fetchone() == (True,)


def test_the_role_alone_cannot_renew_or_release_another_nodes_term(writer_dsn: str) -> None:
    """The epoch and the holder are readable by the role: without the term's secret neither
    keeps a dead node's lease alive nor hands a live one over."""
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        epoch, term = _take(conn, "node-a", 30)
        for statement, params in (
            ("SELECT * FROM bide_renew_lease(30, 'node-a', %s, %s)", (epoch, "f" * 64)),
            ("SELECT * FROM bide_release_lease('node-a', %s, %s)", (epoch, "f" * 64)),
            ("SELECT * FROM bide_release_lease('node-a', %s, %s)", (epoch, "")),
        ):
            assert conn.execute(statement, params).fetchone() is None
        row = conn.execute("SELECT expires_at > now() FROM bide_lease").fetchone()
        assert row == (True,)
        assert conn.execute(
            "SELECT * FROM bide_release_lease('node-a', %s, %s)", (epoch, term)
        ).fetchone() == (epoch,)


def test_no_value_written_to_the_lease_can_stop_a_takeover(pg_dsn: str, writer_dsn: str) -> None:
    # Even the owner's own UPDATE is held to the lease's rules by its trigger.
    with psycopg.connect(pg_dsn, autocommit=True) as owner:
        for statement in (
            f"UPDATE bide_lease SET epoch = {MAX_BIGINT}",
            "UPDATE bide_lease SET epoch = 9007199254740991",  # the cap
            "UPDATE bide_lease SET epoch = epoch + 2",
            "UPDATE bide_lease SET epoch = epoch - 1",
            "UPDATE bide_lease SET expires_at = 'infinity'",
            "UPDATE bide_lease SET expires_at = now() + interval '2 hours'",
            "DELETE FROM bide_lease",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="bide_lease"):
                owner.execute(statement)
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        for statement in (
            "SELECT * FROM bide_take_lease('node-a', 1e9)",
            "SELECT * FROM bide_take_lease('node-a', 'infinity')",
            "SELECT * FROM bide_take_lease(repeat('a', 10000), 5)",
        ):
            with pytest.raises(psycopg.Error):
                conn.execute(statement)
        assert _take(conn, "node-a", 0.2)[0] == 1
    # Once node-a's lease runs out, the next node takes it at the next epoch.
    taken: list[int] = []
    with pgstore.connect(pgstore.PgSettings(writer_dsn)) as conn:

        def take() -> bool:
            term = pgstore.take_lease(conn, "node-b", 30)
            taken.extend([] if term is None else [term.epoch])
            return bool(taken)

        until(take, 10, "node-b to take the lease node-a let run out")
    assert taken == [2]


def test_renewing_past_the_cap_is_refused(writer_dsn: str) -> None:
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        epoch, term = _take(conn, "node-a", 30)
        with pytest.raises(psycopg.errors.RaiseException, match="at most 3600 s"):
            conn.execute("SELECT * FROM bide_renew_lease(1e9, 'node-a', %s, %s)", (epoch, term))
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM (expires_at - now())) FROM bide_lease"
        ).fetchone()
        assert row is not None
        assert float(row[0]) <= 30


#: What ``bide log init --writer-role`` granted in schema version 1.
_V1_GRANTS = (
    "GRANT SELECT, INSERT ON bide_records, bide_snapshots TO {w}",
    "GRANT SELECT, UPDATE ON bide_lease TO {w}",
    "GRANT SELECT ON bide_meta TO {w}",
    "GRANT UPDATE (data, seq, written_at) ON bide_snapshots TO {w}",
)


def test_log_init_upgrades_version_1_and_takes_the_direct_grants_back(pg_dsn: str) -> None:
    name = f"bidep_w_{secrets.token_hex(4)}"
    with contextmanager(role)(pg_dsn, name) as writer:
        with psycopg.connect(pg_dsn) as conn:  # a database set up by bide 1's `log init`
            conn.execute(pgstore._UPGRADES[0])
            conn.execute("INSERT INTO bide_meta VALUES ('schema_version', '1')")
            conn.execute("UPDATE bide_lease SET expires_at = 'infinity'")
            for grant in _V1_GRANTS:
                conn.execute(sql.SQL(grant).format(w=sql.Identifier(name)))
            conn.commit()
        with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
            assert pgstore.init_schema(conn, writer=name) == (1, pgstore.SCHEMA_VERSION)
            assert pgstore.init_schema(conn, writer=name) == (pgstore.SCHEMA_VERSION,) * 2
        with psycopg.connect(writer, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "INSERT INTO bide_records (seq, segment, byte_offset, line, hash, "
                    "epoch) VALUES (0, 1, 0, 'junk', 'h', 0)"
                )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE bide_snapshots SET data = 'junk'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE bide_lease SET epoch = epoch + 1")
            # The infinite lease a version-1 writer could set was cut to the cap on upgrade.
            row = conn.execute("SELECT expires_at < 'infinity' FROM bide_lease").fetchone()
            assert row == (True,)


def test_log_init_names_a_writer_role_the_database_cannot_fence(pg_dsn: str) -> None:
    with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
        pgstore.init_schema(conn)
        assert pgstore.writer_unfenced(conn, "postgres") == "role postgres is a superuser"


def test_a_node_as_the_writer_role_appends_keeps_snapshots_and_hands_over(
    writer_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    """The documented setup end to end: the daemons' role, with only SELECT and the functions,
    takes the lease, appends a log that exports byte for byte and verifies, keeps a snapshot,
    hands the lease over, and the next node takes it at the next epoch."""
    settings = pgstore.PgSettings(writer_dsn)

    async def run() -> tuple[int, int]:
        a = Lease(settings, tmp_path / "a-log", lease_seconds=30, renew_seconds=5)
        b = Lease(settings, tmp_path / "b-log", lease_seconds=30, renew_seconds=5)
        await a.open()
        await b.open()
        try:
            epoch = await a.acquire()
            store = pgstore.PgStore(settings, a.term)
            try:
                async with LogWriter(
                    tmp_path / "a-log",
                    ks.keyring(),
                    ks.signer(),
                    segment_bytes=2048,
                    checkpoint_every=5,
                    checkpoint_interval=3600,
                    store=store,
                ) as w:
                    for start in range(0, 30, 3):
                        await w.append_many([payload_for(i) for i in range(start, start + 3)])
                with pgstore.connect(settings) as conn:
                    head = pgstore.head(conn)
                assert head is not None
                assert store.save_snapshot(head[0], head[1], b"snapshot")
            finally:
                store.close()
            await a.release()
            with anyio.fail_after(10):
                return epoch, await b.acquire()
        finally:
            await a.aclose()
            await b.aclose()

    first, second = anyio.run(run)
    assert (first, second) == (1, 2)
    with pgstore.connect(settings, read_only=True) as conn:
        write_segments(pgstore.iter_all(conn), tmp_path / "export")
    report = verify_log(tmp_path / "export", ks.verify_key())
    assert report.damage is None
    assert report.torn is None
    assert (tmp_path / "b-log").is_dir()  # the standby copied the log before taking over


def test_log_init_refuses_to_upgrade_a_lease_epoch_past_the_cap_and_names_the_fix(
    pg_dsn: str,
) -> None:
    with psycopg.connect(pg_dsn) as conn:  # version 1, its epoch set to bigint's maximum
        conn.execute(pgstore._UPGRADES[0])
        conn.execute("INSERT INTO bide_meta VALUES ('schema_version', '1')")
        conn.execute(f"UPDATE bide_lease SET epoch = {MAX_BIGINT}")
        conn.commit()
    with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
        with pytest.raises(StoreError, match="set it one past the last epoch"):
            pgstore.init_schema(conn)
        assert pgstore.schema_version(conn) == 1  # nothing changed
        conn.rollback()
        conn.execute(
            "UPDATE bide_lease SET epoch = (SELECT coalesce(max(epoch), 0) + 1 FROM bide_records)"
        )
        conn.commit()
        assert pgstore.init_schema(conn) == (1, pgstore.SCHEMA_VERSION)


def test_a_version_1_schema_is_still_read_but_a_node_needs_the_upgrade(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(pgstore._UPGRADES[0])
        conn.execute("INSERT INTO bide_meta VALUES ('schema_version', '1')")
        conn.commit()
    with pgstore.connect(pgstore.PgSettings(pg_dsn), read_only=True) as conn:
        pgstore.require_schema(conn)  # export, verify and status read it as before
    with (
        pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn,
        pytest.raises(SchemaError, match="run `bide log init --dsn DSN` to upgrade"),
    ):
        pgstore.require_schema(conn)


def test_the_documented_roles_an_owner_who_is_no_superuser_and_the_daemons_role(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    """As the deploy guide sets it up: the tables and functions belong to an ordinary role
    (the functions run as it), and the daemons' role appends and keeps the lease through
    them."""
    owner_name, writer_name = (f"bidep_{k}_{secrets.token_hex(4)}" for k in "ow")
    with (
        contextmanager(role)(pg_dsn, owner_name) as owner_dsn,
        contextmanager(role)(pg_dsn, writer_name) as writer_dsn,
    ):
        schema = f"bidep_s_{secrets.token_hex(4)}"  # dropped with its owner (DROP OWNED)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                    sql.Identifier(schema), sql.Identifier(owner_name)
                )
            )
        options = f"-csearch_path={schema}"
        owner = pgstore.PgSettings(psycopg.conninfo.make_conninfo(owner_dsn, options=options))
        writer = pgstore.PgSettings(psycopg.conninfo.make_conninfo(writer_dsn, options=options))
        with pgstore.connect(owner) as conn:
            assert pgstore.init_schema(conn, writer=writer_name)[1] == pgstore.SCHEMA_VERSION
            assert pgstore.writer_unfenced(conn, writer_name) is None
            assert pgstore.writer_unfenced(conn, owner_name) is not None
        with pgstore.connect(writer) as conn:
            term = pgstore.take_lease(conn, "node-a", 30)
        assert term is not None
        assert term.epoch == 1
        store = pgstore.PgStore(writer, term)

        async def run() -> None:
            async with LogWriter(
                tmp_path / "log", ks.keyring(), ks.signer(), checkpoint_interval=3600, store=store
            ) as w:
                await w.append_many([payload_for(i) for i in range(5)])

        try:
            anyio.run(run)
        finally:
            store.close()
        with pgstore.connect(writer) as conn:
            assert pgstore.release_lease(conn, "node-a", term)
            taken = pgstore.take_lease(conn, "node-b", 30)
            assert taken is not None
            assert taken.epoch == 2
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "INSERT INTO bide_records (seq, segment, byte_offset, line, "
                    "hash, epoch) VALUES (1000, 9, 0, 'junk', 'h', 2)"
                )
            conn.rollback()
            head = pgstore.head(conn)
        assert head is not None
        assert head[0] >= 5
