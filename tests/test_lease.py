"""The node's side of the lease (``daemon.lease``) against a real PostgreSQL: the standby's
copy of the log (an uncommitted tail cut, a foreign copy rebuilt), and a term ended at once by
a fenced append or a refused renewal."""

from __future__ import annotations

from pathlib import Path

import anyio
import psycopg
import pytest

from daemon.lease import Lease
from eventlog import pgstore
from eventlog.errors import FencedError
from eventlog.segments import QUARANTINE_DIR, list_segments
from eventlog.store import cut_after, file_lines
from tests.eventlog._logtools import KeySet, build_log, make_keys


@pytest.fixture
def ks(tmp_path: Path) -> KeySet:
    return make_keys(tmp_path / "keys")


def _bytes(log_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for _, p in list_segments(log_dir))


def test_cut_after_keeps_the_prefix_and_quarantines_the_rest(ks: KeySet, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    build_log(log_dir, ks, 40)  # several 2 KB segments
    lines = list(file_lines(log_dir))
    keep = lines[len(lines) // 3]
    before = _bytes(log_dir)
    assert cut_after(log_dir, keep.seq, "0" * 64) is None  # not that record: untouched
    assert _bytes(log_dir) == before
    kept = cut_after(log_dir, keep.seq, keep.hash)
    assert kept is not None
    assert kept.parent.name == QUARANTINE_DIR
    after = list(file_lines(log_dir))
    assert after[-1].seq == keep.seq
    assert _bytes(log_dir) + kept.read_bytes() == before


def _import(dsn: str, log_dir: Path, upto: int) -> None:
    with pgstore.connect(pgstore.PgSettings(dsn)) as conn:
        pgstore.init_schema(conn)
        pgstore.import_lines(conn, (ln for ln in file_lines(log_dir) if ln.seq <= upto))


def _follow(dsn: str, log_dir: Path) -> None:
    async def run() -> None:
        lease = Lease(pgstore.PgSettings(dsn), log_dir)
        await lease.open()
        try:
            await lease.follow()
        finally:
            await lease.aclose()

    anyio.run(run)


def test_a_standby_cuts_only_the_tail_the_database_never_committed(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    build_log(log_dir, ks, 40)
    lines = list(file_lines(log_dir))
    committed = lines[-5]  # the last four were synced here, never committed there
    _import(pg_dsn, log_dir, committed.seq)
    _follow(pg_dsn, log_dir)
    assert [ln.seq for ln in file_lines(log_dir)][-1] == committed.seq
    assert len(list((log_dir / QUARANTINE_DIR).iterdir())) == 1
    assert not list(tmp_path.glob("log.stale-*"))  # the copy was kept, not moved aside


def test_a_copy_that_is_not_the_databases_is_moved_aside_and_rebuilt(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    build_log(tmp_path / "theirs", ks, 30)
    _import(pg_dsn, tmp_path / "theirs", 10**9)
    build_log(tmp_path / "log", ks, 12)  # another log altogether
    _follow(pg_dsn, tmp_path / "log")
    assert _bytes(tmp_path / "log") == _bytes(tmp_path / "theirs")
    assert len(list(tmp_path.glob("log.stale-*"))) == 1


def _active(dsn: str, log_dir: Path, renew: float) -> Lease:
    return Lease(
        pgstore.PgSettings(dsn), log_dir, lease_seconds=60, renew_seconds=renew, margin=0.2
    )


def test_a_fenced_append_ends_the_term_at_once(pg_dsn: str, tmp_path: Path) -> None:
    with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
        pgstore.init_schema(conn)

    async def run() -> None:
        lease = _active(pg_dsn, tmp_path / "log", renew=30)
        await lease.open()
        try:
            await lease.acquire()
            assert lease.allows(1.0)
            with anyio.fail_after(5):  # the next renewal is 30 s away
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lease.keep)
                    await anyio.sleep(0.1)
                    lease.fenced("append refused: the log's lease epoch is 9")
        finally:
            await lease.aclose()
        assert not lease.allows(0.0)

    with pytest.raises(ExceptionGroup) as caught:
        anyio.run(run)
    assert caught.group_contains(FencedError, match="epoch is 9")


def test_a_renewal_refused_after_a_takeover_ends_the_term(pg_dsn: str, tmp_path: Path) -> None:
    with pgstore.connect(pgstore.PgSettings(pg_dsn)) as conn:
        pgstore.init_schema(conn)

    async def run() -> None:
        lease = _active(pg_dsn, tmp_path / "log", renew=0.2)
        await lease.open()
        try:
            epoch = await lease.acquire()
            with psycopg.connect(pg_dsn, autocommit=True) as conn:  # another node took it
                conn.execute("UPDATE bide_lease SET holder = 'other', epoch = epoch + 1")
            assert epoch == 1
            with anyio.fail_after(5):
                await lease.keep()
        finally:
            await lease.aclose()

    with pytest.raises(FencedError, match="no longer this node's"):
        anyio.run(run)
