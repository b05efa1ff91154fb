"""The log in segment files as an :class:`~eventlog.logstore.LogStore` (the embedded default).

Nothing here changes what is on disk: the segment files, the ``LOCK`` file and the snapshot
file are the ones :class:`~eventlog.writer.LogWriter` and the daemon have always written.
The lease of a file log is the writer lock on its directory (:mod:`eventlog.lock`, ``flock``,
dropped by the kernel when its holder dies): one holder on one host, never expiring while
held, under one constant epoch (:data:`FILE_EPOCH`: files have no takeovers, as the records
a database imports are epoch 0). The daemon's :class:`~eventlog.writer.LogWriter` takes that
same lock itself and is this store's writer in a running daemon; :class:`FileWriter` is the
same append for tools and the contract tests, with the checks the database makes (a term no
longer held is fenced; a round must continue the chain).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec

from eventlog.envelope import ZERO_HASH
from eventlog.errors import (
    DamagedLogError,
    DivergedError,
    FencedError,
    LockedError,
    SchemaError,
    StoreError,
)
from eventlog.lock import WriterLock, holder_pid, writer_alive
from eventlog.logstore import Head, LeaseState, NewsWait, Term
from eventlog.segments import list_segments
from eventlog.snapshot import snapshot_seq, write_atomically
from eventlog.store import StoredLine, append_segments, cut_after, file_lines, write_segments

#: The one lease epoch of a file log.
FILE_EPOCH = 0
#: The layout of a file log (segment files ``seg-NNNNNNNN.jsonl``, one record a line), which
#: has not changed since the first release.
FILE_LAYOUT_VERSION = 1


class _LineHead(msgspec.Struct):
    """What every record line begins with (the rest is the record's own business)."""

    kind: str
    seq: int
    prev: str


_HEAD_DECODER = msgspec.json.Decoder(_LineHead)


class FileStore:
    """One log directory. ``snapshot_path`` is where the state snapshot lives (the daemon's
    ``state_dir/state.snapshot``)."""

    kind = "files"

    def __init__(self, log_dir: Path, *, snapshot_path: Path) -> None:
        self.log_dir = log_dir
        self.snapshot_path = snapshot_path
        self._lock: WriterLock | None = None
        self._term: Term | None = None
        self._holder = ""

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
        self._lock, self._term = None, None

    # -- schema --
    def version(self) -> int | None:
        return FILE_LAYOUT_VERSION if self.log_dir.is_dir() else None

    def init(
        self, *, reader: str | None = None, writer: str | None = None
    ) -> tuple[int | None, int]:
        """Create the log directory (0700); files have no roles to grant."""
        before = self.version()
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return before, FILE_LAYOUT_VERSION

    def unfenced(self, role: str) -> str | None:
        return None

    def require(self) -> None:
        if not self.log_dir.is_dir():
            raise SchemaError(
                f"log directory {self.log_dir} does not exist; create it (bide "
                f"run does, as the daemon's user) or name another"
            )

    # -- records --
    def iter_lines(self, after: int = -1) -> Iterator[StoredLine]:
        return (line for line in file_lines(self.log_dir) if line.seq > after)

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        out: list[StoredLine] = []
        for line in self.iter_lines(seq):
            if len(out) >= limit:
                break
            out.append(line)
        return out

    def head(self) -> Head | None:
        last = self.last_line()
        return None if last is None else (last.seq, last.hash)

    def last_line(self) -> StoredLine | None:
        last: StoredLine | None = None
        for last in file_lines(self.log_dir):  # noqa: B007 - the last one is wanted
            pass
        return last

    def epoch_changes(self) -> list[tuple[int, int]]:
        return [(0, FILE_EPOCH)] if self.head() is not None else []

    # -- fencing: the directory lock --
    def lease(self) -> LeaseState:
        if self._lock is not None:
            return LeaseState(self._holder, FILE_EPOCH, float("inf"))
        alive = writer_alive(self.log_dir)
        if alive is None:
            raise StoreError(
                f"cannot tell whether a writer holds {self.log_dir}: its lock file "
                f"is not readable by this user; ask as the daemon's user"
            )
        if alive:
            pid = holder_pid(self.log_dir)
            return LeaseState(f"pid {pid}" if pid else "another process", FILE_EPOCH, float("inf"))
        return LeaseState("", FILE_EPOCH, float("-inf"))

    def take_lease(self, holder: str, seconds: float) -> Term | None:
        """Take the directory lock (``seconds`` does not apply: a lock lasts until it is let
        go, or its process dies); None while any holder, this store included, has it."""
        if self._lock is not None:
            return None
        self.require()
        lock = WriterLock(self.log_dir)
        try:
            lock.acquire()
        except LockedError:
            return None
        self._lock, self._holder = lock, holder
        self._term = Term(FILE_EPOCH, secrets.token_hex(16))
        return self._term

    def holds(self, term: Term) -> bool:
        """Whether ``term`` is the one this store holds the lock under right now."""
        return (
            self._lock is not None
            and self._term is not None
            and secrets.compare_digest(self._term.secret, term.secret)
        )

    def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        return self.holds(term) and holder == self._holder

    def release_lease(self, holder: str, term: Term) -> bool:
        if not self.renew_lease(holder, term, 0):
            return False
        self.close()
        return True

    def writer(self, term: Term) -> FileWriter:
        return FileWriter(self, term)

    # -- snapshots --
    def load_snapshot(self) -> bytes | None:
        try:
            return self.snapshot_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(
                f"cannot read the state snapshot {self.snapshot_path}: {exc.strerror}"
            ) from None

    # -- export and import --
    def export(self, out_dir: Path) -> int:
        return write_segments(file_lines(self.log_dir), out_dir)

    def import_lines(self, lines: Iterator[StoredLine]) -> int:
        """Write ``lines`` as this log's segment files; only into an empty log that no
        writer holds."""
        self.init()
        if self.head() is not None:
            raise StoreError(
                f"log {self.log_dir} already holds records; import goes only into an empty one"
            )
        if writer_alive(self.log_dir):
            raise StoreError(f"a writer holds log {self.log_dir}; stop it before importing")
        return write_segments(lines, self.log_dir)

    def following(self) -> FileFollowing:
        return FileFollowing(self)


class FileWriter:
    """The :class:`~eventlog.store.LineStore` of a term of a file log: appends rounds to the
    segment files while the store still holds the term's lock, each continuing the chain."""

    def __init__(self, store: FileStore, term: Term) -> None:
        self.store = store
        self.term = term
        self._last: StoredLine | None = None
        self._read = False

    def _fenced(self, what: str) -> FencedError:
        return FencedError(
            f"{what} refused: this writer's lock on {self.store.log_dir} was let "
            f"go (another writer may hold the log now)"
        )

    def commit(self, lines: Sequence[StoredLine], prev_hash: str) -> None:
        if not lines:
            return
        if not self.store.holds(self.term):
            raise self._fenced("append")
        if not self._read:
            self._last, self._read = self.store.last_line(), True
        last = self._last
        for line in lines:
            why = _breaks_chain(line, last)
            if why is not None:
                raise DivergedError(
                    f"append refused: {why}; this copy of the log is not the store's (re-sync it)"
                )
            last = line
        try:
            append_segments(lines, self.store.log_dir)
        except (OSError, DamagedLogError) as exc:
            # An undo that fails too: the next round reads the files again, and refuses
            # what does not follow.
            with contextlib.suppress(OSError):
                self._undo()
            self._read = False
            raise StoreError(
                f"appending to {self.store.log_dir} failed (nothing of the round kept): {exc}"
            ) from None
        self._last = last

    def _undo(self) -> None:
        """Take back what a failed round wrote: cut the files back to the head before it
        (what was cut is kept in ``quarantine/``, as the writer keeps a torn tail)."""
        if self._last is not None:
            cut_after(self.store.log_dir, self._last.seq, self._last.hash)
            return
        for _, path in list_segments(self.store.log_dir):
            path.unlink()

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        return self.store.lines_after(seq, limit)

    def head(self) -> Head | None:
        return self.store.head()

    def save_snapshot(self, seq: int, record_hash: str, data: bytes) -> bool:
        """Kept only while the term is held, at a record the log holds, over an older
        snapshot only."""
        if not self.store.holds(self.term):
            return False
        at = self.store.lines_after(seq - 1, 1)
        if not at or at[0].seq != seq or at[0].hash != record_hash:
            return False
        old = self.store.load_snapshot()
        old_seq = None if old is None else snapshot_seq(old)
        if old_seq is not None and old_seq >= seq:
            return False
        try:
            write_atomically(self.store.snapshot_path, data)
        except OSError as exc:
            raise StoreError(
                f"cannot write the state snapshot {self.store.snapshot_path}: {exc.strerror}"
            ) from None
        return True

    def load_snapshot(self) -> bytes | None:
        return self.store.load_snapshot()

    def close(self) -> None:
        """Nothing held open (the lock is the store's)."""


def _breaks_chain(line: StoredLine, last: StoredLine | None) -> str | None:
    """Why ``line`` cannot follow ``last`` (None: the log is empty), or None when it can:
    the database's checks (``bide_append``), made on the line's own head."""
    want = 0 if last is None else last.seq + 1
    try:
        got = _HEAD_DECODER.decode(line.data)
    except msgspec.DecodeError:
        return f"record {want} is not a bide record"
    if line.seq != want or got.seq != want:
        return f"the round's record {line.seq} is not record {want} (one past the head)"
    if got.prev != (ZERO_HASH if last is None else last.hash):
        return f"record {want} does not link to record {want - 1} (its prev is not that hash)"
    end_segment, end = (0, 0) if last is None else (last.segment, last.offset + len(last.data) + 1)
    if not (
        (line.segment == end_segment and line.offset == end)
        or (line.segment == end_segment + 1 and line.offset == 0)
    ):
        return (
            f"record {want} is at segment {line.segment} offset {line.offset}, not where "
            f"the record before it ends"
        )
    return None


class FileFollowing:
    """The :class:`~eventlog.logstore.Following` side of a file log: reads run in a worker
    thread; files announce nothing, so the wait for news is a poll of the given seconds."""

    def __init__(self, store: FileStore) -> None:
        self.store = store

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def head(self) -> Head | None:
        return await anyio.to_thread.run_sync(self.store.head)

    async def lines_after(self, seq: int, limit: int) -> list[StoredLine]:
        return await anyio.to_thread.run_sync(self.store.lines_after, seq, limit)

    async def take_lease(self, holder: str, seconds: float) -> Term | None:
        return self.store.take_lease(holder, seconds)

    async def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        return self.store.renew_lease(holder, term, seconds)

    async def release_lease(self, holder: str, term: Term) -> bool:
        return self.store.release_lease(holder, term)

    @asynccontextmanager
    async def news(self, on_unavailable: Callable[[str], None]) -> AsyncIterator[NewsWait]:
        yield anyio.sleep
