"""``bide watch``: hand a job that was already submitted to the daemon."""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

import anyio
import msgspec
import watchfiles

from daemon.api.schema import WatchRequest
from daemon.commands.apicall import ApiCallError, ApiClient, connect, print_result
from daemon.config import Config, add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import count_arg, parse_duration, parse_time, seconds_arg
from daemon.spool import Receipt, RegistrationFile, Spool, new_request_id
from eventlog.lock import writer_alive
from replay.observations import Registration

EXIT_QUEUED = 75  # EX_TEMPFAIL: accepted into the spool, the daemon will take it when it runs

EPILOG = """\
examples:
  bide watch --provider acme --job exp_123 --deadline 40m --max-requests 20
  bide watch --provider acme --job exp_123 --operation nightly-export --json

Flags left out default from the provider's profile (deadline, budgets).
With the daemon running, the registration goes through its local API socket and is
answered once it is durable; running it again with the same --operation registers nothing
new (the same receipt). Otherwise it is dropped into the spool for the daemon to take when
it starts.
exit status: 0 registered (prints the operation id); 1 rejected (prints the reason);
2 usage error; 75 queued: the daemon is not running, it registers the job when it starts.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "watch",
        help="register a job already submitted to a provider",
        description="Register a job that was already submitted, so the daemon waits on it under "
        "its provider's contract: through the daemon's local API when it runs (answered once "
        "durable), else through the spool.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--provider", required=True, help="provider name (its profile's file stem)")
    p.add_argument("--job", required=True, help="the provider's job id")
    p.add_argument("--operation", help="bide's operation id (default: op-<random>)")
    p.add_argument("--deadline", help="wall-clock deadline from now, e.g. 40m (default: profile)")
    p.add_argument(
        "--business-deadline",
        metavar="TIME",
        help="when the result stops being useful: ISO-8601 or +DURATION (S28)",
    )
    p.add_argument("--max-requests", type=count_arg(), metavar="N", help="status-request budget")
    p.add_argument(
        "--max-transport-failures", type=count_arg(), metavar="N", help="transport-failure budget"
    )
    p.add_argument(
        "--max-rate-limited", type=count_arg(), metavar="N", help="rate-limited-response budget"
    )
    p.add_argument("--fingerprint", default="", help="fingerprint of the original submit request")
    p.add_argument("--account", default="", help="provider account context (a name, no secret)")
    p.add_argument("--expected-state", help="the success state you expect")
    p.add_argument(
        "--wait-seconds",
        type=seconds_arg(0, 3600, allow_zero=True),
        default=10.0,
        help="how long to wait for the daemon's answer (default 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    now = time.time()
    op_id = args.operation or f"op-{secrets.token_hex(6)}"
    deadline = parse_duration(args.deadline, "--deadline") if args.deadline else None
    business = (
        parse_time(args.business_deadline, "--business-deadline", now)
        if args.business_deadline
        else None
    )
    try:
        request = WatchRequest(
            provider=args.provider,
            job_id=args.job,
            operation_id=op_id,
            deadline_seconds=deadline,
            business_deadline_at=business,
            max_status_requests=args.max_requests,
            max_transport_failures=args.max_transport_failures,
            max_rate_limited=args.max_rate_limited,
            fingerprint=args.fingerprint,
            account=args.account,
            expected_state=args.expected_state,
        )
        msgspec.json.decode(msgspec.json.encode(request), type=WatchRequest)
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid registration: {exc}") from None
    client = connect(cfg)
    if client is not None:
        with client:
            return _through_api(client, request, args.json)
    try:
        reg = Registration(
            operation_id=op_id,
            provider=args.provider,
            provider_job_id=args.job,
            account_context=args.account,
            request_fingerprint=args.fingerprint,
            expected_terminal_state=args.expected_state,
            started_at=None,
            deadline_at=now + deadline if deadline else None,
            business_deadline_at=business,
            max_status_requests=args.max_requests,
            max_transport_failures=args.max_transport_failures,
            max_rate_limited=args.max_rate_limited,
        )
        rid = new_request_id()
        data = msgspec.json.encode(
            msgspec.convert(
                {"version": 1, "request_id": rid, "registration": msgspec.to_builtins(reg)},
                RegistrationFile,
            )
        )
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid registration: {exc}") from None
    spool = Spool(cfg.spool_dir)
    spool.request(spool.incoming, rid, data)
    return report(cfg, spool, rid, op_id, args.wait_seconds, args.json)


def _through_api(client: ApiClient, request: WatchRequest, as_json: bool) -> int:
    try:
        receipt = client.call("POST", "/v1/operations", body=request)
    except ApiCallError as exc:
        if exc.status in (409, 422, 429):
            return print_result(
                as_json,
                {
                    "status": "rejected",
                    "error": exc.error,
                    "reason": exc.detail,
                    "field": exc.field,
                },
                f"rejected: {exc.detail}",
                1,
            )
        raise
    return print_result(as_json, receipt, receipt["operation_id"], 0)


def report(
    cfg: Config,
    spool: Spool,
    rid: str,
    op_id: str,
    wait_seconds: float,
    as_json: bool,
    *,
    decision: bool = False,
) -> int:
    """Wait (bounded) for the receipt and print it; shared with ``bide decide``."""
    sharded = (cfg.state_dir / "shards").is_dir()
    alive = None if sharded else writer_alive(cfg.log_dir)  # a shard's log is under shards/
    if alive is False:
        return print_result(
            as_json,
            {"status": "queued", "operation_id": op_id, "request_id": rid},
            f"queued {op_id}: the daemon is not running; it will take the request when it starts",
            EXIT_QUEUED,
        )
    receipt = anyio.run(wait_receipt, spool, rid, wait_seconds, decision)
    if receipt is None and sharded:
        return print_result(
            as_json,
            {"status": "queued", "operation_id": op_id, "request_id": rid, "sharded": True},
            sharded_spool_note(cfg, op_id, wait_seconds),
            EXIT_QUEUED,
        )
    if receipt is None:
        return print_result(
            as_json,
            {"status": "queued", "operation_id": op_id, "request_id": rid},
            f"queued {op_id}: no answer from the daemon within {wait_seconds:g}s; "
            f"it will take the request",
            EXIT_QUEUED,
        )
    if receipt.status in ("rejected", "escalated", "failed"):
        return print_result(
            as_json, msgspec.to_builtins(receipt), f"{receipt.status}: {receipt.reason}", 1
        )
    return print_result(as_json, msgspec.to_builtins(receipt), receipt.operation_id or op_id, 0)


def sharded_spool_note(cfg: Config, op_id: str, wait_seconds: float) -> str:
    """What happens to a spool file on a node of a sharded log (daemon/shards/spool.py)."""
    pg = cfg.postgres
    grace = (
        f"{2 * pg.lease_seconds:g}s (two lease lengths)" if pg is not None else "two lease lengths"
    )
    return (
        f"queued {op_id} in this node's spool, with no answer within {wait_seconds:g}s. This "
        f"node runs a sharded log: its daemon takes a spool file only for a shard it holds; a "
        f"file for a shard another node holds waits {grace} with the daemon running, then "
        f"is moved to spool/rejected with the reason (the spool is not relayed between "
        f"nodes). Nothing answered on {cfg.socket_path}: once the daemon answers there, run "
        f"this command again, and the API relays the request to the shard's holder"
    )


async def wait_receipt(
    spool: Spool, rid: str, seconds: float, decision: bool = False
) -> Receipt | None:
    stop = anyio.Event()
    with anyio.move_on_after(seconds):
        receipt = spool.read_receipt(rid, decision=decision)
        if receipt is not None:
            return receipt
        where = spool.decided if decision else spool.receipts
        async for _ in watchfiles.awatch(
            where, stop_event=stop, debounce=0, step=5, rust_timeout=200, yield_on_timeout=True
        ):
            receipt = spool.read_receipt(rid, decision=decision)
            if receipt is not None:
                stop.set()
                return receipt
    return spool.read_receipt(rid, decision=decision)
