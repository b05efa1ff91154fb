"""``bide verify``: the auditor's command. Needs no secret key."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import count_arg
from eventlog.keys import load_verify_key
from eventlog.verify import Report, verify_log

EPILOG = """\
exit status:
  0  intact
  1  damage found (the first damaged record is named, with its class)
  2  usage or I/O error
  3  intact except a torn final record (a crash artifact; the daemon recovers it on next open)

damage classes: modified, missing, reordered, duplicated, spliced, bad_signature,
segment_link, truncated (the log ends before --anchor); a line longer than the longest
record is "modified"

seal records are chained like any other; their MACs need the daemon's signing key, so
verify only notes a log whose last record no seal or checkpoint covers (the daemon
quarantines such records on its next open)

examples:
  bide verify /var/lib/bide/log --verify-key verify.pub
  bide verify --config /etc/bide/bide.toml --anchor 1200:9f2c…   # head kept elsewhere
  bide verify /var/lib/bide/log --verify-key verify.pub --json | jq .verdict
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check a log's chain and signatures offline, without secret keys",
        description="Check sequence continuity, hash links, segment links, the genesis record "
        "and every checkpoint signature, using only the public verify key.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log_dir", nargs="?", metavar="LOGDIR", help="the log directory")
    p.add_argument("--verify-key", metavar="FILE", help="verify.pub written by `bide keygen`")
    p.add_argument("--anchor", metavar="SEQ:HASH", help="a head recorded elsewhere "
                   "(`bide log head`): the log must contain it")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--jobs", type=count_arg(1, 64), metavar="N",
                   default=min(os.cpu_count() or 1, 4),
                   help="worker processes for large logs (default: CPUs, at most 4)")
    add_config_flag(p)
    p.set_defaults(func=run)


def resolve_log_and_key(args: argparse.Namespace) -> tuple[Path, Path]:
    """LOGDIR and verify key from the flags, taking what is missing from the config."""
    log_dir = Path(args.log_dir) if args.log_dir else None
    key = Path(args.verify_key) if args.verify_key else None
    if log_dir is not None and key is not None:
        return log_dir, key
    if log_dir is not None and not args.config and not os.environ.get("BIDE_CONFIG"):
        raise UsageError(
            "pass --verify-key FILE (the verify.pub from `bide keygen`), or --config FILE to "
            "take the log and the key from the config"
        )
    cfg = load_config(args.config)
    return log_dir or cfg.log_dir, key or cfg.verify_key_path


def parse_anchor(text: str) -> tuple[int, str]:
    m = re.fullmatch(r"(\d+):([0-9a-f]{64})", text.strip())
    if not m:
        raise UsageError(f"--anchor {text!r} is not SEQ:HASH (as `bide log head` prints it)")
    return int(m.group(1)), m.group(2)


def run(args: argparse.Namespace) -> int:
    log_dir, key_path = resolve_log_and_key(args)
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    anchor = parse_anchor(args.anchor) if args.anchor else None
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: need at least 1")
    report = verify_log(log_dir, load_verify_key(key_path), anchor=anchor, jobs=args.jobs)
    if args.json:
        print(json.dumps(report_json(report)))
    else:
        print_report(report)
    return report.exit_status


def report_json(report: Report) -> dict[str, object]:
    return {
        "log_dir": str(report.log_dir),
        "log_id": report.log_id,
        "verdict": report.verdict,
        "records": report.records,
        "segments": report.segments,
        "checkpoints": report.checkpoints,
        "head": {"seq": report.head_seq, "hash": report.head_hash},
        "last_checkpoint_seq": report.last_checkpoint_seq,
        "clean_close": report.clean_close,
        "unsigned_tail": report.unsigned_tail,
        "writer_live": report.writer_live,
        "damage": dataclasses.asdict(report.damage) if report.damage else None,
        "torn_tail": (
            {"segment": report.torn.segment.name, "offset": report.torn.offset,
             "length": report.torn.length, "seq": report.torn.seq} if report.torn else None
        ),
        "notes": report.notes,
    }


def print_report(report: Report) -> None:
    out = sys.stdout
    if report.damage is not None:
        d = report.damage
        print(f"DAMAGE {d.kind} at record {d.seq} ({d.segment} offset {d.offset}): {d.detail}",
              file=out)
    if report.torn is not None:
        t = report.torn
        print(f"torn tail: {t.length} byte(s) at {t.segment.name} offset {t.offset} "
              f"(crash artifact; the daemon quarantines it on next open)", file=out)
    if report.writer_live:
        pid = f" (pid {report.writer_pid})" if report.writer_pid else ""
        print(f"note: a writer holds the log{pid}; verified up to its last complete record",
              file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    print(report.summary(), file=out)
