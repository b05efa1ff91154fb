"""One node's connections to every shard: two small pools and one ``LISTEN``, not a set per
shard.

An unsharded node's lease has a pool and a ``LISTEN`` connection of its own
(:class:`eventlog.pglink.PgLink`). Repeated for 16 shards on three nodes that is about a
hundred connections, PostgreSQL's default ``max_connections``; and as every shard's functions
notify on the same channel, each of those ``LISTEN`` connections would wake its shard for
every round committed on any shard. Here a node has:

    lease pool    the lease statements of every shard (take, renew, release), so a burst of
                  follows never queues a renewal behind it
    follow pool   every shard's reads (its head, the lines a standby copies)
    news          one ``LISTEN``; on each notification (coalesced) one statement reads
                  every shard's head and lease row, and only the shards where either moved
                  are woken

Each statement runs with the connection's ``search_path`` set to its shard's schema first
(in the same round trip: a pipeline), since a pooled connection serves every shard. The
lease functions fix their own ``search_path`` (``eventlog.pgstore``), so the call resolves to
the shard's function and the function reaches the shard's rows only.

Each shard's side is a :class:`ShardLink`, the :class:`~eventlog.logstore.Following` that
:class:`daemon.lease.Lease` takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from daemon import logfmt
from eventlog import pgstore
from eventlog.errors import StoreError
from eventlog.logstore import Head, NewsWait, Term
from eventlog.pglink import pooled
from eventlog.store import StoredLine

if TYPE_CHECKING:
    from eventlog.shards import Layout

#: The least time between two reads of every shard's head: a burst of commits is read once.
NEWS_SPACING = 0.02
_SET_PATH = "SELECT set_config('search_path', %s, false)"


class NodeLinks:
    """The node's pools and news for every shard of ``layout``."""

    def __init__(self, settings: pgstore.PgSettings, layout: Layout, *, poll: float) -> None:
        self.settings = settings
        self.layout = layout
        self.poll = poll
        self._lease: AsyncConnectionPool[Any] | None = None
        self._follow: AsyncConnectionPool[Any] | None = None
        self._events = [anyio.Event() for _ in range(layout.count)]
        self.generation = [0] * layout.count
        self._seen: list[tuple[Any, ...] | None] = [None] * layout.count
        self._scan = self._scan_statement()
        #: shard -> the holder of its unexpired lease, as of the last scan (None before the
        #: first): the node's plan reads it, fresh after every notification.
        self.holders: dict[int, str] | None = None

    def _scan_statement(self) -> bytes:
        parts = [
            sql.SQL(
                "SELECT {k}::int, (SELECT seq FROM {s}.bide_records ORDER BY seq DESC LIMIT 1), "
                "l.epoch, l.holder, l.expires_at > now() FROM {s}.bide_lease l WHERE l.id = 1"
            ).format(k=sql.Literal(k), s=sql.Identifier(self.layout.schema(k)))
            for k in range(self.layout.count)
        ]
        return sql.SQL(" UNION ALL ").join(parts).as_bytes(None)

    def _pool(self, name: str, size: int) -> AsyncConnectionPool[Any]:
        settings = self.settings

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            cur = await conn.execute(pgstore.SHOW_SYNCHRONOUS_COMMIT)
            row = await cur.fetchone()
            pgstore.require_synchronous_commit(row[0] if row else None, settings)

        return AsyncConnectionPool(
            settings.dsn,
            kwargs={**pgstore.connect_kwargs(settings), "autocommit": True},
            min_size=1,
            max_size=size,
            open=False,
            configure=configure,
            check=AsyncConnectionPool.check_connection,
            name=name,
            timeout=max(1.0, settings.connect_timeout),
            reconnect_timeout=86_400.0,
        )

    async def open(self) -> None:
        """Open both pools (they connect in the background and keep reconnecting while the
        database is away)."""
        self._lease = self._pool("bide-shard-leases", 3)
        self._follow = self._pool("bide-shard-follow", 3)
        await self._lease.open(wait=False)
        await self._follow.open(wait=False)

    async def aclose(self) -> None:
        for pool in (self._lease, self._follow):
            if pool is not None:
                await pool.close()
        self._lease = self._follow = None

    def link(self, shard: int) -> ShardLink:
        return ShardLink(self, shard)

    # -- statements on a shard ---------------------------------------------------------------

    def connection(
        self, pool: AsyncConnectionPool[Any] | None
    ) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        return pooled(pool, "the node's connection pools are not open")

    async def rows(
        self, shard: int, statement: str, params: tuple[object, ...], *, lease: bool
    ) -> list[tuple[Any, ...]]:
        """``statement`` on ``shard`` (its schema first on the search path)."""
        path = sql.Identifier(self.layout.schema(shard)).as_string(None)
        async with self.connection(self._lease if lease else self._follow) as conn:
            async with conn.pipeline():
                await conn.execute(_SET_PATH, (path,))
                cur = await conn.execute(statement, params)
            return list(await cur.fetchall())

    # -- news ----------------------------------------------------------------------------

    async def wait(self, shard: int, seen: int, seconds: float) -> int:
        """Until ``shard`` moved after generation ``seen``, or ``seconds``; returns the
        generation now."""
        if self.generation[shard] == seen:
            with anyio.move_on_after(seconds):
                await self._events[shard].wait()
        return self.generation[shard]

    def wake_all(self) -> None:
        """Wake every shard's standby (the node's place in the plan changed)."""
        for k in range(len(self._events)):
            self._wake(k)

    def _wake(self, shard: int) -> None:
        self.generation[shard] += 1
        event, self._events[shard] = self._events[shard], anyio.Event()
        event.set()

    def head_seen(self, shard: int) -> int:
        """``shard``'s head seq in the database as of the last scan (fresh after every
        notification); -1 when empty or not read yet."""
        seen = self._seen[shard]
        return -1 if seen is None or seen[0] is None else int(seen[0])

    async def scan(self) -> None:
        """Read every shard's head and lease row (who holds it, whether it has run out, by
        the database's clock); wake the shards where either moved."""
        async with self.connection(self._follow) as conn:
            cur = await conn.execute(self._scan)
            rows = await cur.fetchall()
        holders: dict[int, str] = {}
        moved: list[int] = []
        for k, seq, epoch, holder, held in rows:
            if held and holder:
                holders[int(k)] = str(holder)
            now = (seq, epoch, holder, held)
            if self._seen[k] != now:
                self._seen[k] = now
                moved.append(int(k))
        self.holders = holders  # before the wakes: a woken standby plans on these
        for k in moved:
            self._wake(k)

    async def news(self) -> None:
        """The node's ``LISTEN``, until cancelled: a scan after each notification (at most
        one per :data:`NEWS_SPACING`) and at least every ``poll``."""
        warned = False
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.settings.dsn, autocommit=True, **pgstore.connect_kwargs(self.settings)
                )
                await conn.execute(f"LISTEN {pgstore.NOTIFY_CHANNEL}")
                warned = False
                while True:
                    try:
                        await self.scan()
                    except StoreError as exc:
                        logfmt.warn("cannot read the shards' heads; retrying", error=exc)
                    async for _ in conn.notifies(timeout=self.poll, stop_after=1):
                        pass
                    await anyio.sleep(NEWS_SPACING)
            except (pgstore.DatabaseError, StoreError) as exc:
                if not warned:
                    logfmt.warn(
                        "cannot listen for new records; the shards follow by polling",
                        error=pgstore.reason(exc),
                    )
                warned = True
                await anyio.sleep(self.poll)
            finally:
                if conn is not None:
                    with anyio.CancelScope(shield=True):
                        await conn.close()


class ShardLink:
    """One shard's :class:`~eventlog.logstore.Following` on the node's links (opened and
    closed by the node, not by the shard's lease)."""

    def __init__(self, links: NodeLinks, shard: int) -> None:
        self.links = links
        self.shard = shard

    async def open(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def _row(
        self, statement: str, params: tuple[object, ...], *, lease: bool
    ) -> tuple[Any, ...] | None:
        rows = await self.links.rows(self.shard, statement, params, lease=lease)
        return rows[0] if rows else None

    async def head(self) -> Head | None:
        row = await self._row(pgstore.STORED_HEAD, (), lease=False)
        return None if row is None else (int(row[0]), str(row[1]))

    async def lines_after(self, seq: int, limit: int) -> list[StoredLine]:
        rows = await self.links.rows(self.shard, pgstore.LINES_AFTER, (seq, limit), lease=False)
        return pgstore.stored_lines(rows)

    async def take_lease(self, holder: str, seconds: float) -> Term | None:
        row = await self._row(pgstore.TAKE_LEASE, (holder, seconds), lease=True)
        return None if row is None else Term(int(row[0]), str(row[1]))

    async def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        params = (seconds, holder, term.epoch, term.secret)
        return await self._row(pgstore.RENEW_LEASE, params, lease=True) is not None

    async def release_lease(self, holder: str, term: Term) -> bool:
        params = (holder, term.epoch, term.secret)
        return await self._row(pgstore.RELEASE_LEASE, params, lease=True) is not None

    @asynccontextmanager
    async def news(self, on_unavailable: Callable[[str], None]) -> AsyncIterator[NewsWait]:
        """A wait that ends when this shard's head or lease row moved (the node's one
        ``LISTEN``: :meth:`NodeLinks.news`), or after the given seconds. The first wait
        returns at once if the shard moved since the context opened."""
        seen = self.links.generation[self.shard]

        async def wait(seconds: float) -> None:
            nonlocal seen
            seen = await self.links.wait(self.shard, seen, seconds)

        yield wait
