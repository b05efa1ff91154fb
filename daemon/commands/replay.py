"""``bide replay``: the derived state at a point in time, and ``--check`` of every decision.

The log is the config's (its directory, the node's local copy when the log is in
PostgreSQL); with ``--dsn`` or ``--shard``, or on a sharded node (its copies in
``STATE/shards/``), it is read from the database instead, each shard
exported read-only to a temporary directory and replayed there on its own, with one verdict
per shard (:mod:`daemon.commands.replay_shards`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from daemon.commands.status import op_line, op_summary
from daemon.config import add_config_flag, load_config
from daemon.inputs import until_of
from daemon.pgconfig import add_dsn_flags, add_shard_flag, sharded_node
from daemon.readers import load_log, open_keyring
from replay.check import check

EPILOG = """\
examples:
  bide replay                          # state of every operation now
  bide replay --until 1200             # ... as of log record 1200
  bide replay --until 2026-12-02T18:00:00Z
  bide replay --check                  # re-derive every recorded decision; exit 1 on mismatch
  bide replay --check --dsn postgresql://bide@db/bide   # from the database, every shard
  bide replay --check --shard 7        # one shard of the config's database

sharded logs: each shard is replayed and checked on its own (its events, its operations),
one verdict line per shard and a total; a shard that holds an operation whose id belongs to
another shard is a mismatch too (wrong_shard). --until SEQ is a record number within each
shard. The data keys come from the config (--config) in every case. On a node of a sharded
log (its local copies in STATE/shards/) the config's database is read without --dsn.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="derive state from the log; --check every decision",
        description="Fold the log into operation state, optionally only up to a "
        "record or a time, and with --check re-run every recorded decision with "
        "its recorded time and jitter draw and compare.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--until", metavar="SEQ|TIME", help="stop at this record number or time")
    p.add_argument("--check", action="store_true", help="re-derive every decision")
    p.add_argument("--json", action="store_true")
    add_dsn_flags(
        p, what="read the log from this database (every shard, or --shard) instead of the copy"
    )
    add_shard_flag(p, what="read the log from the database: the shards to replay")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.dsn or args.shard is not None or sharded_node(cfg):
        from daemon.commands.replay_shards import run_database

        return run_database(args, cfg)
    until_seq, until_time = until_of(args)
    log = load_log(cfg.log_dir, open_keyring(cfg), until_seq=until_seq, until_time=until_time)
    mismatches = check([ev for _, ev in log.events]) if args.check else []
    ops = sorted(log.ops.values(), key=lambda o: o.registered_at)
    if args.json:
        print(
            json.dumps(
                {
                    "events": len(log.events),
                    "operations": [op_summary(op) for op in ops],
                    "check": None
                    if not args.check
                    else {"mismatches": [msgspec.to_builtins(m) for m in mismatches]},
                }
            )
        )
    else:
        for op in ops:
            print(op_line(op))
        if args.check:
            for m in mismatches:
                print(
                    f"MISMATCH {m.operation_id} at event {m.index} ({m.observation}): {m.message}"
                )
            print(
                f"check: {len(log.events)} events, {len(ops)} operations, "
                f"{len(mismatches)} mismatch(es)"
            )
    return 1 if mismatches else 0
