"""``bide verify``: the auditor's command. Needs no secret key."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.commands.verify_archive import add_archive_flag
from daemon.commands.verify_report import (
    check_epochs,
    judge,
    parse_anchor,
    print_judged,
    print_signer_mismatch,
)
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import count_arg
from daemon.pgconfig import (
    add_dsn_flags,
    add_shard_flag,
    chosen_shards,
    one_shard,
    settings_for,
)
from daemon.shardexport import read_export
from eventlog.keys import load_verify_key
from eventlog.verify import Report

EPILOG = """\
exit status:
  0  intact
  1  damage found (the first damaged record is named, with its class)
  2  usage or I/O error
  3  intact except a torn final record (a crash artifact; the daemon recovers it on next open)
  4  rolled_back: the log ends at a signed checkpoint older than a head the witness holds
  5  forked: the log holds another record where the witness holds a head (or is another log)
  6  truncated: the log ends before a witnessed head, its signed end cut (unsigned records
     after its last checkpoint)
  7  witness_lied: a witness returned a head that does not verify from verify.pub through
     the log's certified keys (or, with pinned --witness-key, lacks a countersignature by
     one): the witness lies or was tampered with; the log itself is not judged by that head
  8  the log is signed by another root key than --expect-signer names

damage classes: modified, missing, reordered, duplicated, spliced, bad_signature,
segment_link, truncated (the log ends before --anchor: exit 1); a line longer than the
longest record is "modified". With --witness, an intact log is also checked against every
head the witness holds for it: rolled_back, forked, truncated (exit 4, 5, 6). Every head a
witness returns is first checked (its checkpoint's signature through the chain of certified
keys, from verify.pub and the log's genesis record; with --witness-key, the witness's
countersignature): one that fails is witness_lied (exit 7), never evidence against the log.

--json with --witness: a "witness" object whether the check passed or not: checked, finding
(consistent, no_heads, rolled_back, truncated, forked, witness_lied, or not_checked for a
damaged log), what was checked, each witness with the heads of this log it holds, the newest
witnessed head; the "verdict" is the witness's finding when the log is otherwise intact

progress: on a terminal, a line on stderr (records/s, the time left) while a large log is
checked, erased before the report; nothing when stderr is not a terminal

signer: the report names the root key that signed the log (its fingerprint, as `bide keygen`
prints it) and the epoch of the last signed checkpoint; --expect-signer FINGERPRINT fails
(exit 8) when that is another key (a log and verify.pub swapped together)

forward-secure logs (format 3): verify.pub certifies the first epoch key in the genesis
record, each epoch key certifies the next at an epoch boundary; every checkpoint is checked
with the key of its epoch, so a checkpoint re-signed with a later (stolen) key is
bad_signature, naming the checkpoint and the record that certified the key it should have

seal records are chained like any other; their MACs need the daemon's signing key, so
verify only notes a log whose last record no seal or checkpoint covers (the daemon
quarantines such records on its next open)

sharded logs (bide log init --shards N): --dsn verifies each shard's chain on its own
(--shard K: only that one) and prints one line per shard, each shard's damage, notes and
takeovers after its number, then a total; --json gives "shards": [...] (each shard's report)
and the overall "verdict"; the exit status is the worst shard's. A shard no node has taken
yet is "empty" (exit 0). Two shards holding the same log (one log id) are both damaged
(duplicated): one shard's records were copied over another's. --shard with --config whose
log is in PostgreSQL reads that database (the key from the config, unless --verify-key),
and so does --config of a node of a sharded log (its local copies in STATE/shards/). A
directory `bide log export` wrote from a sharded log (it holds shards.json) is verified
the same way, with no database.

examples:
  bide verify /var/lib/bide/log --verify-key verify.pub
  bide verify --config /etc/bide/bide.toml --anchor 1200:9f2c…   # head kept elsewhere
  bide verify /var/lib/bide/log --verify-key verify.pub --json | jq .verdict
  bide verify --config /etc/bide/bide.toml --witness https://witness.example:8443
  bide verify /var/lib/bide/log --verify-key verify.pub --witness /mnt/audit/heads.jsonl
  bide verify --dsn postgresql://audit@db.example/bide --verify-key verify.pub  # read-only role
  bide verify --config /etc/bide/bide.toml --archive /mnt/archive/bide-2025  # archive + live
  bide verify --dsn postgresql://audit@db.example/bide --verify-key verify.pub --shard 7
  bide verify ./export --verify-key verify.pub          # every shard of a sharded export
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
    p.add_argument(
        "--anchor",
        metavar="SEQ:HASH",
        help="a head recorded elsewhere (`bide log head`): the log must contain it",
    )
    p.add_argument(
        "--witness",
        metavar="FILE|URL",
        action="append",
        default=[],
        help="a witness's heads: its state file, a heads file, or the URL of "
        "`bide witness serve` (repeatable); the log must hold each of its heads",
    )
    p.add_argument(
        "--witness-ca",
        metavar="PEM",
        help="the CA that signed an https witness's certificate (a private CA; "
        "default: the public roots)",
    )
    p.add_argument(
        "--witness-key",
        metavar="KEY|FILE",
        action="append",
        default=[],
        help="a pinned witness public key (base64, as `bide witness serve` prints "
        "it, or its <key>.pub file; repeatable; default: the config's [witness] "
        "witness_keys): heads from a URL must be countersigned by one",
    )
    p.add_argument(
        "--expect-signer",
        metavar="FINGERPRINT",
        help="the root key fingerprint the log must be signed by (exit 8 if not)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument(
        "--jobs",
        type=count_arg(1, 64),
        metavar="N",
        default=min(os.cpu_count() or 1, 4),
        help="worker processes for large logs (default: CPUs, at most 4)",
    )
    add_archive_flag(p)
    add_dsn_flags(
        p, what="verify the log in this database (a read-only role suffices) instead of LOGDIR"
    )
    add_shard_flag(
        p, what="a sharded log (--dsn, or an export with shards.json): the shards to verify"
    )
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


def run(args: argparse.Namespace) -> int:
    if args.dsn:
        return run_database(args)
    if not args.log_dir and _config_in_database(args, args.shard is not None):
        if not args.verify_key:
            args.verify_key = str(load_config(args.config).verify_key_path)
        return run_database(args)
    log_dir, key_path = resolve_log_and_key(args)
    export = read_export(log_dir) if log_dir.is_dir() else None
    if export is not None:
        from daemon.commands.verify_shards import verify_export

        return verify_export(args, export, key_path)
    if one_shard(args.shard) and args.shard.strip() != "0":
        raise UsageError(
            f"--shard {args.shard}: {log_dir} is one log (shard 0), not a sharded export "
            f"(shards.json); --shard reads a sharded log with --dsn, or the directory "
            f"`bide log export` wrote"
        )
    return verify_dir(args, log_dir, key_path)


def _config_in_database(args: argparse.Namespace, shard: bool) -> bool:
    """Whether to verify the config's database (--config or $BIDE_CONFIG) rather than its
    local copy: with ``--shard`` when the log is in PostgreSQL, and always on a node of a
    sharded log (:func:`daemon.pgconfig.sharded_node`)."""
    from daemon.pgconfig import config_settings, sharded_node

    if not args.config and not os.environ.get("BIDE_CONFIG"):
        return False
    cfg = load_config(args.config)
    return sharded_node(cfg) or (shard and config_settings(cfg) is not None)


def run_database(args: argparse.Namespace) -> int:
    """The log in PostgreSQL: its records exported read-only to a private temporary directory,
    byte for byte as segment files, then verified there like any log; a sharded log shard by
    shard (:mod:`daemon.commands.verify_shards`)."""
    from eventlog.pgstore import PgLogStore
    from eventlog.shards import layout_of

    if args.log_dir:
        raise UsageError("give LOGDIR or --dsn, not both")
    if not args.verify_key:
        raise UsageError("--dsn needs --verify-key FILE (the verify.pub from `bide keygen`)")
    settings = settings_for(args)
    layout = layout_of(settings)
    chosen_shards(layout, args.shard)
    if layout.sharded:
        from daemon.commands.verify_shards import verify_database

        return verify_database(args, settings, layout)
    with tempfile.TemporaryDirectory(prefix="bide-verify-") as tmp:
        log_dir = Path(tmp) / "log"
        with PgLogStore(settings, read_only=True) as store:
            store.require()
            store.export(log_dir)
            changes = store.epoch_changes()
        return verify_dir(
            args, log_dir, Path(args.verify_key), also=lambda report: check_epochs(report, changes)
        )


def verify_dir(
    args: argparse.Namespace,
    log_dir: Path,
    key_path: Path,
    also: Callable[[Report], None] | None = None,
) -> int:
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    anchor = parse_anchor(args.anchor) if args.anchor else None
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: need at least 1")
    verify_key = load_verify_key(key_path)
    judged = judge(args, log_dir, verify_key, also, anchor=anchor)
    if args.json:
        print(json.dumps(judged.to_json(args.expect_signer)))
    else:
        signer = judged.signer
        epoch = (
            ""
            if signer["epoch"] is None
            else f", last signed checkpoint in epoch {signer['epoch']}"
        )
        print(f"signer: root key {signer['fingerprint']}{epoch}")
        print_judged(judged)
    if judged.wrong_signer:
        print_signer_mismatch(verify_key, args.expect_signer)
    return judged.exit_status()
