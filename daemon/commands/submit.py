"""``bide submit``: let the daemon make the submit call, record it, then watch the job."""

from __future__ import annotations

import argparse
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

from daemon.api.schema import SubmitRequest
from daemon.commands.apicall import ApiCallError, ApiClient, connect, print_result
from daemon.commands.watch import EXIT_QUEUED, report
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import count_arg, parse_duration, parse_time, seconds_arg
from daemon.spool import Spool, SubmitFile, new_request_id
from replay.observations import Registration

EPILOG = """\
examples:
  bide submit --provider acme --body export.json --deadline 40m --operation nightly
  bide submit --provider acme --body export.json --idempotency-key 7f3c...   # S29
  bide submit --provider acme --body export.json --force   # a deliberate second submit

The daemon records the request (its fingerprint: method, URL, body; and the idempotency key)
before it sends it, makes the call once, and registers the job the provider names in its
answer (Location, Operation-Location or a body field, as the profile says; never guessed).
An ambiguous outcome (timeout, reset) is retried only when the provider is idempotent and the
key was recorded; otherwise it escalates with options (see `bide escalations`).
exit status: 0 accepted and registered (prints the operation id); 1 rejected, failed or
escalated (prints why); 2 usage error; 75 queued (the daemon is not running or did not answer
within --wait-seconds).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a job through the daemon, then watch it",
        description="Have the daemon submit a job to a provider (the profile's "
        "[submit] call), record it before sending, and watch the job it creates.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--provider", required=True)
    p.add_argument("--body", required=True, metavar="FILE", help="the request body ('-': stdin)")
    p.add_argument("--operation", help="bide's operation id (default: op-<random>)")
    p.add_argument(
        "--idempotency-key",
        type=_idempotency_key,
        metavar="KEY",
        help="sent in the profile's idempotency header: 1-256 visible ASCII "
        "characters (default: bide makes one when the provider is idempotent)",
    )
    p.add_argument("--deadline", help="wall-clock deadline from now, e.g. 40m")
    p.add_argument("--business-deadline", metavar="TIME", help="ISO-8601 or +DURATION (S28)")
    p.add_argument("--max-requests", type=count_arg(), metavar="N")
    p.add_argument("--max-transport-failures", type=count_arg(), metavar="N")
    p.add_argument("--max-rate-limited", type=count_arg(), metavar="N")
    p.add_argument("--account", default="", help="provider account context (a name)")
    p.add_argument("--expected-state", help="the success state you expect")
    p.add_argument(
        "--force",
        action="store_true",
        help="submit even if a live operation has the same request fingerprint",
    )
    p.add_argument(
        "--wait-seconds",
        type=seconds_arg(0, 3600, allow_zero=True),
        default=60.0,
        help="how long to wait for the provider's answer (default 60)",
    )
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def _read_body(name: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --body {name}: {exc.strerror}") from None


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    now = time.time()
    op_id = args.operation or f"op-{secrets.token_hex(6)}"
    body = _read_body(args.body)
    deadline = parse_duration(args.deadline, "--deadline") if args.deadline else None
    business = (
        parse_time(args.business_deadline, "--business-deadline", now)
        if args.business_deadline
        else None
    )
    client = connect(cfg)
    if client is not None:
        try:
            request = SubmitRequest(
                provider=args.provider,
                body=body,
                operation_id=op_id,
                idempotency_key=args.idempotency_key,
                force=args.force,
                deadline_seconds=deadline,
                business_deadline_at=business,
                max_status_requests=args.max_requests,
                max_transport_failures=args.max_transport_failures,
                max_rate_limited=args.max_rate_limited,
                account=args.account,
                expected_state=args.expected_state,
            )
            msgspec.json.decode(msgspec.json.encode(request), type=SubmitRequest)
        except msgspec.ValidationError as exc:
            raise UsageError(f"invalid submit: {exc}") from None
        with client:
            return _through_api(client, request, args.wait_seconds, args.json)
    rid = new_request_id()
    try:
        reg = Registration(
            operation_id=op_id,
            provider=args.provider,
            provider_job_id="(from the answer)",
            account_context=args.account,
            expected_terminal_state=args.expected_state,
            deadline_at=now + deadline if deadline else None,
            business_deadline_at=business,
            max_status_requests=args.max_requests,
            max_transport_failures=args.max_transport_failures,
            max_rate_limited=args.max_rate_limited,
        )
        spooled = SubmitFile(1, rid, "submit", reg, body, args.idempotency_key, args.force)
        data = msgspec.json.encode(spooled)
        msgspec.json.decode(data, type=SubmitFile)
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid submit: {exc}") from None
    spool = Spool(cfg.spool_dir)
    spool.request(spool.incoming, rid, data)
    return report(cfg, spool, rid, op_id, args.wait_seconds, args.json)


def _through_api(
    client: ApiClient, request: SubmitRequest, wait_seconds: float, as_json: bool
) -> int:
    """Submit, then wait (bounded) for the provider's answer: registered, or why not."""
    try:
        receipt = client.call("POST", "/v1/submissions", body=request)
    except ApiCallError as exc:
        if exc.status in (409, 422, 429):
            return print_result(
                as_json,
                {"status": "rejected", "error": exc.error, "reason": exc.detail},
                f"rejected: {exc.detail}",
                1,
            )
        raise
    op_id = receipt["operation_id"]
    deadline = time.monotonic() + wait_seconds
    view: dict[str, Any] = {"phase": receipt["status"]}
    while view["phase"] == "submitting" and time.monotonic() < deadline:
        wait = max(0.0, min(60.0, deadline - time.monotonic()))
        view = client.call(
            "GET",
            f"/v1/operations/{quote(op_id, safe='')}",
            params={"wait": f"{wait:.3f}", "until": "registered"},
            timeout=wait + 30.0,
        )
    if view["phase"] == "submitting":
        return print_result(
            as_json,
            {"status": "queued", "operation_id": op_id},
            f"queued {op_id}: the provider has not answered within "
            f"{wait_seconds:g}s; the daemon goes on (bide wait {op_id})",
            EXIT_QUEUED,
        )
    if view["phase"] in ("escalated", "closed") and not view.get("provider_job_id"):
        reason = view.get("stop_reason") or view["phase"]
        return print_result(
            as_json,
            {"status": view["phase"], "operation_id": op_id, "reason": reason, "operation": view},
            f"{view['phase']}: {reason} (see bide escalations)",
            1,
        )
    return print_result(
        as_json, {"status": "registered", "operation_id": op_id, "operation": view}, op_id, 0
    )


def _idempotency_key(text: str) -> str:
    """A key is sent as a header value: visible ASCII only, 1 to 256 characters."""
    if not re.fullmatch(r"[\x21-\x7e]{1,256}", text):
        raise argparse.ArgumentTypeError(
            "must be 1 to 256 visible ASCII characters (letters, digits, punctuation; no "
            "spaces or accents): it is sent as an HTTP header value"
        )
    return text
