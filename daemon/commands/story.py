"""``bide story``: an operation's audit trail, as the story the seed shows (S39)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from daemon.config import add_config_flag, load_config
from daemon.readers import load_log, need_op, op_events, open_keyring
from replay.story import story, story_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("story", help="an operation's audit story (read-only)",
                       description="Render every recorded decision of one operation as a "
                       "timeline: registration, each poll with its state and next poll time and "
                       "the delay's source, each protocol signal, the stop and escalation.",
                       epilog="examples:\n  bide story nightly-export\n"
                       "  bide story nightly-export --json | jq '.[].text'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("operation", metavar="OP")
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    log = load_log(cfg.log_dir, open_keyring(cfg))
    need_op(log, args.operation)
    events = op_events(log, args.operation)
    if args.json:
        print(json.dumps(story_json(events)))
    else:
        print(story(events), end="")
    return 0
