"""``bide verify`` over a sharded log: each shard's chain verified on its own with
``verify.pub`` alone, one line per shard and a total; the exit status is the worst shard's.

Two sources hold the shards: the database (``--dsn``, every shard exported read-only to a
private temporary directory and verified there, as an unsharded log is) and an export
directory (``shards.json`` beside one ``shard-NNN/`` per shard, as ``bide log export`` writes
it). An unsharded log never comes here: its report is the one it always had.

Across shards: every shard's log has its own random log id, so two shards holding the same
id is damage (``duplicated``, in each of them): one shard's records were copied over
another's, which neither chain can show on its own.

A shard no node has ever taken (no record, lease epoch 0) is ``empty``, which is not damage:
a 16-shard log with few operations has such shards. A shard whose lease was taken but which
holds no record is verified as any log with no record is (damage ``missing`` at record 0),
since every takeover is followed by the taker's records.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.commands.verify_report import (
    Judged,
    check_epochs,
    judge,
    parse_anchor,
    print_judged,
    print_signer_mismatch,
)
from daemon.errors import UsageError
from daemon.shardexport import ShardExport, chosen_exported
from eventlog.keys import VerifyKey, load_verify_key
from eventlog.verify import Damage, Report

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout

#: Exit statuses from the least to the most serious: the worst shard's is the command's.
SEVERITY = (0, 3, 4, 5, 6, 7, 8, 1)


@dataclasses.dataclass
class ShardVerdict:
    """One shard's verification; ``judged`` is None for a shard no node has taken."""

    shard: int
    where: str  # its schema, or its directory in an export
    judged: Judged | None

    @property
    def verdict(self) -> str:
        return "empty" if self.judged is None else self.judged.verdict

    def exit_status(self) -> int:
        return 0 if self.judged is None else self.judged.exit_status()


def worst(statuses: list[int]) -> int:
    return max(statuses, key=SEVERITY.index, default=0)


def _checked_flags(args: argparse.Namespace, shards: int) -> tuple[int, str] | None:
    """The anchor (one shard's head), refusing flags that name one log when several shards
    are verified."""
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: need at least 1")
    if shards > 1 and args.anchor:
        raise UsageError("--anchor names one shard's head: add --shard K (the shard it is from)")
    if shards > 1 and getattr(args, "archive", []):
        raise UsageError("--archive holds one shard's archived segments: add --shard K")
    return parse_anchor(args.anchor) if args.anchor else None


def verify_database(args: argparse.Namespace, settings: PgSettings, layout: Layout) -> int:
    """Each chosen shard of the sharded log in the database, exported to a temporary
    directory one at a time (the disk holds one shard's copy at most) and verified there,
    with its ``epoch`` column checked against its takeover records."""
    from daemon.pgconfig import chosen_shards, naming_shard
    from eventlog.pgstore import PgLogStore

    shards = chosen_shards(layout, args.shard)
    anchor = _checked_flags(args, len(shards))
    verify_key = load_verify_key(Path(args.verify_key))
    results: list[ShardVerdict] = []
    for shard in shards:
        with tempfile.TemporaryDirectory(prefix="bide-verify-") as tmp:
            log_dir = Path(tmp) / "log"
            with (
                naming_shard(layout, shard),
                PgLogStore(layout.settings(settings, shard), read_only=True) as store,
            ):
                store.require()
                lease = store.lease()
                store.export(log_dir)
                changes = store.epoch_changes()
            if lease.epoch == 0 and not any(log_dir.iterdir()):
                results.append(ShardVerdict(shard, layout.schema(shard), None))
                continue

            def also(report: Report, changes: list[tuple[int, int]] = changes) -> None:
                check_epochs(report, changes)

            label = f"shard {shard}/{layout.count}"
            judged = judge(args, log_dir, verify_key, also, anchor=anchor, label=label)
            results.append(ShardVerdict(shard, layout.schema(shard), judged))
    same_log(results)
    return show(args, verify_key, results, layout.count, source={"schema": layout.base})


def verify_export(args: argparse.Namespace, export: ShardExport, key_path: Path) -> int:
    """Each chosen shard of an export directory (``shards.json``)."""
    dirs = chosen_exported(export, args.shard)
    anchor = _checked_flags(args, len(dirs))
    verify_key = load_verify_key(key_path)
    results: list[ShardVerdict] = []
    for shard, log_dir in dirs.items():
        empty = not any(p.name.startswith("seg-") for p in log_dir.iterdir())
        label = f"shard {shard}/{export.count}"
        judged = None if empty else judge(args, log_dir, verify_key, anchor=anchor, label=label)
        results.append(ShardVerdict(shard, str(log_dir), judged))
    same_log(results)
    return show(args, verify_key, results, export.count, source={"export": str(export.root)})


def same_log(results: list[ShardVerdict]) -> None:
    """Shards that hold one log (the same log id in their genesis records) are damaged: each
    shard is a log of its own, made with its own random id, so a shared id means one
    shard's records were copied over another's (which the shards' own chains cannot show).
    Each such shard is marked, since nothing says which one is the original."""
    by_id: dict[str, list[ShardVerdict]] = {}
    for r in results:
        if r.judged is not None and r.judged.report.log_id:
            by_id.setdefault(r.judged.report.log_id, []).append(r)
    for log_id, shards in by_id.items():
        if len(shards) < 2:
            continue
        names = ", ".join(str(r.shard) for r in shards)
        for r in shards:
            assert r.judged is not None
            report = r.judged.report
            if report.damage is None:
                report.damage = Damage(
                    "duplicated",
                    0,
                    "",
                    0,
                    f"shards {names} hold the same log (log id {log_id}): each shard's log is "
                    f"made with its own id, so one shard's records were copied over another's",
                )


def show(
    args: argparse.Namespace,
    verify_key: VerifyKey,
    results: list[ShardVerdict],
    count: int,
    *,
    source: dict[str, str],
) -> int:
    """One line per shard (and its damage, notes and takeovers, each after the shard's
    name), then a total; or, ``--json``, one object. Returns the worst shard's exit status."""
    status = worst([r.exit_status() for r in results])
    verdicts = [r.verdict for r in results]
    records = sum(r.judged.report.records for r in results if r.judged is not None)
    worst_verdict = next(
        (r.verdict for r in results if r.exit_status() == status and status != 0),
        "intact",
    )
    wrong_signer = any(r.judged is not None and r.judged.wrong_signer for r in results)
    if args.json:
        shards: list[dict[str, Any]] = []
        for r in results:
            entry: dict[str, Any] = {"shard": r.shard, "where": r.where}
            if r.judged is None:
                entry |= {"verdict": "empty", "records": 0, "exit_status": 0}
            else:
                entry |= r.judged.to_json(args.expect_signer)
                entry["exit_status"] = r.judged.exit_status()
            shards.append(entry)
        print(
            json.dumps(
                {
                    **source,
                    "count": count,
                    "verdict": worst_verdict,
                    "exit_status": status,
                    "records": records,
                    "signer": {"fingerprint": verify_key.fingerprint},
                    "expected_signer": args.expect_signer or None,
                    "shards": shards,
                }
            )
        )
    else:
        print(f"signer: root key {verify_key.fingerprint}")
        for r in results:
            prefix = f"shard {r.shard:03d}: "
            if r.judged is None:
                print(f"{prefix}records=0 verdict=empty (no node has taken this shard yet)")
            else:
                print_judged(r.judged, prefix)
        tally = ", ".join(
            f"{verdicts.count(v)} {v}" for v in dict.fromkeys(sorted(verdicts, key=_order))
        )
        chosen = "all" if len(results) == count else f"of {count}"
        print(
            f"total: {len(results)} shard(s) ({chosen}): {tally}; {records} records; "
            f"verdict={worst_verdict}"
        )
    if wrong_signer:
        print_signer_mismatch(verify_key, args.expect_signer)
    sys.stdout.flush()
    return status


def _order(verdict: str) -> int:
    order = ("intact", "empty", "torn_tail")
    return order.index(verdict) if verdict in order else len(order)
