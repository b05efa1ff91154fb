"""``bide replay [--check] --dsn D [--shard K|all]``: the log read from the database, each
shard on its own.

Each chosen shard is exported read-only to a private temporary directory (byte for byte, as
``bide log export`` writes it), folded and, with ``--check``, every decision in it re-derived;
a shard's events are a complete history of its operations, so nothing crosses shards. Each
operation must also be in the shard its id hashes to (:func:`eventlog.shards.shard_of`): one
found elsewhere is a ``wrong_shard`` mismatch, since no node would ever look for it there.
A shard with no record is ``empty``. An unsharded log prints exactly what ``bide replay``
prints for its local copy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from daemon.commands.status import op_line, op_summary
from daemon.config import Config
from daemon.readers import LoadedLog, load_log, open_keyring
from eventlog.keys import KeyRing
from replay.check import Mismatch, check
from replay.state import Operation

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout


@dataclasses.dataclass
class ShardReplay:
    shard: int
    log: LoadedLog | None  # None: the shard holds no record
    mismatches: list[Mismatch]

    @property
    def verdict(self) -> str:
        if self.log is None:
            return "empty"
        return "mismatch" if self.mismatches else "ok"


def wrong_shard(log: LoadedLog, shard: int, count: int) -> list[Mismatch]:
    """Each operation in ``log`` whose id belongs to another shard than ``shard``."""
    from eventlog.shards import shard_of

    found: list[Mismatch] = []
    seen: set[str] = set()
    for index, (_, ev) in enumerate(log.events):
        op_id = ev.operation_id
        if op_id in seen:
            continue
        seen.add(op_id)
        home = shard_of(op_id, count)
        if home != shard:
            found.append(
                Mismatch(
                    operation_id=op_id,
                    index=index,
                    observation="wrong_shard",
                    at=ev.at,
                    message=f"recorded in shard {shard}, but its id belongs to shard {home}",
                )
            )
    return found


def replay_shard(
    settings: PgSettings,
    layout: Layout,
    shard: int,
    keyring: KeyRing,
    args: argparse.Namespace,
) -> ShardReplay:
    from daemon.inputs import until_of
    from daemon.pgconfig import naming_shard
    from eventlog.pgstore import PgLogStore

    until_seq, until_time = until_of(args)
    count = layout.count
    with tempfile.TemporaryDirectory(prefix="bide-replay-") as tmp:
        log_dir = Path(tmp) / "log"
        with (
            naming_shard(layout, shard),
            PgLogStore(layout.settings(settings, shard), read_only=True) as store,
        ):
            store.require()
            n = store.export(log_dir)
        if n == 0:
            return ShardReplay(shard, None, [])
        log = load_log(log_dir, keyring, until_seq=until_seq, until_time=until_time)
    mismatches = check([ev for _, ev in log.events]) if args.check else []
    if args.check and count > 1:
        mismatches += wrong_shard(log, shard, count)
    return ShardReplay(shard, log, mismatches)


def run_database(args: argparse.Namespace, cfg: Config) -> int:
    from daemon.pgconfig import chosen_shards, settings_for
    from eventlog.shards import layout_of

    settings = settings_for(args)
    layout = layout_of(settings)
    shards = chosen_shards(layout, args.shard)
    keyring = open_keyring(cfg)
    done = [replay_shard(settings, layout, k, keyring, args) for k in shards]
    ops: list[Operation] = sorted(
        (op for r in done if r.log is not None for op in r.log.ops.values()),
        key=lambda o: o.registered_at,
    )
    events = sum(len(r.log.events) for r in done if r.log is not None)
    bad = sum(len(r.mismatches) for r in done)
    if args.json:
        print(json.dumps(replay_json(args, layout.sharded, done, ops, events)))
    else:
        for op in ops:
            print(op_line(op))
        if args.check:
            print_check(layout.sharded, done, len(ops), events, bad, layout.count)
    return 1 if bad else 0


def print_check(
    sharded: bool, done: list[ShardReplay], ops: int, events: int, bad: int, count: int
) -> None:
    for r in done:
        prefix = f"shard {r.shard:03d}: " if sharded else ""
        for m in r.mismatches:
            print(
                f"{prefix}MISMATCH {m.operation_id} at event {m.index} ({m.observation}): "
                f"{m.message}"
            )
        if not sharded:
            continue
        if r.log is None:
            print(f"{prefix}check: empty (no record)")
        else:
            print(
                f"{prefix}check: {len(r.log.events)} events, {len(r.log.ops)} operations, "
                f"{len(r.mismatches)} mismatch(es)"
            )
    if sharded:
        chosen = "all" if len(done) == count else f"of {count}"
        failed = sum(1 for r in done if r.mismatches)
        print(
            f"total: {len(done)} shard(s) ({chosen}), {failed} with mismatches: {events} "
            f"events, {ops} operations, {bad} mismatch(es)"
        )
    else:
        print(f"check: {events} events, {ops} operations, {bad} mismatch(es)")


def replay_json(
    args: argparse.Namespace,
    sharded: bool,
    done: list[ShardReplay],
    ops: list[Operation],
    events: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "events": events,
        "operations": [op_summary(op) for op in ops],
        "check": None
        if not args.check
        else {
            "mismatches": [
                {**msgspec.to_builtins(m), **({"shard": r.shard} if sharded else {})}
                for r in done
                for m in r.mismatches
            ]
        },
    }
    if sharded:
        out["shards"] = [
            {
                "shard": r.shard,
                "verdict": r.verdict if args.check else None,
                "events": len(r.log.events) if r.log is not None else 0,
                "operations": len(r.log.ops) if r.log is not None else 0,
                "head_seq": r.log.head_seq if r.log is not None else -1,
                "mismatches": len(r.mismatches),
            }
            for r in done
        ]
    return out
