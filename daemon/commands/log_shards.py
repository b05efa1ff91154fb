"""``bide log shards``: who holds each shard of the log in PostgreSQL, and which nodes are
alive (:mod:`daemon.shardview`). Needs only SELECT: an auditor's role will do."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from daemon.config import add_config_flag
from daemon.pgconfig import add_dsn_flags, settings_for
from daemon.shardview import NodeRow, ShardRow, ShardView, read_view

EPILOG = """\
Each shard: the node whose live lease holds it (the holder is NODE/PID/TOKEN, one per
process), the lease's epoch, the seconds the lease has left by the database's clock, the
sequence number of its last record and how many records it holds. Then each node in
bide_nodes: live while its heartbeat has not expired; its state: joining while its copies of
the shards catch up (nobody hands it a shard yet), counted (in the fair share), or leaving
while it hands its shards over; the count it reports, and the shards a live lease names it
the holder of. A log made before shards is one shard, its own schema, with no nodes table.

examples:
  bide log shards --dsn postgresql://audit@db.example/bide
  bide log shards --config /etc/bide/bide.toml --json | jq '.shards[] | select(.held | not)'
"""


def add_parser(sub2: Any) -> None:
    p = sub2.add_parser(
        "shards",
        help="each shard's holder, epoch, lease and head, and the live nodes (PostgreSQL)",
        description="Show who holds each shard of the log in PostgreSQL and which nodes are "
        "alive, as the database says now. Read-only.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dsn_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    view = read_view(settings_for(args))
    if args.json:
        print(json.dumps(view_json(view)))
    else:
        for line in view_lines(view):
            print(line)
    return 0


def view_json(view: ShardView) -> dict[str, object]:
    return {
        "schema": view.layout.base,
        "count": view.layout.count,
        "sharded": view.layout.sharded,
        "held": sum(1 for s in view.shards if s.held),
        "shards": [s.to_json() for s in view.shards],
        "nodes": [n.to_json(view.holding(n.node)) for n in view.nodes],
    }


def lease_text(row: ShardRow) -> str:
    """Seconds left while held; else free (expired or handed over: the next taker raises
    the epoch, which says whether it was ever taken)."""
    return f"{row.remaining:.1f}s left" if row.held else "free"


def node_text(row: NodeRow) -> str:
    if row.live:
        return f"live ({row.remaining:.1f}s left)"
    return f"expired {-row.remaining:.1f}s ago"


def view_lines(view: ShardView) -> list[str]:
    held = sum(1 for s in view.shards if s.held)
    kind = "sharded" if view.layout.sharded else "unsharded (one shard)"
    lines = [
        f"{view.layout.count} shard(s) in schema {view.layout.base}, {kind}: {held} held, "
        f"{view.layout.count - held} free"
    ]
    rows = [("shard", "holder", "epoch", "lease", "head", "records")]
    for s in view.shards:
        rows.append(
            (
                f"{s.shard:03d}",
                s.holder if s.held else "-",
                str(s.epoch),
                lease_text(s),
                str(s.head_seq),
                str(s.records),
            )
        )
    lines += _table(rows)
    if view.layout.sharded:
        if not view.nodes:
            lines.append("nodes: none has registered (no node runs, or none has started yet)")
        else:
            lines.append("nodes:")
            table = [("node", "heartbeat", "state", "reports", "holding")]
            for n in view.nodes:
                holding = view.holding(n.node)
                table.append(
                    (
                        n.node,
                        node_text(n),
                        "leaving" if n.leaving else "joining" if n.joining else "counted",
                        f"{n.held_reported} held",
                        _shard_list(holding),
                    )
                )
            lines += ["  " + line for line in _table(table)]
        strays = sorted(
            {s.node for s in view.shards if s.node} - {n.node for n in view.nodes if n.live}
        )
        for node in strays:
            lines.append(
                f"note: {node} holds shard(s) {_shard_list(view.holding(node))} under a live "
                f"lease but has no live heartbeat in bide_nodes"
            )
    return lines


def _shard_list(shards: list[int]) -> str:
    return ",".join(str(k) for k in shards) if shards else "-"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
