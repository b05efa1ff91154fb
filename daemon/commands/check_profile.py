"""``bide check-profile``: validate provider profiles before the daemon loads them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from daemon.errors import ConfigError
from daemon.profile import __doc__ as PROFILE_DOC
from daemon.profile import load_profile


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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
