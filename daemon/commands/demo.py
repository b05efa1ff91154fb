"""``bide demo``: every scenario against the built-in provider simulator."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from daemon.demo import run_demo


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run every polling scenario against the built-in simulator",
        description="Start the provider simulator on 127.0.0.1, a daemon on a fresh log with "
        "fresh keys, and one operation per scenario (success, Retry-After, 429 storm, unknown "
        "state, 401, success without result, eventual-consistency 404, deadline, budget, "
        "hints). Prints the outcome table, each story, the verify summary and replay --check. "
        "Exit 0 only if every scenario ended as expected and both checks pass.",
        epilog="examples:\n  bide demo\n  bide demo --keep /tmp/bide-demo   # then:\n"
        "  bide story deadline --config /tmp/bide-demo/bide.toml\n"
        "  bide verify --config /tmp/bide-demo/bide.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--keep", metavar="DIR", help="keep config, keys, log and outbox in DIR")
    p.add_argument("--no-stories", action="store_true", help="print the table only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_demo(Path(args.keep) if args.keep else None, show_stories=not args.no_stories)
