"""A node's place among the live nodes: its heartbeat row in ``bide_nodes``, and what the
database says about every node and every shard's lease.

The heartbeat (``expires_at = now() + lease``, on the database's clock, as the leases are)
is written every ``renew_seconds``; a node whose row has expired is not live, and the others
stop counting it in the fair share (:mod:`daemon.shards.assign`). Its shards are still its
own until their leases run out: liveness moves the shares, only the leases move shards.

A node starting marks its row ``joining`` until its copies of the shards have caught up
with the database (or no other node is counted): nobody counts it meanwhile, so no shard is
handed to a node that would first have to copy the shard's log, and the row still claims its
name. A graceful stop marks the row ``leaving`` (the others stop counting it at once and take its
shards as it hands them over), then deletes it once every shard is released. A crashed node's
row is never deleted by that node: every node, at its heartbeat, deletes the rows expired for
more than :data:`PRUNE_AFTER` seconds, at most :data:`PRUNE_BATCH` at a time.

The statements run on one connection of their own, in a worker thread, never on the log
writer's or the lease's: a slow catalog must not delay an append or a renewal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from daemon import logfmt
from eventlog.errors import StoreError

if TYPE_CHECKING:
    import psycopg

    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout


#: How long a node's row is kept once its heartbeat has expired (a node crashed, or renamed).
PRUNE_AFTER = 86_400.0
#: The most rows one heartbeat deletes (the rest go at the next ones).
PRUNE_BATCH = 100


#: The live nodes, each with whether the fair share leaves it out.
_LIVE_NODES = "SELECT node, leaving OR joining FROM bide_nodes WHERE expires_at > now()"


@dataclass(frozen=True)
class View:
    """One read of the catalog and the shards' lease rows, all on the database's clock.

    ``nodes``: live node name -> not counted (leaving, or still joining). ``holders``:
    shard -> the holder string of its unexpired lease (absent: free, or run out)."""

    nodes: dict[str, bool]
    holders: dict[int, str]


class Membership:
    """The node's heartbeat and reads of the catalog, on a connection of its own."""

    def __init__(
        self,
        settings: PgSettings,
        layout: Layout,
        name: str,
        *,
        lease_seconds: float,
        renew_seconds: float,
    ) -> None:
        self.settings = settings
        self.layout = layout
        self.name = name
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.leaving = False
        self.joining = False
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = anyio.Lock()
        self._view_sql = self._leases_statement()

    def _leases_statement(self) -> str:
        from psycopg import sql

        parts = [
            sql.SQL(
                "SELECT {k}::int, holder FROM {schema}.bide_lease WHERE expires_at > now()"
            ).format(k=sql.Literal(k), schema=sql.Identifier(self.layout.schema(k)))
            for k in range(self.layout.count)
        ]
        return sql.SQL(" UNION ALL ").join(parts).as_string(None)

    # -- the connection ---------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        from eventlog import pgstore

        if self._conn is None or self._conn.closed:
            self._conn = pgstore.connect(self.settings, autocommit=True)
        return self._conn

    async def _run(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement (a worker thread), its rows; a failure drops the connection (the
        next call reconnects) and raises :class:`StoreError`."""
        from eventlog import pgstore

        def call() -> list[tuple[Any, ...]]:
            conn = self._connection()
            try:
                cur = conn.execute(statement.encode(), params)
                return list(cur.fetchall()) if cur.description is not None else []
            except pgstore.DatabaseError as exc:
                conn.close()
                raise StoreError(f"the node catalog: {pgstore.reason(exc)}") from None

        async with self._lock:
            return await anyio.to_thread.run_sync(call)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the heartbeat ------------------------------------------------------------------------

    async def beat(self, held: int) -> None:
        """Write this node's row: alive for another lease length, its held count and whether
        it is joining or leaving."""
        await self._run(
            "INSERT INTO bide_nodes (node, expires_at, leaving, held, joining) "
            "VALUES (%s, now() + make_interval(secs => %s), %s, %s, %s) "
            "ON CONFLICT (node) DO UPDATE SET expires_at = EXCLUDED.expires_at, "
            "leaving = EXCLUDED.leaving, held = EXCLUDED.held, joining = EXCLUDED.joining",
            (self.name, self.lease_seconds, self.leaving, held, self.joining),
        )

    async def keep(self, held: Callable[[], int]) -> None:
        """Beat every ``renew_seconds`` until cancelled (``held()``: the shards held now); a
        failed beat is logged and retried at the next tick (the row may expire meanwhile:
        the others then stop counting this node, and its leases still hold its shards)."""
        while True:
            try:
                await self.beat(held())
            except StoreError as exc:
                logfmt.warn("node heartbeat failed; retrying", error=exc)
            else:
                try:
                    pruned = await self.prune()
                except StoreError as exc:
                    logfmt.warn("could not prune the rows of long-gone nodes", error=exc)
                else:
                    if pruned:
                        logfmt.info("rows of long-gone nodes pruned", rows=pruned)
            await anyio.sleep(self.renew_seconds)

    async def prune(self) -> int:
        """Delete up to :data:`PRUNE_BATCH` rows of nodes whose heartbeat expired more than
        :data:`PRUNE_AFTER` seconds ago (by the database's clock), oldest first; how many."""
        rows = await self._run(
            "DELETE FROM bide_nodes WHERE node IN (SELECT node FROM bide_nodes "
            "WHERE expires_at < now() - make_interval(secs => %s) "
            "ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING node",
            (PRUNE_AFTER, PRUNE_BATCH),
        )
        return len(rows)

    async def leave(self) -> None:
        """Delete this node's row (after its shards are released)."""
        try:
            await self._run("DELETE FROM bide_nodes WHERE node = %s", (self.name,))
        except StoreError as exc:
            logfmt.warn("could not remove this node's row; it expires by itself", error=exc)

    # -- what the database says ---------------------------------------------------------------

    async def nodes(self) -> dict[str, bool]:
        """The live nodes (heartbeat not expired, by the database's clock) -> not counted in
        the fair share (leaving, or still joining)."""
        rows = await self._run(_LIVE_NODES)
        return {str(n): bool(leaving) for n, leaving in rows}

    async def view(self) -> View:
        nodes = await self._run(_LIVE_NODES)
        leases = await self._run(self._view_sql)
        return View(
            nodes={str(n): bool(leaving) for n, leaving in nodes},
            holders={int(k): str(h) for k, h in leases if h},
        )
