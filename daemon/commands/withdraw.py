"""``bide withdraw``: stop waiting on one of your own operations."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

import msgspec

from daemon.api.schema import WithdrawRequest
from daemon.commands.apicall import ApiCallError, print_result, require
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError

EPILOG = """\
examples:
  bide withdraw nightly-export --note "the export is no longer needed"

The daemon stops waiting at once and records the withdrawal (withdrawn_by_owner, with you
as the kernel names you); it makes no provider call (to cancel the job at the provider, see
the profile's cancel call and bide decide). Only the operation's owner may withdraw it.
exit status: 0 withdrawn; 1 it had already ended (nothing to withdraw) or is still being
submitted; 2 no such operation of yours, or usage error; 69 the daemon is not running
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "withdraw",
        help="stop waiting on one of your operations",
        description="Withdraw one of your own operations: bide stops waiting "
        "and records why. Goes through the daemon's local API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", metavar="OP")
    p.add_argument("--note", default="", help="why (recorded)")
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    try:
        request = WithdrawRequest(note=args.note)
        msgspec.json.decode(msgspec.json.encode(request), type=WithdrawRequest)
    except msgspec.ValidationError as exc:
        raise UsageError(f"invalid withdrawal: {exc}") from None
    with require(cfg, "status") as client:
        try:
            answer = client.call(
                "POST", f"/v1/operations/{quote(args.operation, safe='')}/withdrawal", body=request
            )
        except ApiCallError as exc:
            if exc.status == 404:
                raise UsageError(f"no operation {args.operation!r} (or not yours)") from None
            if exc.status in (403, 409):
                return print_result(
                    args.json,
                    {"status": "refused", "error": exc.error, "reason": exc.detail},
                    f"refused: {exc.detail}",
                    1,
                )
            raise
    if not answer["withdrawn"]:
        return print_result(
            args.json,
            answer,
            f"{args.operation} had already ended ({answer['phase']}); nothing withdrawn",
            1,
        )
    return print_result(args.json, answer, f"withdrawn {args.operation}", 0)
