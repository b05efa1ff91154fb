"""``bide status``: the derived state of one operation or all of them."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

import msgspec

from daemon.commands.apicall import ApiCallError, require, view_line
from daemon.config import Config, add_config_flag, load_config
from daemon.errors import UsageError
from daemon.outbox import provider_error_text
from daemon.readers import load_ledger, need_op, open_keyring
from replay.decide import format_time
from replay.state import Operation

EPILOG = """\
examples:
  bide status                      # one line per operation of yours
  bide status --all                # everyone's (approvers and operators)
  bide status nightly-export --json
  bide status nightly-export --offline --config /etc/bide/bide.toml   # from the log, with keys
  bide status --node --config /etc/bide/bide.toml   # the log in PostgreSQL: which node is active

With the log sharded, --node shows this node ([postgres] node, else the host name): its
heartbeat in bide_nodes, the shards it holds (a live lease names it) and the ones it follows,
each with its holder, epoch, lease and head; `bide log shards` shows every node.

The running daemon answers from memory through its local API (no key needed; agents see
their own operations). --offline replays the log with its data key instead. On a standby
node (the log in PostgreSQL) the first line says so and names the active node; the
operations shown are the standby's copy of the log.
exit status: 0 shown; 2 no such operation (or not yours), or usage error;
69 the daemon is not running (use --offline)
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="show operations' state (read-only)",
        description="Show the state of one operation, or a line per operation, "
        "as the running daemon knows it (or, --offline, by replaying the log). "
        "Never writes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", nargs="?", metavar="OP")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--all", action="store_true", help="everyone's operations (approvers and operators)"
    )
    p.add_argument("--phase", choices=("live", "succeeded", "escalated", "closed"))
    p.add_argument(
        "--offline",
        action="store_true",
        help="read the log directly with its data key (operators, forensics); "
        "without it the running daemon answers, and no key is needed",
    )
    p.add_argument(
        "--node",
        action="store_true",
        help="the log in PostgreSQL: which node holds the lease, its epoch and the "
        "time left (asked of the database; works on any node); sharded: the shards this "
        "node holds and follows",
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def run_node(cfg: Config, args: argparse.Namespace) -> int:
    from daemon.pgconfig import config_settings

    settings = config_settings(cfg)
    if settings is None:
        info: dict[str, object] = {"log_store": "files"}
        text = f"the log is in files ({cfg.log_dir}): one node, no lease"
    else:
        from eventlog.pgstore import PgLogStore
        from eventlog.shards import layout_of

        if layout_of(settings).sharded:
            from daemon.commands.status_shards import run_sharded_node

            return run_sharded_node(cfg, settings, args)
        with PgLogStore(settings, read_only=True) as store:
            store.require()
            row = store.lease()
            head = store.head()
        held = row.held
        info = {
            "log_store": "postgresql",
            "active_node": row.holder if held else None,
            "epoch": row.epoch,
            "lease_remaining_seconds": round(max(row.remaining, 0), 3),
            "log_head_sequence": head[0] if head else -1,
        }
        text = (
            f"active node {row.holder}, epoch {row.epoch}, lease {row.remaining:.1f}s left"
            if held
            else f"no active node (epoch {row.epoch}; the lease is free)"
        )
        text += f"; log head {head[0] if head else -1}"
    print(json.dumps(info) if args.json else text)
    return 0


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
    return (
        f"{op.operation_id}  {op.provider}/{op.provider_job_id}  {op.phase}{reason}  "
        f"state={op.last_state or '-'}  requests {op.status_requests_used}/"
        f"{op.max_status_requests}{nxt}"
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.node:
        return run_node(cfg, args)
    if args.offline:
        return run_offline(cfg, args)
    with require(cfg, "status") as client:
        if not args.json:
            role = standby_line(client.call("GET", "/v1/health"))
            if role:
                print(role)
        if args.operation:
            try:
                view = client.call("GET", f"/v1/operations/{quote(args.operation, safe='')}")
            except ApiCallError as exc:
                if exc.status == 404:
                    raise UsageError(f"no operation {args.operation!r} (or not yours)") from None
                raise
            if args.json:
                print(json.dumps(view))
            else:
                print(view_line(view))
                if view.get("provider_error") is not None:
                    print(
                        provider_error_text(
                            view["provider_error"], bool(view.get("provider_error_truncated"))
                        )
                    )
            return 0
        views: list[dict[str, Any]] = []
        params = {
            "limit": "500",
            **({"all": "true"} if args.all else {}),
            **({"phase": args.phase} if args.phase else {}),
        }
        while True:
            page = client.call("GET", "/v1/operations", params=params)
            views += page["operations"]
            if not page.get("next_cursor"):
                break
            params["cursor"] = page["next_cursor"]
    if args.json:
        print(json.dumps(views))
    else:
        for view in views:
            print(view_line(view))
        if not views:
            print("no operations yet")
    return 0


def standby_line(health: dict[str, Any]) -> str:
    """On a standby node, the line that says so (its answers come from its copy of the log);
    "" on the active node."""
    if health.get("role") != "standby":
        return ""
    active = health.get("active")
    who = (
        f"active node {active['node']} (epoch {active['epoch']})"
        if active
        else "no node has taken the log yet"
    )
    return (
        f"standby; {who}; answering from this node's copy of the log "
        f"(head {health.get('log_head_sequence', -1)}); writes go to the active node"
    )


def run_offline(cfg: Config, args: argparse.Namespace) -> int:
    ledger = load_ledger(cfg, open_keyring(cfg))  # from the snapshot where it can
    known = ledger.ops
    if args.operation:
        op = need_op(known, args.operation, ledger.tombstones)
        if args.json:
            print(json.dumps({**op_summary(op), "record": msgspec.to_builtins(op)}))
        else:
            print(op_line(op))
            if op.provider_error is not None:
                print(provider_error_text(op.provider_error, op.provider_error_truncated))
        return 0
    ops = sorted(
        (op for op in known.values() if args.phase in (None, op.phase)),
        key=lambda o: o.registered_at,
    )
    if args.json:
        print(json.dumps([op_summary(op) for op in ops]))
    else:
        for op in ops:
            print(op_line(op))
        if not ops:
            print("no operations yet")
    return 0
