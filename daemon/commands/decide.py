"""``bide decide``: answer an open escalation with one of its options."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

import msgspec

from daemon.api.schema import DecisionRequest
from daemon.commands.apicall import ApiCallError, ApiClient, connect, print_result
from daemon.commands.watch import report
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import count_arg, seconds_arg
from daemon.spool import DecisionFile, Spool, new_request_id

EPILOG = """\
examples:
  bide escalations                       # see what is open and which options each offers
  bide decide nightly-export extend --escalation 1 --note "status page says 30 min delay"
  bide decide nightly-export abandon --escalation 2

extend adds its time to the deadline in force (counted from your decision if the deadline has
passed) and its checks to the budget, as its label in bide escalations states (an operation
registered by an older bide keeps the rule it was registered under, which its label words).
The daemon records you as the approver: the user its local API socket reports (SO_PEERCRED),
or, while it is not running, the decision file's owner. It accepts only an option the open
escalation offered, and never from the operation's own registrant unless [api]
allow_self_approval = true. --escalation names the escalation you answer (its
number is in bide escalations and in the outbox message), so a decision can never land on a
later one; the daemon refuses a decision without it unless [spool]
require_escalation_number = false. With [spool] approvers_group set, only its members count
as approvers: never the daemon's own user, and root only with allow_root_approval; a file
with a second hard link, an ACL, or writable by others never counts.
exit status: 0 recorded; 1 rejected (prints why); 2 usage error; 75 queued (daemon not running)
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "decide",
        help="answer an open escalation with one of its options",
        description="Record a human decision on an operation's open escalation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", metavar="OP", help="the operation id")
    p.add_argument("option", metavar="OPTION", help="an option id the escalation offers")
    p.add_argument("--note", default="", help="why (recorded with the decision)")
    p.add_argument(
        "--escalation",
        type=count_arg(1, 10**9),
        metavar="N",
        help="the escalation you answer (required by default; see below)",
    )
    p.add_argument("--wait-seconds", type=seconds_arg(0, 3600, allow_zero=True), default=10.0)
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    client = connect(cfg)
    if client is not None:
        with client:
            return _through_api(client, args)
    rid = new_request_id()
    try:
        data = msgspec.json.encode(
            DecisionFile(1, rid, args.operation, args.option, args.note, args.escalation)
        )
        msgspec.json.decode(data, type=DecisionFile)
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid decision: {exc}") from None
    spool = Spool(cfg.spool_dir)
    spool.request(spool.decisions, rid, data, who="only the approvers' group may decide")
    return report(cfg, spool, rid, args.operation, args.wait_seconds, args.json, decision=True)


def _through_api(client: ApiClient, args: argparse.Namespace) -> int:
    try:
        request = DecisionRequest(option=args.option, escalation_id=args.escalation, note=args.note)
        msgspec.json.decode(msgspec.json.encode(request), type=DecisionRequest)
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid decision: {exc}") from None
    try:
        answer = client.call(
            "POST", f"/v1/operations/{quote(args.operation, safe='')}/decision", body=request
        )
    except ApiCallError as exc:
        if exc.status == 404:
            raise UsageError(
                f"no operation {args.operation!r} with an escalation you may see"
            ) from None
        if exc.status in (403, 409, 422):
            return print_result(
                args.json,
                {"status": "rejected", "error": exc.error, "reason": exc.detail},
                f"rejected: {exc.detail}",
                1,
            )
        raise
    return print_result(
        args.json,
        {"status": "recorded", **answer},
        f"recorded: {answer['option']} by {answer['approver']}"
        + ("; polling resumes" if answer["resumes"] else ""),
        0,
    )
