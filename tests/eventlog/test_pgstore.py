"""The PostgreSQL store against a real server: schema, mirrored appends, fencing, export and
import byte for byte, and the refusals (password in a DSN, synchronous_commit off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import psycopg
import pytest

from eventlog import pgstore
from eventlog.envelope import ZERO_HASH
from eventlog.errors import DivergedError, FencedError, SchemaError, StoreError
from eventlog.segments import list_segments
from eventlog.store import StoredLine, file_lines, write_segments
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet, build_log, payload_for


def _settings(dsn: str) -> pgstore.PgSettings:
    return pgstore.PgSettings(dsn)


def _init(dsn: str) -> None:
    with pgstore.connect(_settings(dsn)) as conn:
        pgstore.init_schema(conn)


def _files(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for _, p in list_segments(log_dir)}


def _write(log_dir: Path, ks: KeySet, store: pgstore.PgStore, events: int) -> None:
    async def run() -> None:
        async with LogWriter(
            log_dir,
            ks.keyring(),
            ks.signer(),
            segment_bytes=2048,
            checkpoint_every=5,
            checkpoint_interval=3600,
            store=store,
        ) as w:
            for start in range(0, events, 3):
                await w.append_many([payload_for(i) for i in range(start, start + 3)])

    anyio.run(run)


def test_init_creates_and_reports_the_schema(pg_dsn: str) -> None:
    with pgstore.connect(_settings(pg_dsn)) as conn:
        with pytest.raises(SchemaError, match="bide log init"):
            pgstore.require_schema(conn)
        assert pgstore.init_schema(conn) == (None, pgstore.SCHEMA_VERSION)
        assert pgstore.init_schema(conn) == (pgstore.SCHEMA_VERSION, pgstore.SCHEMA_VERSION)
        pgstore.require_schema(conn)
        conn.execute("UPDATE bide_meta SET value = '99' WHERE key = 'schema_version'")
        conn.commit()
        with pytest.raises(SchemaError, match="newer than this bide knows"):
            pgstore.require_schema(conn)


def test_mirrored_log_exports_byte_identical_and_verifies(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        term = pgstore.take_lease(conn, "node-a", 30)
    assert term is not None
    assert term.epoch == 1
    store = pgstore.PgStore(_settings(pg_dsn), term)
    _write(tmp_path / "log", ks, store, 60)
    _write(tmp_path / "log", ks, store, 9)  # reopen: continues the same chain in both
    store.close()
    local = _files(tmp_path / "log")
    assert len(local) > 3  # several segments: the layout is carried too
    with pgstore.connect(_settings(pg_dsn), read_only=True) as conn:
        n = write_segments(pgstore.iter_all(conn, batch=7), tmp_path / "export")
    assert _files(tmp_path / "export") == local
    assert n == sum(1 for _ in file_lines(tmp_path / "log"))
    report = verify_log(tmp_path / "export", ks.verify_key())
    assert report.damage is None
    assert report.torn is None
    assert store.commits >= 24


def test_a_takeover_fences_the_old_epoch(pg_dsn: str, ks: KeySet, tmp_path: Path) -> None:
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        old = pgstore.take_lease(conn, "node-a", 30)
        assert old is not None
        assert pgstore.take_lease(conn, "node-b", 30) is None  # not expired: refused
        store = pgstore.PgStore(_settings(pg_dsn), old)

        async def run() -> None:
            async with LogWriter(
                tmp_path / "log", ks.keyring(), ks.signer(), checkpoint_interval=3600, store=store
            ) as w:
                await w.append(b"before")
                before = pgstore.head(conn)
                # node-a's lease runs out (here: handed over) and node-b takes it.
                assert pgstore.release_lease(conn, "node-a", old)
                new = pgstore.take_lease(conn, "node-b", 30)
                assert new is not None
                assert new.epoch == old.epoch + 1
                with pytest.raises(FencedError, match=f"epoch is {new.epoch}"):
                    await w.append(b"after")
                assert pgstore.head(conn) == before  # nothing of the refused round landed
                assert not pgstore.renew_lease(conn, "node-a", old, 30)
                with pytest.raises(FencedError):  # the writer stays stopped
                    await w.append(b"again")

        try:
            anyio.run(run)  # its closing checkpoint is not attempted: the writer stopped
        finally:
            store.close()
        assert store.fenced == 1
        row = pgstore.lease_row(conn)
        assert (row.holder, row.epoch) == ("node-b", old.epoch + 1)
        assert row.remaining > 20


def test_a_round_that_does_not_follow_the_stored_head_is_refused(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        epoch = pgstore.take_lease(conn, "node-a", 30)
    assert epoch is not None
    build_log(tmp_path / "other", ks, 6)  # a local log the database never saw
    store = pgstore.PgStore(_settings(pg_dsn), epoch)

    async def run() -> None:
        async with LogWriter(
            tmp_path / "other", ks.keyring(), ks.signer(), checkpoint_interval=3600, store=store
        ) as w:
            with pytest.raises(DivergedError, match="missing"):
                await w.append(b"x")

    try:
        anyio.run(run)
    finally:
        store.close()
    with pgstore.connect(_settings(pg_dsn)) as conn:
        assert pgstore.head(conn) is None


def test_import_then_export_round_trips(pg_dsn: str, ks: KeySet, tmp_path: Path) -> None:
    _init(pg_dsn)
    build_log(tmp_path / "log", ks, 40)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        n = pgstore.import_lines(conn, file_lines(tmp_path / "log"), batch=11)
        with pytest.raises(StoreError, match="empty"):
            pgstore.import_lines(conn, file_lines(tmp_path / "log"))
        write_segments(pgstore.iter_all(conn), tmp_path / "export")
    assert n == sum(1 for _ in file_lines(tmp_path / "log"))
    assert _files(tmp_path / "export") == _files(tmp_path / "log")


def test_records_are_append_only(pg_dsn: str) -> None:
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        conn.execute(
            "INSERT INTO bide_records (seq, segment, byte_offset, line, hash, epoch) "
            "VALUES (0, 1, 0, 'x', 'h', 0)"
        )
        conn.commit()
        for stmt in (
            "UPDATE bide_records SET line = 'y'",
            "DELETE FROM bide_records",
            "TRUNCATE bide_records",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(stmt)
            conn.rollback()


def test_a_password_in_the_dsn_is_refused_and_not_repeated(pg_dsn: str) -> None:
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, password="hunter2-secret")
    with pytest.raises(StoreError, match="password_file") as err:
        pgstore.connect(_settings(dsn))
    assert "hunter2" not in str(err.value)


def test_a_password_file_must_be_private(pg_dsn: str, tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("hunter2-secret\n")
    pw.chmod(0o644)
    with pytest.raises(StoreError, match="chmod 600") as err:
        pgstore.connect(pgstore.PgSettings(pg_dsn, password_file=pw))
    assert "hunter2" not in str(err.value)
    pw.chmod(0o600)
    pgstore.connect(pgstore.PgSettings(pg_dsn, password_file=pw)).close()  # trust auth


def test_synchronous_commit_off_is_refused_unless_configured(pg_dsn: str) -> None:
    options = psycopg.conninfo.conninfo_to_dict(pg_dsn)["options"]
    assert isinstance(options, str)  # the test schema's search_path
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options=options + " -csynchronous_commit=off")
    with pytest.raises(StoreError, match="synchronous_commit"):
        pgstore.connect(_settings(dsn))
    pgstore.connect(pgstore.PgSettings(dsn, allow_async_commit=True)).close()


def test_without_psycopg_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "try:\n import eventlog.pgstore\nexcept ImportError as e: print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    assert "pip install 'bide[postgres]'" in out.stdout


def _record(seq: int, prev: str, body: str, offset: int = 0) -> StoredLine:
    """A line shaped as the writer frames one (kind, seq, prev first), in segment 1."""
    data = f'{{"kind":"event","seq":{seq},"prev":"{prev}","log":"{body}"}}'.encode()
    return StoredLine(seq, 1, offset, data)


def test_a_round_already_in_the_database_is_a_divergence(pg_dsn: str) -> None:
    """A commit whose outcome was lost leaves its records in the database; the node's retry
    of other bytes at the same places is refused as diverged (it re-syncs), never doubled."""
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        epoch = pgstore.take_lease(conn, "node-a", 30)
    assert epoch is not None
    store = pgstore.PgStore(_settings(pg_dsn), epoch)
    first = _record(0, ZERO_HASH, "a")
    try:
        store.commit([first], ZERO_HASH)
        with pytest.raises(DivergedError, match="already holds record 0"):
            store.commit([_record(0, ZERO_HASH, "b")], ZERO_HASH)
        second = _record(1, first.hash, "c", len(first.data) + 1)
        store.commit([second], first.hash)
    finally:
        store.close()
    with pgstore.connect(_settings(pg_dsn)) as conn:
        assert [ln.data for ln in pgstore.iter_all(conn)] == [first.data, second.data]


def test_a_snapshot_is_kept_only_by_the_holder_at_a_committed_record_and_never_goes_back(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    _init(pg_dsn)
    with pgstore.connect(_settings(pg_dsn)) as conn:
        epoch = pgstore.take_lease(conn, "node-a", 30)
    assert epoch is not None
    store = pgstore.PgStore(_settings(pg_dsn), epoch)
    _write(tmp_path / "log", ks, store, 12)
    lines = list(file_lines(tmp_path / "log"))
    early, late = lines[3], lines[-1]
    try:
        assert store.load_snapshot() is None
        assert store.save_snapshot(late.seq, late.hash, b"late")
        assert store.load_snapshot() == b"late"
        assert not store.save_snapshot(early.seq, early.hash, b"early")  # older: kept out
        assert not store.save_snapshot(late.seq + 1, late.hash, b"ahead")  # not committed
        assert not store.save_snapshot(late.seq, early.hash, b"forged")  # not that record
        stale = pgstore.PgStore(_settings(pg_dsn), pgstore.Term(epoch.epoch - 1, epoch.secret))
        assert not stale.save_snapshot(late.seq, late.hash, b"stale")  # another epoch
        assert store.load_snapshot() == b"late"
    finally:
        store.close()
