"""What the database says about a log's shards and nodes, for ``bide log shards`` and
``bide status --node``: read-only, on one connection, every time by the database's clock.

Each shard: its lease (holder, epoch, seconds left), its head and its record count (the head
plus one: records are numbered from 0 and ``bide_append`` admits no gap). Each node: its
heartbeat row in ``bide_nodes`` (live while ``expires_at`` is ahead), whether it is joining
(its copies still catching up) or leaving,
how many shards it says it holds; and which shards a live lease names it the holder of.

A lease's holder is ``NODE/PID/TOKEN`` (:class:`daemon.lease.Lease`: unique per process); a
node is the part before the first ``/``, the name ``bide_nodes`` and the config use.
"""

from __future__ import annotations

import dataclasses
import math
import re
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout


def node_of(holder: str) -> str:
    """The node a lease holder (``NODE/PID/TOKEN``) runs on."""
    return holder.split("/", 1)[0]


def node_name(configured: str) -> str:
    """The name a node goes by: the config's ``[postgres] node`` or the host name, cut to
    plain characters as :class:`daemon.lease.Lease` cuts it for the holder it records."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", configured or socket.gethostname())[:64]


@dataclasses.dataclass(frozen=True)
class ShardRow:
    shard: int
    schema: str
    holder: str
    epoch: int
    remaining: float  # seconds the lease has left (negative or -inf: free)
    head_seq: int  # -1: no record

    @property
    def held(self) -> bool:
        return self.remaining > 0 and bool(self.holder)

    @property
    def node(self) -> str | None:
        return node_of(self.holder) if self.held else None

    @property
    def records(self) -> int:
        return self.head_seq + 1

    def to_json(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "schema": self.schema,
            "held": self.held,
            "holder": self.holder if self.held else None,
            "node": self.node,
            "last_holder": self.holder or None,
            "epoch": self.epoch,
            "lease_remaining_seconds": round(max(self.remaining, 0.0), 3),
            "head_seq": self.head_seq,
            "records": self.records,
        }


@dataclasses.dataclass(frozen=True)
class NodeRow:
    node: str
    started_at: str  # RFC 3339, UTC
    remaining: float  # seconds until the heartbeat expires (negative: expired)
    leaving: bool
    held_reported: int  # what the node last wrote in bide_nodes.held
    joining: bool = False  # its copies still catching up: not counted in the fair share yet

    @property
    def live(self) -> bool:
        return self.remaining > 0

    def to_json(self, holding: list[int]) -> dict[str, object]:
        return {
            "node": self.node,
            "live": self.live,
            "heartbeat_remaining_seconds": round(self.remaining, 3),
            "joining": self.joining,
            "leaving": self.leaving,
            "held_reported": self.held_reported,
            "holding": holding,
            "started_at": self.started_at,
        }


@dataclasses.dataclass(frozen=True)
class ShardView:
    layout: Layout
    shards: list[ShardRow]
    nodes: list[NodeRow]

    def holding(self, node: str) -> list[int]:
        """The shards a live lease names ``node`` the holder of."""
        return [s.shard for s in self.shards if s.node == node]


def read_view(settings: PgSettings) -> ShardView:
    """Every shard's lease and head and every node's heartbeat, in one read-only
    transaction (so one ``now()`` for all of them)."""
    from eventlog import pgstore
    from eventlog.errors import StoreError
    from eventlog.shards import read_layout

    conn = pgstore.connect(settings, read_only=True)
    try:
        layout = read_layout(conn)
        rows = [_shard_row(conn, layout, k) for k in range(layout.count)]
        nodes = _node_rows(conn) if layout.sharded else []
        conn.rollback()
    except pgstore.DatabaseError as exc:
        raise StoreError(f"reading the shards failed: {pgstore.reason(exc)}") from None
    finally:
        conn.close()
    return ShardView(layout, rows, nodes)


def _shard_row(conn: psycopg.Connection[Any], layout: Layout, shard: int) -> ShardRow:
    from psycopg import sql

    from eventlog.errors import SchemaError

    schema = sql.Identifier(layout.schema(shard))
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL(
                "SELECT holder, epoch, CASE WHEN isfinite(expires_at) THEN "
                "EXTRACT(EPOCH FROM (expires_at - now()))::float8 END "
                "FROM {}.bide_lease WHERE id = 1"
            ).format(schema)
        )
        lease = cur.fetchone()
        cur.execute(sql.SQL("SELECT max(seq) FROM {}.bide_records").format(schema))
        head = cur.fetchone()
    if lease is None:
        raise SchemaError(
            f"shard {shard} ({layout.schema(shard)}) has no lease row; run `bide log init`"
        )
    remaining = float(lease[2]) if lease[2] is not None else -math.inf
    head_seq = int(head[0]) if head is not None and head[0] is not None else -1
    return ShardRow(shard, layout.schema(shard), str(lease[0]), int(lease[1]), remaining, head_seq)


def _node_rows(conn: psycopg.Connection[Any]) -> list[NodeRow]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT node, to_char(started_at AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\'), '
            "EXTRACT(EPOCH FROM (expires_at - now()))::float8, leaving, held, joining "
            "FROM bide_nodes ORDER BY node"
        )
        found = cur.fetchall()
    return [
        NodeRow(str(n), str(s), float(r), bool(lv), int(h), bool(j)) for n, s, r, lv, h, j in found
    ]
