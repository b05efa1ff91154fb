"""``bide log head``: print the current head, for operators who anchor it elsewhere."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from eventlog.reader import LogReader


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "log",
        help="log maintenance: `bide log head`",
        description="Inspect the event log without keys.",
        epilog="examples:\n  bide log head --config /etc/bide/bide.toml\n"
        "  bide log head /var/lib/bide/log >> /mnt/worm/bide-anchors   # then verify --anchor",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub2 = p.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    head = sub2.add_parser("head", help="print SEQ:HASH of the last complete record")
    head.add_argument("log_dir", nargs="?", metavar="LOGDIR")
    head.add_argument("--json", action="store_true")
    add_config_flag(head)
    head.set_defaults(func=run_head)


def run_head(args: argparse.Namespace) -> int:
    log_dir = Path(args.log_dir) if args.log_dir else load_config(args.config).log_dir
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    reader = LogReader(log_dir)
    records = reader.poll()
    if not records:
        raise UsageError(f"log {log_dir} has no records")
    head = records[-1]
    if args.json:
        print(json.dumps({"seq": head.seq, "hash": head.hash}))
    else:
        print(f"{head.seq}:{head.hash}")
    return 0
