"""``bide wait``: block until an operation ends, bounded by its own timeout."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any
from urllib.parse import quote

import anyio
import watchfiles

from daemon.api.client import ApiCallError, ApiClient, DaemonUnavailable
from daemon.commands.apicall import view_line
from daemon.commands.status import op_line, op_summary
from daemon.config import Config, add_config_flag, load_config
from daemon.errors import DaemonError, UsageError
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
  2    usage error (unknown operation, or not yours; bad flag)
  69   the daemon is not running (nothing answers on its socket), or went away and
       did not come back within --timeout
  1    internal error

With the daemon running, the wait is the daemon's: bounded waits of at most 60 s each on
its local API, woken the moment the deciding event is durable; no provider request and no
log read. If the daemon restarts meanwhile, the wait goes on with the new one (systemd's
socket holds the callers). --offline follows the log file itself, with its data key.

examples:
  bide wait nightly-export --timeout 5m
  bide wait nightly-export --timeout 30s --json | jq .phase
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "wait",
        help="block until an operation succeeds, escalates or closes",
        description="Wait for an operation to end: the daemon answers the "
        "moment it succeeds, escalates or closes. Never polls the provider. "
        "Bounded by --timeout.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", metavar="OP")
    p.add_argument("--timeout", default="5m", help="how long to wait (default 5m)")
    p.add_argument("--json", action="store_true", help="print the final state as JSON")
    p.add_argument(
        "--offline",
        action="store_true",
        help="follow the log directly with its data key (operators, forensics)",
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def _exit_for(op: Operation) -> int | None:
    return {"succeeded": EXIT_SUCCEEDED, "escalated": EXIT_ESCALATED, "closed": EXIT_CLOSED}.get(
        op.phase
    )


EXIT_UNAVAILABLE = 69
_PHASE_EXIT = {"succeeded": EXIT_SUCCEEDED, "escalated": EXIT_ESCALATED, "closed": EXIT_CLOSED}


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    timeout = parse_duration(args.timeout, "--timeout", allow_zero=True)
    if args.offline:
        return run_offline(cfg, args, timeout)
    return run_api(cfg, args.operation, timeout, args.json)


def run_api(cfg: Config, op_id: str, timeout: float, as_json: bool) -> int:
    """Bounded server-side waits until the end or ``timeout``; a daemon that goes away
    (a restart) is waited for, within the same timeout."""
    end = time.monotonic() + timeout
    path = f"/v1/operations/{quote(op_id, safe='')}"
    view: dict[str, Any] | None = None
    pause = 0.1
    client = ApiClient(cfg.socket_path, daemon_user=cfg.api.daemon_user)
    if not client.answers():  # not running (or another config's socket): say so at once
        client.close()
        raise DaemonUnavailable(
            f"the daemon is not running: nothing answers on {cfg.socket_path}; start it, or "
            f"read the log directly with bide wait {op_id} --offline"
        )
    try:
        while True:
            left = end - time.monotonic()
            try:
                view = client.call(
                    "GET",
                    path,
                    params={"wait": f"{max(0.0, min(60.0, left)):.3f}"},
                    timeout=min(60.0, max(0.0, left)) + 30.0,
                )
                pause = 0.1
            except ApiCallError as exc:
                if exc.status == 404:
                    raise UsageError(f"no operation {op_id!r} (or not yours)") from None
                if exc.status < 500:
                    raise
                if time.monotonic() + pause >= end:
                    raise
                time.sleep(pause)  # the daemon is not ready (503) or failed (500): again
                pause = min(pause * 2, 2.0)
                continue
            except DaemonError:
                if time.monotonic() + pause >= end:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
                continue
            if view is not None and (view.get("done") or end - time.monotonic() <= 0):
                break
    finally:
        client.close()
    if view is None:  # the daemon went away and did not come back within the timeout
        raise DaemonUnavailable(
            f"the daemon stopped answering on {cfg.socket_path} and did "
            f"not come back within {timeout:g}s"
        )
    status = _PHASE_EXIT.get(str(view.get("phase")))
    print(json.dumps(view) if as_json else view_line(view))
    return EXIT_TIMEOUT if status is None or not view.get("done") else status


def run_offline(cfg: Config, args: argparse.Namespace, timeout: float) -> int:
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
            async for _ in watchfiles.awatch(
                cfg.log_dir,
                stop_event=stop,
                debounce=0,
                step=5,
                rust_timeout=1000,
                yield_on_timeout=True,
            ):
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
