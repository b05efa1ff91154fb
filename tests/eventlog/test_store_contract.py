"""The contract every log store keeps (``eventlog.logstore``), run against each store: the
segment files (on tmp_path) and PostgreSQL (a schema of its own on the real server; skipped
without one, a failure under ``BIDE_REQUIRE_POSTGRES=1``).

The lines come from a real log written by the real writer, committed to the store under test
in write rounds, as a node commits them: what is read back, refused, followed, kept and
exported is what a user of either store relies on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from eventlog.envelope import decode_record
from eventlog.errors import DivergedError, FencedError, SchemaError
from eventlog.filestore import FileStore
from eventlog.logstore import Following, LogStore, Term, TermWriter
from eventlog.position import LogPosition
from eventlog.segments import list_segments
from eventlog.snapshot import seal_snapshot
from eventlog.store import StoredLine, file_lines
from eventlog.verify import verify_log
from tests.eventlog._logtools import KeySet, build_log, make_keys

STORES = ("files", "postgresql")
ROUND = 4  # lines per write round


def _typed(store: FileStore) -> LogStore:
    """mypy holds each store to the whole interface (the PostgreSQL one in
    :func:`_pg_store`)."""
    return store


def _following(store: LogStore) -> Following:
    return store.following()


@dataclasses.dataclass(frozen=True)
class Source:
    keys: KeySet
    log: Path
    lines: list[StoredLine]

    def rounds(self, start: int = 0, stop: int | None = None) -> list[list[StoredLine]]:
        got = self.lines[start:stop]
        return [got[i : i + ROUND] for i in range(0, len(got), ROUND)]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    """A closed, checkpointed log of several segments, written by the real writer."""
    root = tmp_path_factory.mktemp("contract-source")
    keys = make_keys(root / "keys")
    build_log(root / "log", keys, 40, segment_bytes=1024)
    lines = list(file_lines(root / "log"))
    assert len({ln.segment for ln in lines}) > 2
    return Source(keys, root / "log", lines)


def _pg_store(dsn: str) -> LogStore:
    from eventlog.pgstore import PgLogStore, PgSettings

    return PgLogStore(PgSettings(dsn))


@pytest.fixture(params=STORES)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], LogStore]]:
    """A maker of stores on one log (each call a store of its own: another node, or another
    process's view), all closed after the test."""
    made: list[LogStore] = []
    if request.param == "files":

        def new() -> LogStore:
            made.append(
                _typed(FileStore(tmp_path / "log", snapshot_path=tmp_path / "state.snapshot"))
            )
            return made[-1]
    else:
        dsn: str = request.getfixturevalue("pg_dsn")

        def new() -> LogStore:
            made.append(_pg_store(dsn))
            return made[-1]

    yield new
    for store in made:
        store.close()


@pytest.fixture
def store(make: Callable[[], LogStore]) -> LogStore:
    got = make()
    got.init()
    return got


def _commit(writer: TermWriter, rounds: list[list[StoredLine]], before: StoredLine | None) -> None:
    for lines in rounds:
        writer.commit(lines, before.hash if before else "0" * 64)
        before = lines[-1]


def _taken(store: LogStore, holder: str = "node-a") -> Term:
    term = store.take_lease(holder, 30)
    assert term is not None
    return term


def test_init_is_idempotent_and_required(make: Callable[[], LogStore]) -> None:
    store = make()
    assert store.version() is None
    with pytest.raises(SchemaError):
        store.require()
    before, version = store.init()
    assert before is None
    assert store.init() == (version, version)
    store.require()
    assert store.version() == version
    assert store.head() is None
    assert store.lines_after(-1) == []


def test_lines_committed_in_rounds_read_back_in_order(store: LogStore, source: Source) -> None:
    term = _taken(store)
    writer = store.writer(term)
    try:
        _commit(writer, source.rounds(), None)
        last = source.lines[-1]
        assert store.head() == writer.head() == (last.seq, last.hash)
        assert store.lines_after(-1) == writer.lines_after(-1) == source.lines
        assert store.lines_after(10, 5) == source.lines[11:16]
        assert list(store.iter_lines(after=20)) == source.lines[21:]
        assert store.epoch_changes() == [(0, term.epoch)]
    finally:
        writer.close()


def test_a_round_is_stored_whole_or_not_at_all(store: LogStore, source: Source) -> None:
    writer = store.writer(_taken(store))
    try:
        _commit(writer, source.rounds(0, 8), None)
        good = source.lines[8:12]
        unlinked = dataclasses.replace(
            good[2], data=good[2].data.replace(good[1].hash.encode(), b"f" * 64)
        )
        assert unlinked.data != good[2].data
        with pytest.raises(DivergedError):
            writer.commit([good[0], good[1], unlinked, good[3]], source.lines[7].hash)
        assert store.lines_after(-1) == source.lines[:8]  # not even the round's first lines
        writer.commit(good, source.lines[7].hash)
        assert store.lines_after(-1) == source.lines[:12]
    finally:
        writer.close()


def test_sequence_prev_hash_and_place_must_continue_the_head(
    store: LogStore, source: Source
) -> None:
    lines = source.lines
    writer = store.writer(_taken(store))
    try:
        with pytest.raises(DivergedError):
            writer.commit(lines[1:4], lines[0].hash)  # no genesis: not one past the head
        _commit(writer, source.rounds(0, 4), None)
        head = (lines[3].seq, lines[3].hash)
        refused = {
            "a gap": lines[5:8],
            "a record already stored": lines[3:6],
            "a renumbered line": [dataclasses.replace(lines[4], seq=5)],
            "another record's bytes": [dataclasses.replace(lines[4], data=lines[5].data)],
            "the wrong place": [dataclasses.replace(lines[4], offset=lines[4].offset + 1)],
        }
        for what, bad in refused.items():
            with pytest.raises(DivergedError):
                writer.commit(bad, lines[3].hash)
            assert store.head() == head, what
        writer.commit(lines[4:8], lines[3].hash)
        assert store.head() == (lines[7].seq, lines[7].hash)
    finally:
        writer.close()


def test_one_holder_at_a_time_and_a_stale_term_is_refused(
    make: Callable[[], LogStore], source: Source
) -> None:
    a, b = make(), make()
    a.init()
    assert not a.lease().held
    term_a = _taken(a, "node-a")
    assert a.lease().held
    assert a.lease().holder == "node-a"
    assert b.lease().held
    assert b.take_lease("node-b", 30) is None  # held: nobody else takes it
    assert a.renew_lease("node-a", term_a, 30)
    stale = a.writer(term_a)
    try:
        _commit(stale, source.rounds(0, 4), None)
        assert a.release_lease("node-a", term_a)
        assert not b.lease().held
        term_b = _taken(b, "node-b")
        assert term_b.epoch >= term_a.epoch
        assert not a.renew_lease("node-a", term_a, 30)
        with pytest.raises(FencedError):
            stale.commit(source.lines[4:8], source.lines[3].hash)
        forged = b.writer(Term(term_b.epoch, "not the secret"))
        try:
            with pytest.raises(FencedError):
                forged.commit(source.lines[4:8], source.lines[3].hash)
        finally:
            forged.close()
        assert b.head() == (source.lines[3].seq, source.lines[3].hash)
        current = b.writer(term_b)
        try:
            current.commit(source.lines[4:8], source.lines[3].hash)
        finally:
            current.close()
        assert b.lines_after(-1) == source.lines[:8]
    finally:
        stale.close()


def test_snapshots_round_trip_newer_only_and_only_in_term(
    make: Callable[[], LogStore], source: Source
) -> None:
    store = make()
    store.init()
    term = _taken(store)
    writer = store.writer(term)
    log_id = decode_record(source.lines[0].data).log

    def snapshot(seq: int) -> bytes:
        line = source.lines[seq]
        position = LogPosition(
            log_id=log_id,
            seq=seq,
            hash=line.hash,
            segment=line.segment,
            line_start=line.offset,
            end=line.offset + len(line.data) + 1,
            last_cp_seq=None,
            last_cp_hash="0" * 64,
            checkpoint_every=5,
            unsigned_run=0,
        )
        return seal_snapshot(
            source.keys.keyring(),
            source.keys.signer().mac_key,
            position,
            f"state at {seq}".encode(),
        )

    try:
        assert store.load_snapshot() is None
        _commit(writer, source.rounds(0, 24), None)
        at_10, at_5, at_20 = snapshot(10), snapshot(5), snapshot(20)
        assert writer.save_snapshot(10, source.lines[10].hash, at_10)
        assert store.load_snapshot() == writer.load_snapshot() == at_10
        assert not writer.save_snapshot(5, source.lines[5].hash, at_5)  # older
        assert not writer.save_snapshot(20, source.lines[19].hash, at_20)  # not that record
        assert not writer.save_snapshot(30, source.lines[30].hash, snapshot(30))  # not stored
        assert store.load_snapshot() == at_10
        assert writer.save_snapshot(20, source.lines[20].hash, at_20)
        assert make().load_snapshot() == at_20  # another node finds it
        assert store.release_lease("node-a", term)
        other = make()
        assert other.take_lease("node-b", 30) is not None
        assert not writer.save_snapshot(22, source.lines[22].hash, snapshot(22))  # stale term
        assert other.load_snapshot() == at_20
    finally:
        writer.close()


def test_export_is_the_log_byte_for_byte_and_verifies(
    store: LogStore, source: Source, tmp_path: Path
) -> None:
    writer = store.writer(_taken(store))
    try:
        _commit(writer, source.rounds(), None)
    finally:
        writer.close()
    out = tmp_path / "export"
    assert store.export(out) == len(source.lines)
    assert {p.name: p.read_bytes() for _, p in list_segments(out)} == {
        p.name: p.read_bytes() for _, p in list_segments(source.log)
    }
    report = verify_log(out, source.keys.verify_key())
    assert report.damage is None
    assert report.torn is None
    assert report.head_seq == source.lines[-1].seq


def test_import_goes_into_an_empty_store_only(store: LogStore, source: Source) -> None:
    assert store.import_lines(iter(source.lines)) == len(source.lines)
    assert store.lines_after(-1) == source.lines
    with pytest.raises(Exception, match="already holds"):
        store.import_lines(iter(source.lines))


def test_following_sees_new_lines_in_order(make: Callable[[], LogStore], source: Source) -> None:
    """A standby's side: lines committed while it follows arrive, in order, none twice."""
    active, standby = make(), make()
    active.init()
    term = _taken(active)
    writer = active.writer(term)
    following = _following(standby)
    problems: list[str] = []

    async def follow(seen: list[StoredLine]) -> None:
        known = -1
        async with following.news(problems.append) as news:
            while known < source.lines[-1].seq:
                got = await following.lines_after(known, 3)
                seen += got
                if got:
                    known = got[-1].seq
                else:
                    await news(0.2)

    async def main() -> list[StoredLine]:
        seen: list[StoredLine] = []
        await following.open()
        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow, seen)
                    before: StoredLine | None = None
                    for lines in source.rounds():
                        await anyio.to_thread.run_sync(
                            writer.commit, lines, before.hash if before else "0" * 64
                        )
                        before = lines[-1]
                        await anyio.sleep(0.01)
            last = source.lines[-1]
            assert await following.head() == (last.seq, last.hash)
        finally:
            await following.aclose()
        return seen

    try:
        assert anyio.run(main) == source.lines
    finally:
        writer.close()
    assert problems == []


def test_the_following_side_keeps_the_same_lease(make: Callable[[], LogStore]) -> None:
    a, b = make(), make()
    a.init()
    link_a, link_b = _following(a), _following(b)

    async def main() -> None:
        await link_a.open()
        await link_b.open()
        try:
            term = await link_a.take_lease("node-a", 30)
            assert term is not None
            assert await link_b.take_lease("node-b", 30) is None
            assert await link_a.renew_lease("node-a", term, 30)
            assert not await link_a.renew_lease("node-a", Term(term.epoch, "forged"), 30)
            assert await link_a.release_lease("node-a", term)
            taken = await link_b.take_lease("node-b", 30)
            assert taken is not None
            assert not await link_a.renew_lease("node-a", term, 30)
            assert await link_b.release_lease("node-b", taken)
        finally:
            await link_a.aclose()
            await link_b.aclose()

    anyio.run(main)
