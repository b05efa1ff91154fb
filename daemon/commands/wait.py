"""``bide wait``: block until an operation ends, bounded by its own timeout."""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import watchfiles

from daemon.commands.status import op_line, op_summary
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import parse_duration
from daemon.readers import open_keyring
from eventlog.envelope import EventRecord
from eventlog.reader import LogReader
from replay.events import (
    ActionDecided,
    ActionFailed,
    ActionIntended,
    ActionSucceeded,
    decode_log_event,
)
from replay.state import Operation, evolve

ACTION_EVENTS = (ActionIntended, ActionSucceeded, ActionFailed, ActionDecided)
EXIT_SUCCEEDED = 0
EXIT_ESCALATED = 3
EXIT_CLOSED = 4
EXIT_TIMEOUT = 124

EPILOG = """\
exit status:
  0    succeeded (the result fields validated)
  3    escalated: stopped and waiting for a human decision (see `bide escalations`)
  4    closed without success (e.g. abandoned after a decision)
  124  still running when --timeout elapsed (as GNU timeout)
  2    usage error (unknown operation, bad flag)
  1    internal error

examples:
  bide wait nightly-export --timeout 5m
  bide wait nightly-export --timeout 30s --json | jq .phase
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("wait", help="block until an operation succeeds, escalates or closes",
                       description="Wait for an operation to end, waking on log changes "
                       "(inotify), never polling the provider or the file. Bounded by --timeout.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("operation", metavar="OP")
    p.add_argument("--timeout", default="5m", help="how long to wait (default 5m)")
    p.add_argument("--json", action="store_true", help="print the final state as JSON")
    add_config_flag(p)
    p.set_defaults(func=run)


def _exit_for(op: Operation) -> int | None:
    return {"succeeded": EXIT_SUCCEEDED, "escalated": EXIT_ESCALATED,
            "closed": EXIT_CLOSED}.get(op.phase)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    timeout = parse_duration(args.timeout, "--timeout", allow_zero=True)
    reader = LogReader(cfg.log_dir, open_keyring(cfg))
    op: Operation | None = None

    def feed() -> Operation | None:
        nonlocal op
        for stored in reader.poll():
            if isinstance(stored.record, EventRecord):
                ev = decode_log_event(reader.decrypt(stored))
                if ev.operation_id == args.operation and not isinstance(ev, ACTION_EVENTS):
                    op = evolve(op, ev)
        return op

    feed()
    if op is None:
        raise UsageError(f"no operation {args.operation!r} in the log")

    async def follow() -> None:
        stop = anyio.Event()
        with anyio.move_on_after(timeout):
            if op is not None and _exit_for(op) is not None:
                return
            async for _ in watchfiles.awatch(cfg.log_dir, stop_event=stop, debounce=0, step=5,
                                             rust_timeout=1000, yield_on_timeout=True):
                current = feed()
                if current is not None and _exit_for(current) is not None:
                    return

    anyio.run(follow)
    assert op is not None
    status = _exit_for(op)
    if args.json:
        print(json.dumps(op_summary(op)))
    else:
        print(op_line(op))
    return EXIT_TIMEOUT if status is None else status
