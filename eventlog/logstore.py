"""The whole store interface: what any home of a log's records must do, in six parts.

A *store* holds a log's record lines (:class:`~eventlog.store.StoredLine`: the exact bytes and
their place in the segment layout) for whoever reads or continues the chain. Two implement
it: segment files (:class:`eventlog.filestore.FileStore`, the embedded default: one host,
one writer held by the directory lock) and PostgreSQL (:class:`eventlog.pgstore.PgLogStore`,
any number of nodes fenced by a lease epoch). The node's standby loop (``daemon.lease``),
the node (``daemon.node``) and the CLI's log verbs (``bide log``, ``verify --dsn``,
``status --node``) talk to these parts, not to SQL; a daemon on files writes through
:class:`~eventlog.writer.LogWriter`, which holds the same directory lock this interface calls
the file store's lease. A further store is one more class, and the contract tests
(``tests/eventlog/test_store_contract.py``) say whether it is one.

* :class:`Records` -- the head and the lines after a sequence number.
* :class:`Fencing` -- the lease: take, renew, release (each under a :class:`Term`), who holds
  it; and :meth:`Fencing.writer`, the :class:`TermWriter` that commits rounds
  only while its term is in force (a stale term is refused with
  :class:`~eventlog.errors.FencedError`).
* :class:`Snapshots` -- the latest state snapshot's bytes (kept through a writer's term).
* :class:`Schema` -- create or upgrade (idempotent), the version, and the check a user of the
  store runs first.
* :class:`Export` -- the log as segment files, byte for byte, for ``eventlog.verify``; and
  a file log's lines into an empty store.
* :class:`Following` -- the asynchronous side a standby or a reader runs on the event loop:
  the same lease calls, new lines since a position, and a wait for news.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from eventlog.store import LineStore, StoredLine


@dataclass(frozen=True)
class Term:
    """A lease epoch as the holder that took it holds it: the epoch, and the secret the store
    gave with it (a store keeps at most its hash). Every renewal, release, append and
    snapshot of the term brings the secret. The secret is never printed."""

    epoch: int
    secret: str = field(repr=False)


@dataclass(frozen=True)
class LeaseState:
    """The lease as the store holds it: who, under which epoch, and the seconds left by the
    store's own clock (negative or ``-inf``: free; ``inf``: held until its holder lets go)."""

    holder: str
    epoch: int
    remaining: float

    @property
    def held(self) -> bool:
        return self.remaining > 0 and bool(self.holder)


#: ``(seq, hash)`` of a log's last record.
Head = tuple[int, str]


class TermWriter(LineStore, Protocol):
    """What :meth:`Fencing.writer` hands out: a :class:`~eventlog.store.LineStore` bound to
    one term, with the stored head, and a close for what it holds open."""

    def head(self) -> Head | None: ...

    def close(self) -> None: ...


class Records(Protocol):
    def head(self) -> Head | None:
        """The last stored record's seq and hash, None for an empty log."""
        ...

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        """Up to ``limit`` lines with a sequence number above ``seq``, in order."""
        ...

    def iter_lines(self, after: int = -1) -> Iterator[StoredLine]:
        """Every line after ``after``, in order (read in batches)."""
        ...

    def epoch_changes(self) -> list[tuple[int, int]]:
        """(seq, epoch) of every record committed under another lease epoch than the record
        before it (the first record included): where each term's records begin."""
        ...


class Fencing(Protocol):
    def lease(self) -> LeaseState: ...

    def take_lease(self, holder: str, seconds: float) -> Term | None:
        """Take the lease when it is free (expired or handed over), starting a new term;
        None while another holder has it."""
        ...

    def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        """Extend our own term; False when it is no longer ours."""
        ...

    def release_lease(self, holder: str, term: Term) -> bool:
        """Hand the lease over at once; False when it was no longer ours."""
        ...

    def writer(self, term: Term) -> TermWriter:
        """The :class:`~eventlog.store.LineStore` that commits write rounds (and keeps
        snapshots) under ``term``: refused with :class:`~eventlog.errors.FencedError` once
        another term is in force; a round that does not continue the stored chain (seq one
        past the head, ``prev`` its hash, the next place) with
        :class:`~eventlog.errors.DivergedError`."""
        ...


class Snapshots(Protocol):
    def load_snapshot(self) -> bytes | None:
        """The latest snapshot a writer kept, None when there is none."""
        ...


class Schema(Protocol):
    def version(self) -> int | None:
        """The store's format version, None where there is no log store yet."""
        ...

    def init(
        self, *, reader: str | None = None, writer: str | None = None
    ) -> tuple[int | None, int]:
        """Create or upgrade the store to this version; idempotent. ``reader`` and
        ``writer`` name roles to grant where the store has roles. Returns (before, after)."""
        ...

    def require(self) -> None:
        """Refuse (:class:`~eventlog.errors.SchemaError`) a store this version cannot use,
        naming the fix."""
        ...


class Export(Protocol):
    def export(self, out_dir: Path) -> int:
        """Write every record as segment files in ``out_dir`` (new or empty), byte for byte
        as the file store holds them; returns how many."""
        ...

    def import_lines(self, lines: Iterator[StoredLine]) -> int:
        """Copy a log's lines (from record 0, their places kept) into this store, which must
        be empty with no holder; returns how many."""
        ...


class LogStore(Records, Fencing, Snapshots, Schema, Export, Protocol):
    """One log's store, as the CLI and the daemon's start use it (synchronous)."""

    #: ``"files"`` or ``"postgresql"``: for messages and ``bide status --node``.
    kind: str

    def close(self) -> None: ...

    def following(self) -> Following:
        """This store's asynchronous side, for a standby or a reader on the event loop."""
        ...


#: Waits until the store has news (a committed round, a lease handed over) or the given
#: seconds have passed, whichever is first.
NewsWait = Callable[[float], Awaitable[None]]


class Following(Protocol):
    """The asynchronous side of a store, run on the event loop by a standby node: lease calls
    that a deadline can cancel, the lines a follower copies, and a wait for news."""

    async def open(self) -> None: ...

    async def aclose(self) -> None: ...

    async def head(self) -> Head | None: ...

    async def lines_after(self, seq: int, limit: int) -> list[StoredLine]: ...

    async def take_lease(self, holder: str, seconds: float) -> Term | None: ...

    async def renew_lease(self, holder: str, term: Term, seconds: float) -> bool: ...

    async def release_lease(self, holder: str, term: Term) -> bool: ...

    def news(self, on_unavailable: Callable[[str], None]) -> AbstractAsyncContextManager[NewsWait]:
        """A :data:`NewsWait` for as long as the context lasts; while news cannot be had
        the wait is a plain sleep, and ``on_unavailable`` is told why (once per outage)."""
        ...
