"""What `bide verify` reports: a log's report judged (damage, witnesses, the signer, an
anchor) and printed or put in JSON; shared by one log's verify and a sharded log's."""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon.commands.verify_archive import verified
from daemon.config import load_config
from daemon.errors import UsageError
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
from eventlog.keys import VerifyKey
from eventlog.verify import Damage, Report

#: Exit statuses of what a witness's heads reveal about an otherwise intact log.

#: Exit statuses of what a witness's heads reveal about an otherwise intact log.
EXIT_WITNESS = {"rolled_back": 4, "forked": 5, "truncated": 6, "witness_lied": 7}
EXIT_SIGNER = 8


def parse_anchor(text: str) -> tuple[int, str]:
    m = re.fullmatch(r"(\d+):([0-9a-f]{64})", text.strip())
    if not m:
        raise UsageError(f"--anchor {text!r} is not SEQ:HASH (as `bide log head` prints it)")
    return int(m.group(1)), m.group(2)


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
