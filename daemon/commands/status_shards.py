"""``bide status --node`` on a sharded log: this node's heartbeat and its shards, held or
followed, as the database says now (:mod:`daemon.shardview`)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from daemon.config import Config
from daemon.shardview import ShardRow, node_name, read_view

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings


def run_sharded_node(cfg: Config, settings: PgSettings, args: argparse.Namespace) -> int:
    name = node_name(cfg.postgres.node if cfg.postgres is not None else "")
    view = read_view(settings)
    row = next((n for n in view.nodes if n.node == name), None)
    held = view.holding(name)
    following = [s.shard for s in view.shards if s.shard not in held]
    if args.json:
        print(
            json.dumps(
                {
                    "log_store": "postgresql",
                    "sharded": True,
                    "schema": view.layout.base,
                    "count": view.layout.count,
                    "node": name,
                    "registered": row is not None,
                    "live": row is not None and row.live,
                    "joining": row is not None and row.joining,
                    "leaving": row is not None and row.leaving,
                    "heartbeat_remaining_seconds": round(row.remaining, 3) if row else None,
                    "held": held,
                    "following": following,
                    "shards": [s.to_json() for s in view.shards],
                }
            )
        )
        return 0
    if row is None:
        beat = "not in bide_nodes (not running, or not started yet)"
    elif row.live:
        state = ", leaving" if row.leaving else ""
        state = ", joining (copying the shards)" if row.joining else state
        beat = f"live (heartbeat {row.remaining:.1f}s left){state}"
    else:
        beat = f"heartbeat expired {-row.remaining:.1f}s ago"
    shown = ", ".join(str(k) for k in held) if held else "none"
    print(
        f"node {name}: {beat}; holds {len(held)} of {view.layout.count} shards ({shown}), "
        f"follows {len(following)}"
    )
    for s in view.shards:
        print(shard_line(s, s.shard in held))
    return 0


def shard_line(s: ShardRow, mine: bool) -> str:
    head = f"head {s.head_seq}"
    if mine:
        return (
            f"shard {s.shard:03d}: held by this node ({s.holder}), epoch {s.epoch}, "
            f"lease {s.remaining:.1f}s left, {head}"
        )
    if s.held:
        return (
            f"shard {s.shard:03d}: following; held by {s.node} (epoch {s.epoch}, lease "
            f"{s.remaining:.1f}s left), {head}"
        )
    return (
        f"shard {s.shard:03d}: following; no node holds it (epoch {s.epoch}; the lease is "
        f"free), {head}"
    )
