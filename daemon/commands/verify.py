"""``bide verify``: the auditor's command. Needs no secret key."""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.commands.verify_archive import add_archive_flag, verified
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
from daemon.verify_progress import progress_line
from daemon.verify_witness import WitnessCheck, check_witnesses
from daemon.witness.remote import (
    Lie,
    Witnessed,
    WitnessUnreachable,
    pinned_keys,
    shown,
    witnessed,
)
from eventlog.envelope import FORMAT_SINGLE_KEY
from eventlog.heads import Finding
from eventlog.keys import VerifyKey, load_verify_key
from eventlog.verify import Damage, Report

#: Exit statuses of what a witness's heads reveal about an otherwise intact log.
EXIT_WITNESS = {"rolled_back": 4, "forked": 5, "truncated": 6, "witness_lied": 7}
EXIT_SIGNER = 8

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


def parse_anchor(text: str) -> tuple[int, str]:
    m = re.fullmatch(r"(\d+):([0-9a-f]{64})", text.strip())
    if not m:
        raise UsageError(f"--anchor {text!r} is not SEQ:HASH (as `bide log head` prints it)")
    return int(m.group(1)), m.group(2)


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


def check_epochs(report: Report, changes: list[tuple[int, int]]) -> None:
    """The database's ``epoch`` column against the chain's takeover records: every record
    from a takeover on was committed under the epoch it took, and the epoch changes only at
    a takeover (the first records, before any, may be an import's epoch 0 or the first
    node's). A mismatch is damage: the column was altered, or a node wrote outside its
    term."""
    if report.damage is not None:
        return
    taken = {seq: epoch for seq, epoch, _ in report.takeovers}
    first = report.takeovers[0][0] if report.takeovers else None
    for seq, epoch in changes:
        if seq in taken or first is None or seq < first:
            continue
        report.damage = Damage(
            "modified",
            seq,
            "",
            0,
            (
                f"record {seq} was committed under lease epoch {epoch} in the database, but no "
                f"takeover record starts that epoch there: the epoch column was altered, or a "
                f"node wrote outside its term"
            ),
        )
        return
    starts = [seq for seq, _ in changes]
    for seq, epoch in taken.items():
        i = bisect.bisect_right(starts, seq) - 1
        if i < 0 or changes[i][1] != epoch:
            report.damage = Damage(
                "modified",
                seq,
                "",
                0,
                (
                    f"takeover record {seq} took lease epoch {epoch}, but the database holds it "
                    f"under epoch {changes[i][1] if i >= 0 else 'none'}: the epoch column was "
                    f"altered, or the record was written outside its term"
                ),
            )
            return


@dataclasses.dataclass
class Judged:
    """One log's verification: the report, its signer, what the witnesses said, and the exit
    status it earns."""

    report: Report
    signer: dict[str, Any]
    wrong_signer: bool
    witnesses: WitnessCheck | None

    @property
    def finding(self) -> Finding | None:
        return self.witnesses.finding if self.witnesses is not None else None

    @property
    def lies(self) -> list[Lie]:
        return self.witnesses.lies if self.witnesses is not None else []

    @property
    def verdict(self) -> str:
        report = self.report
        return report.verdict if self.witnesses is None else self.witnesses.verdict(report)

    def exit_status(self) -> int:
        report = self.report
        if self.wrong_signer:
            return report.exit_status if report.exit_status == 1 else EXIT_SIGNER
        if report.exit_status != 0:
            return report.exit_status
        if self.finding is not None:
            return EXIT_WITNESS[self.finding.kind]
        return EXIT_WITNESS["witness_lied"] if self.lies else 0

    def to_json(self, expected_signer: str | None) -> dict[str, Any]:
        return {
            **report_json(self.report),
            "verdict": self.verdict,
            "signer": self.signer,
            "expected_signer": expected_signer or None,
            "witness": self.witnesses.to_json() if self.witnesses is not None else None,
            "witness_lied": [lie_json(lie) for lie in self.lies],
        }


def judge(
    args: argparse.Namespace,
    log_dir: Path,
    verify_key: VerifyKey,
    also: Callable[[Report], None] | None = None,
    *,
    anchor: tuple[int, str] | None = None,
    label: str = "",
) -> Judged:
    """Verify the log at ``log_dir`` (the existing directory of one log) with every check
    the flags ask for; prints nothing but the progress line (``label``: what it names)."""
    line = progress_line(sys.stderr, label)
    try:
        report = verified(args, log_dir, verify_key, anchor, progress=line)
    finally:
        if line is not None:
            line.close()
    if also is not None:
        also(report)
    wrong_signer = bool(args.expect_signer) and (
        args.expect_signer.strip().lower() != verify_key.fingerprint
    )
    witnesses = None
    if args.witness:
        ca = witness_ca(args)
        witnesses = check_witnesses(
            args.witness,
            lambda source: witness_heads(source, report.log_id, ca),
            log_dir,
            report,
            verify_key,
            witness_pins(args),
            judged=not wrong_signer,
        )
    return Judged(report, signer_json(report, verify_key), wrong_signer, witnesses)


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


def print_judged(judged: Judged, prefix: str = "") -> None:
    """The report's lines and the witnesses' (each line after ``prefix``)."""
    print_report(judged.report, prefix)
    for lie in judged.lies:
        print(
            f"{prefix}WITNESS witness_lied: witness {shown(lie.source)} returned head "
            f"{lie.head.seq}:{lie.head.hash}, which does not verify: {lie.reason}. The "
            f"witness lies or was tampered with; the log is not judged by it"
        )
    finding = judged.finding
    if finding is not None:
        print(
            f"{prefix}WITNESS {finding.kind}: the log {finding.detail} (witnessed head "
            f"{finding.head.seq}:{finding.head.hash})"
        )
    passed = judged.witnesses.line() if judged.witnesses is not None else None
    if passed is not None:
        print(f"{prefix}{passed}")


def print_signer_mismatch(verify_key: VerifyKey, expected: str) -> None:
    print(
        f"SIGNER MISMATCH: the log is signed by root key {verify_key.fingerprint}, not "
        f"by the expected {expected.strip()}: this is not the log (or not the "
        f"verify.pub) you meant; the log and its verify.pub may have been swapped together",
        file=sys.stderr,
    )


def signer_json(report: Report, verify_key: VerifyKey) -> dict[str, Any]:
    """The root key the log is signed by, and the epoch whose key signed its last checkpoint
    (format 2: 0, the root key signs every one; None before the first checkpoint)."""
    epoch: int | None = None
    if report.last_checkpoint_seq is not None:
        epoch = report.epoch
        if (
            report.format != FORMAT_SINGLE_KEY
            and report.epoch_cert_seq
            and report.epoch_cert_seq == report.last_checkpoint_seq
        ):
            epoch -= 1  # that checkpoint certified the next epoch's key: signed in its own
    return {"fingerprint": verify_key.fingerprint, "epoch": epoch, "format": report.format}


def witness_pins(args: argparse.Namespace) -> dict[str, bytes] | None:
    """--witness-key, else the config's [witness] witness_keys; None when none is pinned."""
    texts = list(args.witness_key)
    if not texts and (args.config or os.environ.get("BIDE_CONFIG")):
        texts = load_config(args.config).witness.witness_keys
    if not texts:
        return None
    try:
        return pinned_keys(texts)
    except ValueError as exc:
        raise UsageError(f"--witness-key: {exc}") from None


def witness_ca(args: argparse.Namespace) -> Path | None:
    """--witness-ca, else the config's [witness] ca_file when a config is in use."""
    if args.witness_ca:
        return Path(args.witness_ca)
    if args.config or os.environ.get("BIDE_CONFIG"):
        return load_config(args.config).witness_ca
    return None


def witness_heads(source: str, log_id: str, ca_file: Path | None = None) -> Witnessed:
    """What a witness holds: from ``bide witness serve`` at a URL, or from a file."""
    if not source.startswith(("http://", "https://")) and not Path(source).is_file():
        raise UsageError(f"--witness {source}: no such file (or give an http(s):// URL)")
    try:
        return witnessed(source, log_id, ca_file=ca_file)
    except WitnessUnreachable as exc:
        raise UsageError(str(exc)) from None


def lie_json(lie: Lie) -> dict[str, object]:
    return {
        "kind": "witness_lied",
        "witness": shown(lie.source),
        "reason": lie.reason,
        "head": {"seq": lie.head.seq, "hash": lie.head.hash, "epoch": lie.head.epoch},
    }


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
        "format": report.format,
        "epoch": report.epoch,
        "writer_live": report.writer_live,
        "damage": dataclasses.asdict(report.damage) if report.damage else None,
        "torn_tail": (
            {
                "segment": report.torn.segment.name,
                "offset": report.torn.offset,
                "length": report.torn.length,
                "seq": report.torn.seq,
            }
            if report.torn
            else None
        ),
        "notes": report.notes,
        "takeovers": [
            {"seq": seq, "lease_epoch": epoch, "holder": holder}
            for seq, epoch, holder in report.takeovers
        ],
    }


def print_report(report: Report, prefix: str = "") -> None:
    out = sys.stdout
    if report.damage is not None:
        d = report.damage
        print(
            f"{prefix}DAMAGE {d.kind} at record {d.seq} ({d.segment} offset {d.offset}): "
            f"{d.detail}",
            file=out,
        )
    if report.torn is not None:
        t = report.torn
        print(
            f"{prefix}torn tail: {t.length} byte(s) at {t.segment.name} offset {t.offset} "
            f"(crash artifact; the daemon quarantines it on next open)",
            file=out,
        )
    if report.writer_live:
        pid = f" (pid {report.writer_pid})" if report.writer_pid else ""
        print(
            f"{prefix}note: a writer holds the log{pid}; verified up to its last complete record",
            file=out,
        )
    for note in report.notes:
        print(f"{prefix}note: {note}", file=out)
    for seq, epoch, holder in report.takeovers:
        print(f"{prefix}takeover: record {seq}, lease epoch {epoch}, by {holder}", file=out)
    print(f"{prefix}{report.summary()}", file=out)
