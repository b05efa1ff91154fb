"""``bide check-profile``: validate provider profiles before the daemon loads them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from daemon.errors import ConfigError
from daemon.profile import __doc__ as PROFILE_DOC
from daemon.profile import load_profile
from daemon.sample import SampleError, parse_header, read_sample


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check-profile",
        help="validate provider profile files",
        description="Validate provider profiles and explain every problem with "
        "its file, line and key. The daemon refuses an invalid profile and keeps "
        "the last good one.",
        epilog=(PROFILE_DOC or "").split("Example", 1)[-1].join(("profile format example", "")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--sample",
        metavar="BODY.json",
        help="a status body: print how bide reads it and what it would decide (no request "
        "is sent); with one profile only",
    )
    p.add_argument("--status", type=int, default=200, help="the sample's HTTP status")
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a response header of the sample (Retry-After, RateLimit, ...); repeatable",
    )
    p.add_argument("--job-id", help="the registered job id the sample is checked against")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sample is not None:
        return _run_sample(args)
    results = []
    status = 0
    for name in args.files:
        try:
            profile = load_profile(Path(name))
            results.append(
                {"file": name, "ok": True, "provider": profile.name, "digest": profile.digest}
            )
            if not args.json:
                print(f"{name}: ok (provider {profile.name}, digest {profile.digest[:16]})")
        except ConfigError as exc:
            status = 1
            results.append({"file": name, "ok": False, "error": str(exc)})
            if not args.json:
                print(f"error: {exc}")
    if args.json:
        print(json.dumps(results))
    return status


def _run_sample(args: argparse.Namespace) -> int:
    if len(args.files) != 1:
        print("error: --sample takes exactly one profile")
        return 2
    try:
        profile = load_profile(Path(args.files[0]))
        body = Path(args.sample).read_bytes()
        headers: dict[str, str] = {}
        for text in args.header:
            parse_header(profile, text, headers)
        if not 100 <= args.status <= 599:
            raise SampleError(f"--status {args.status}: an HTTP status is 100..599")
        report = read_sample(profile, body, status=args.status, headers=headers, job_id=args.job_id)
    except (ConfigError, SampleError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}) if args.json else f"error: {exc}")
        return 1
    if args.json:
        print(json.dumps(report))
        return 0
    for key in ("provider", "http_status", "http_outcome", "state", "category", "identity"):
        print(f"{key}: {report[key]}")
    if report["unreadable"] is not None:
        print(f"unreadable: {report['unreadable']['reason']}: {report['unreadable']['detail']}")
    for name, value in report["results"].items():
        print(f"result {name}: {value}")
    if report["missing_result"]:
        print(f"missing result: {report['missing_result']}")
    if report["provider_error"] is not None:
        print(f"provider error: {report['provider_error']}")
    hints = report["hints"]
    for key in (
        "retry_after_in_seconds",
        "poll_hint_in_seconds",
        "pacing_seconds",
        "rate_limit_reset_in_seconds",
    ):
        if hints[key] is not None:
            print(f"hint {key}: {hints[key]}")
    for refused in hints["refused"]:
        print(f"hint refused: {refused['hint']} {refused['value']!r}: {refused['reason']}")
    for event in report["decision"]:
        rest = ", ".join(
            f"{k}={v}" for k, v in event.items() if k not in ("event", "context") and v is not None
        )
        print(f"decision: {event['event']}: {rest}")
    return 0
