"""``bide status``: the derived state of one operation or all of them."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from daemon.config import add_config_flag, load_config
from daemon.outbox import provider_error_text
from daemon.readers import load_log, need_op, open_keyring
from replay.decide import format_time
from replay.state import Operation

EPILOG = """\
examples:
  bide status                      # one line per operation
  bide status nightly-export --json
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show operations' state (read-only)",
                       description="Show the state of one operation, or a line per operation, "
                       "derived by replaying the log. Never writes.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("operation", nargs="?", metavar="OP")
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def op_summary(op: Operation) -> dict[str, object]:
    """The fields a script reads, in stable names (the full record is under ``record``)."""
    return {
        "operation_id": op.operation_id,
        "provider": op.provider,
        "provider_job_id": op.provider_job_id,
        "registered_by": op.registered_by,
        "phase": op.phase,
        "stop_reason": op.stop_reason,
        "provider_error": op.provider_error,
        "provider_error_truncated": op.provider_error_truncated,
        "last_state": op.last_state,
        "status_requests_used": op.status_requests_used,
        "max_status_requests": op.max_status_requests,
        "transport_failures_used": op.transport_failures_used,
        "rate_limited_used": op.rate_limited_used,
        "deadline_at": op.deadline_at,
        "next_poll_at": op.next_poll_at if op.phase == "live" else None,
        "results": op.results,
        "escalation": msgspec.to_builtins(op.escalation) if op.escalation else None,
    }


def op_line(op: Operation) -> str:
    reason = f" {op.stop_reason}" if op.stop_reason else ""
    nxt = f" next {format_time(op.next_poll_at)}" if op.phase == "live" else ""
    return (f"{op.operation_id}  {op.provider}/{op.provider_job_id}  {op.phase}{reason}  "
            f"state={op.last_state or '-'}  requests {op.status_requests_used}/"
            f"{op.max_status_requests}{nxt}")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    log = load_log(cfg.log_dir, open_keyring(cfg))
    if args.operation:
        op = need_op(log, args.operation)
        if args.json:
            print(json.dumps({**op_summary(op), "record": msgspec.to_builtins(op)}))
        else:
            print(op_line(op))
            if op.provider_error is not None:
                print(provider_error_text(op.provider_error, op.provider_error_truncated))
        return 0
    ops = sorted(log.ops.values(), key=lambda o: o.registered_at)
    if args.json:
        print(json.dumps([op_summary(op) for op in ops]))
    else:
        for op in ops:
            print(op_line(op))
        if not ops:
            print("no operations yet")
    return 0
