"""``bide story``: an operation's audit trail, as the story the seed shows (S39)."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from daemon.commands.apicall import ApiCallError, require
from daemon.config import Config, add_config_flag, load_config
from daemon.errors import UsageError
from daemon.readers import (
    load_operation,
    load_state,
    need_op,
    op_action_events,
    op_events,
    open_keyring,
)
from replay.actions import action_story
from replay.story import for_people, story_json
from replay.text import format_time


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "story",
        help="an operation's audit story (read-only)",
        description="Render every recorded decision of one operation as a "
        "timeline: registration, each poll with its state and next poll time and "
        "the delay's source, each protocol signal, the stop and escalation. The "
        "running daemon answers from memory; --offline reads the log.",
        epilog="examples:\n  bide story nightly-export\n"
        "  bide story nightly-export --json | jq '.[].text'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", metavar="OP")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--offline",
        action="store_true",
        help="read the log directly with its data key (operators, forensics); "
        "without it the running daemon answers, and no key is needed",
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.offline:
        return run_offline(cfg, args)
    with require(cfg, f"story {args.operation}") as client:
        try:
            story = client.call("GET", f"/v1/operations/{quote(args.operation, safe='')}/story")
        except ApiCallError as exc:
            if exc.status == 404:
                raise UsageError(f"no operation {args.operation!r} (or not yours)") from None
            raise
    if args.json:
        print(
            json.dumps([{**line, "operation_id": story["operation_id"]} for line in story["lines"]])
        )
    else:
        print(for_people(story["lines"]), end="")
    return 0


def run_offline(cfg: Config, args: argparse.Namespace) -> int:
    keyring = open_keyring(cfg)
    log = load_operation(cfg.log_dir, keyring, args.operation)
    actions = op_action_events(log, args.operation)
    if args.operation not in log.ops and not actions:
        need_op(load_state(cfg, keyring), args.operation)  # names some that exist
    lines = sorted(
        [*story_json(op_events(log, args.operation)), *action_story(actions)],
        key=lambda line: float(line["at"]),  # type: ignore[arg-type]
    )
    if args.json:  # times as the API gives them (RFC 3339), whichever answers
        shown = [{**line, "at": format_time(float(str(line["at"])))} for line in lines]
        print(json.dumps(shown))
    else:
        print(for_people(lines), end="")
    return 0
