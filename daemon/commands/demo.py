"""``bide demo``: every scenario against the built-in provider simulator."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run every polling scenario against the built-in simulator",
        description="Run every polling scenario against the built-in provider simulator "
        "on 127.0.0.1 and print the outcome table, each story, and the verify result.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(
        "bide demo: not built yet — the simulator and the daemon land with issues 4 and 5.\n"
        "What works today: `bide keygen DIR` and `bide verify LOGDIR --verify-key verify.pub`.",
        file=sys.stderr,
    )
    return 0
