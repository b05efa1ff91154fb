"""``bide log archive``: move a log's oldest sealed segments to an archive directory."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from daemon import __version__
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.faults import FaultInjection
from daemon.pgconfig import add_dsn_flags, store_for
from eventlog.archive import (
    ArchiveError,
    Manifest,
    Plan,
    commit_archive,
    export_only_reason,
    parse_before,
    plan_archive,
    prepare_dest,
    write_archive,
)
from eventlog.boundary import read_boundary
from eventlog.envelope import decode_record
from eventlog.headchain import genesis_line
from eventlog.keys import load_verify_key
from eventlog.snapshot import snapshot_seq

EPILOG = """\
what moves: the whole sealed segments whose records all come before the newest signed
checkpoint at or before --before (a sequence number, or an ISO 8601 time, UTC unless
zoned). The segment being written stays, and with the daemon running the one before it;
so do segments after the state snapshot's position (a restart reads from it). The live log
keeps archived.json: its boundary checkpoint (the last one archived, with the signed chain
of keys before it), from which `bide verify` checks the live log alone.

crash safety: the archive (segments, manifest.json) is written and fsynced before the live
log's archived.json is replaced, and that before any segment is removed; an interrupted run
leaves the live log verifiable, and rerunning the same command finishes it.

PostgreSQL (--dsn): the records are exported to DEST the same way and stay in the database.

examples:
  bide log archive --config /etc/bide/bide.toml --before 2026-01-01 /mnt/archive/bide-2025
  bide log archive --config /etc/bide/bide.toml --before 120000 --dry-run /mnt/archive/x
  bide verify --config /etc/bide/bide.toml --archive /mnt/archive/bide-2025
  bide log archive --dsn postgresql://audit@db/bide --verify-key verify.pub --before 2026-01-01 \\
      /mnt/archive/bide-2025
"""


def add_parser(sub2: Any) -> None:
    p = sub2.add_parser(
        "archive",
        help="move old sealed segments to a compressed archive, chain verifiable",
        description="Move whole sealed segments older than a signed checkpoint out of the "
        "live log into DEST (gzip, with manifest.json); the live log then verifies from that "
        "checkpoint, and `bide verify --archive DEST` checks archive and live log as one chain.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dest", metavar="DEST", help="the archive directory: new or empty")
    p.add_argument(
        "--before",
        required=True,
        metavar="SEQ|TIME",
        help="archive up to the newest signed checkpoint at or before this record or time",
    )
    p.add_argument("--log-dir", metavar="LOGDIR", help="the log (default: the config's)")
    p.add_argument("--verify-key", metavar="FILE", help="verify.pub (default: the config's)")
    p.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    add_dsn_flags(p, what="export from the log in this database (records stay there)")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.dsn:
            return _run_database(args)
        return _run_files(args)
    except ArchiveError as exc:
        raise UsageError(str(exc)) from None


def _sources(args: argparse.Namespace) -> tuple[Path, Path, int | None]:
    """The log, verify.pub and the state snapshot's sequence number (None: a log given
    without a config, such as a copy, whose daemon's snapshot is not known)."""
    if args.log_dir and args.verify_key and not args.config:
        return Path(args.log_dir), Path(args.verify_key), None
    cfg = load_config(args.config)
    log_dir = Path(args.log_dir) if args.log_dir else cfg.log_dir
    key = Path(args.verify_key) if args.verify_key else cfg.verify_key_path
    try:
        data = cfg.snapshot_path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"no state snapshot at {cfg.snapshot_path}: a daemon restart would have to replay "
            f"the records this would archive. Stop the daemon cleanly (it writes one), or "
            f"wait for a periodic one ([log] snapshot_every), then archive"
        ) from None
    snap = snapshot_seq(data)
    if snap is None:
        raise UsageError(
            f"the state snapshot {cfg.snapshot_path} cannot be read; stop the daemon cleanly "
            f"(it writes a new one), then archive"
        )
    return log_dir, key, snap


def _progress(index: int, total: int, done: int) -> None:
    if sys.stderr.isatty():
        end = "\n" if index == total else ""
        print(
            f"\rarchived {index}/{total} segments ({done / 1e6:.1f} MB)", end=end, file=sys.stderr
        )


def _run_files(args: argparse.Namespace) -> int:
    log_dir, key_path, snap = _sources(args)
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    dest = Path(args.dest)
    if dest.resolve() == log_dir.resolve() or log_dir.resolve() in dest.resolve().parents:
        raise UsageError(f"DEST {dest} is inside the log directory; give one outside it")
    verify_key = load_verify_key(key_path)
    faults = FaultInjection.from_environment()
    started = time.monotonic()
    log_id = _log_id(log_dir)
    unfinished = prepare_dest(dest, log_id) if not args.dry_run else None
    if unfinished is not None:
        removed = commit_archive(log_dir, unfinished, at=lambda s: faults.fire("archive", s))
        return _done(args, unfinished, dest, removed, time.monotonic() - started, resumed=True)
    if args.dry_run and (dest / "manifest.json").exists():
        raise UsageError(f"DEST {dest} holds an archive already; give a new or empty directory")
    plan = plan_archive(log_dir, verify_key, parse_before(args.before), snapshot_seq=snap)
    if snap is None and not args.dry_run:
        plan.notes.append(
            "no daemon config was given: a daemon started on this log later needs a state "
            "snapshot at or after the boundary"
        )
    if args.dry_run:
        return _print_plan(args, plan, dest)
    manifest = write_archive(
        plan,
        dest,
        bide_version=__version__,
        at=lambda s: faults.fire("archive", s),
        progress=_progress,
    )
    removed = commit_archive(log_dir, manifest, at=lambda s: faults.fire("archive", s))
    return _done(args, manifest, dest, removed, time.monotonic() - started, notes=plan.notes)


def _log_id(log_dir: Path) -> str:
    boundary = read_boundary(log_dir)
    if boundary is not None:
        return boundary.log_id
    line = genesis_line(log_dir)
    if line is None:
        raise UsageError(f"log {log_dir} has no records")
    try:
        return decode_record(line.encode("utf-8")).log
    except (msgspec.DecodeError, ValueError):
        raise UsageError(f"log {log_dir} does not start with a record; run `bide verify`") from None


def _run_database(args: argparse.Namespace) -> int:
    """The log in PostgreSQL: exported read-only to a private directory, archived from
    there; nothing is deleted from the database (see :func:`export_only_reason`)."""
    if not args.verify_key:
        raise UsageError("--dsn needs --verify-key FILE (the verify.pub from `bide keygen`)")
    verify_key = load_verify_key(Path(args.verify_key))
    dest = Path(args.dest)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bide-archive-pg-") as tmp:
        log_dir = Path(tmp) / "log"
        with store_for(args, read_only=True) as store:
            store.require()
            store.export(log_dir)
        plan = plan_archive(
            log_dir, verify_key, parse_before(args.before), writer_live=False, keep_newest=1
        )
        plan.notes.append(export_only_reason())
        if args.dry_run:
            return _print_plan(args, plan, dest)
        if prepare_dest(dest, plan.log_id) is not None:
            raise UsageError(f"DEST {dest} holds an archive already; give a new or empty directory")
        manifest = write_archive(
            plan,
            dest,
            bide_version=__version__,
            source="postgresql",
            removed=False,
            note=export_only_reason(),
            progress=_progress,
        )
    return _done(args, manifest, dest, 0, time.monotonic() - started, notes=plan.notes)


def _print_plan(args: argparse.Namespace, plan: Plan, dest: Path) -> int:
    first, last = plan.segments[0][0], plan.segments[-1][0]
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": True,
                    "dest": str(dest),
                    "log_id": plan.log_id,
                    "segments": [first, last],
                    "records": [plan.first_seq, plan.last_seq],
                    "bytes": plan.bytes,
                    "target_checkpoint": plan.target,
                    "boundary_checkpoint": plan.boundary.checkpoint_seq,
                    "notes": plan.notes,
                }
            )
        )
        return 0
    print(
        f"would archive segments {first}..{last} (records {plan.first_seq}..{plan.last_seq}, "
        f"{plan.bytes} bytes) to {dest}; boundary checkpoint {plan.boundary.checkpoint_seq} "
        f"(the newest signed checkpoint at or before the boundary asked for: {plan.target})"
    )
    for note in plan.notes:
        print(f"note: {note}")
    return 0


def _done(
    args: argparse.Namespace,
    manifest: Manifest,
    dest: Path,
    removed: int,
    seconds: float,
    *,
    resumed: bool = False,
    notes: list[str] | None = None,
) -> int:
    original = sum(e.bytes for e in manifest.segments)
    compressed = sum(e.gz_bytes for e in manifest.segments)
    if args.json:
        print(
            json.dumps(
                {
                    "dest": str(dest),
                    "log_id": manifest.log_id,
                    "segments": [manifest.first_segment, manifest.last_segment],
                    "records": [manifest.first_seq, manifest.last_seq],
                    "boundary_checkpoint": manifest.boundary_checkpoint,
                    "bytes": original,
                    "compressed_bytes": compressed,
                    "removed_segments": removed,
                    "removed_from_source": manifest.removed_from_source,
                    "resumed": resumed,
                    "seconds": round(seconds, 3),
                    "notes": notes or [],
                }
            )
        )
        return 0
    verb = "finished the interrupted archive of" if resumed else "archived"
    print(
        f"{verb} segments {manifest.first_segment}..{manifest.last_segment} (records "
        f"{manifest.first_seq}..{manifest.last_seq}) to {dest}: {original} bytes as "
        f"{compressed} ({original / max(compressed, 1):.1f}x); boundary checkpoint "
        f"{manifest.boundary_checkpoint}; {removed} segment file(s) removed from the live log"
    )
    for note in notes or []:
        print(f"note: {note}")
    return 0
