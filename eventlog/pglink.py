"""A node's asynchronous link to the log in PostgreSQL: the :class:`~eventlog.logstore.Following`
side of :class:`~eventlog.pgstore.PgLogStore`.

The lease's statements and a standby's reads run on the event loop through psycopg's async
pool (autocommit: one round trip per statement), so a renewal that hangs is cancelled cleanly
by its caller's deadline; news of committed rounds and handovers comes by ``LISTEN`` on a
connection of its own. Appends do not use it: the log writer's thread owns its own connection
(:class:`~eventlog.pgstore.PgStore`), as it owns the local files and their fsync.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from eventlog import pgstore
from eventlog.errors import StoreError
from eventlog.logstore import Head, NewsWait, Term
from eventlog.store import StoredLine


@asynccontextmanager
async def pooled(
    pool: AsyncConnectionPool[Any] | None, closed: str
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection from ``pool`` (``closed``: the error while there is none); a database
    error becomes :class:`StoreError`, and a broken connection goes back to the pool, which
    replaces it."""
    if pool is None:
        raise StoreError(closed)
    try:
        async with pool.connection() as conn:
            yield conn
    except PoolTimeout:
        raise StoreError("no connection to PostgreSQL (the pool is still trying)") from None
    except pgstore.DatabaseError as exc:
        raise StoreError(f"PostgreSQL failed: {pgstore.reason(exc)}") from None


class PgLink:
    def __init__(self, settings: pgstore.PgSettings) -> None:
        self.settings = settings
        self._pool: AsyncConnectionPool[Any] | None = None

    async def open(self) -> None:
        """Open the connection pool (it connects in the background and keeps reconnecting
        while the database is away)."""
        kwargs = pgstore.connect_kwargs(self.settings)
        settings = self.settings

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            cur = await conn.execute(pgstore.SHOW_SYNCHRONOUS_COMMIT)
            row = await cur.fetchone()
            pgstore.require_synchronous_commit(row[0] if row else None, settings)

        self._pool = AsyncConnectionPool(
            self.settings.dsn,
            kwargs={**kwargs, "autocommit": True},
            min_size=1,
            max_size=2,
            open=False,
            configure=configure,
            check=AsyncConnectionPool.check_connection,
            name="bide-lease",
            timeout=max(1.0, self.settings.connect_timeout),
            reconnect_timeout=86_400.0,
        )
        await self._pool.open(wait=False)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        return pooled(self._pool, "the lease's connection pool is not open")

    async def _row(self, statement: str, params: tuple[object, ...]) -> tuple[Any, ...] | None:
        async with self._connection() as conn:
            cur = await conn.execute(statement, params)
            return await cur.fetchone()

    # -- records --
    async def head(self) -> Head | None:
        row = await self._row(pgstore.STORED_HEAD, ())
        return None if row is None else (int(row[0]), str(row[1]))

    async def lines_after(self, seq: int, limit: int) -> list[StoredLine]:
        async with self._connection() as conn:
            cur = await conn.execute(pgstore.LINES_AFTER, (seq, limit))
            return pgstore.stored_lines(await cur.fetchall())

    # -- the lease (the database's checked functions) --
    async def take_lease(self, holder: str, seconds: float) -> Term | None:
        row = await self._row(pgstore.TAKE_LEASE, (holder, seconds))
        return None if row is None else Term(int(row[0]), str(row[1]))

    async def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        row = await self._row(pgstore.RENEW_LEASE, (seconds, holder, term.epoch, term.secret))
        return row is not None

    async def release_lease(self, holder: str, term: Term) -> bool:
        row = await self._row(pgstore.RELEASE_LEASE, (holder, term.epoch, term.secret))
        return row is not None

    # -- news --
    @asynccontextmanager
    async def news(self, on_unavailable: Callable[[str], None]) -> AsyncIterator[NewsWait]:
        """A wait that ends when a round is committed or the lease is handed over (``LISTEN``
        on a connection of its own), or after the given seconds. While that connection
        cannot be had (the database away) the wait is the plain poll, each wait tries to
        listen again, and ``on_unavailable`` hears why once per outage."""
        conn: psycopg.AsyncConnection[Any] | None = None
        warned = False

        async def listen() -> psycopg.AsyncConnection[Any] | None:
            nonlocal warned
            got: psycopg.AsyncConnection[Any] | None = None
            try:
                got = await psycopg.AsyncConnection.connect(
                    self.settings.dsn, autocommit=True, **pgstore.connect_kwargs(self.settings)
                )
                await got.execute(f"LISTEN {pgstore.NOTIFY_CHANNEL}")
            except (pgstore.DatabaseError, StoreError) as exc:
                if not warned:
                    on_unavailable(pgstore.reason(exc))
                warned = True
                if got is not None:
                    await got.close()
                return None
            warned = False
            return got

        async def wait(seconds: float) -> None:
            nonlocal conn
            if conn is None or conn.closed:
                conn = await listen()
            if conn is None:
                await anyio.sleep(seconds)
                return
            try:
                async for _ in conn.notifies(timeout=seconds, stop_after=1):
                    pass
            except pgstore.DatabaseError:
                await conn.close()
                conn = None

        conn = await listen()  # before the first follow's result is acted on
        try:
            yield wait
        finally:
            if conn is not None:
                with anyio.CancelScope(shield=True):
                    await conn.close()
