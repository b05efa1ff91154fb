"""``bide log head``: print the current head, for operators who anchor it elsewhere;
``bide log archive``: move old segments to an archive (:mod:`daemon.commands.archive`);
``bide log init|export|import``: the log in PostgreSQL; ``bide log shards``: who holds each
shard (:mod:`daemon.commands.log_shards`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.commands import archive, log_shards
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.pgconfig import (
    add_dsn_flags,
    add_shard_flag,
    chosen_shards,
    one_shard,
    settings_for,
    sharded_node,
    store_for,
)
from eventlog.keys import VerifyKey, load_verify_key
from eventlog.reader import LogReader
from eventlog.store import file_lines
from eventlog.verify import Report, verify_log

if TYPE_CHECKING:
    from daemon.shardexport import ShardExport
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "log",
        help="log maintenance: `bide log head`, `archive`, and init/export/import/shards for "
        "PostgreSQL",
        description="Inspect the event log without keys.",
        epilog="examples:\n  bide log head --config /etc/bide/bide.toml\n"
        "  bide log head /var/lib/bide/log >> /mnt/worm/bide-anchors   # then verify --anchor\n"
        "  bide log archive --config /etc/bide/bide.toml --before 2026-01-01 /mnt/archive/2025\n"
        "  bide log init --dsn postgresql://admin@db/bide --writer-role bide --reader-role audit\n"
        "  bide log export --dsn postgresql://audit@db/bide ./export && bide verify ./export "
        "--verify-key verify.pub\n"
        "  bide log shards --dsn postgresql://audit@db/bide   # who holds each shard\n"
        "  bide log import /var/lib/bide/log --verify-key verify.pub --dsn postgresql://bide@db/bide",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub2 = p.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    head = sub2.add_parser(
        "head",
        help="print SEQ:HASH of the last complete record",
        description="Print SEQ:HASH of the log's last complete record, to keep elsewhere and "
        "give `bide verify --anchor`. With --dsn or --shard, the head the database holds: a "
        "sharded log's one shard (--shard K, for `bide verify --shard K --anchor`), or a "
        "line per shard.",
    )
    head.add_argument("log_dir", nargs="?", metavar="LOGDIR")
    head.add_argument("--json", action="store_true")
    add_dsn_flags(head, what="the head the database holds instead of LOGDIR's")
    add_shard_flag(head, what="a sharded log in the database: the shard whose head to print")
    add_config_flag(head)
    head.set_defaults(func=run_head)
    archive.add_parser(sub2)
    add_database_parsers(sub2)


def run_head(args: argparse.Namespace) -> int:
    if args.dsn or args.shard is not None:
        return run_database_head(args)
    cfg = None if args.log_dir else load_config(args.config)
    if cfg is not None and sharded_node(cfg):
        return run_database_head(args)
    log_dir = Path(args.log_dir) if cfg is None else cfg.log_dir
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    reader = LogReader(log_dir, from_boundary=True)
    records = reader.poll()
    if not records:
        raise UsageError(f"log {log_dir} has no records")
    head = records[-1]
    if args.json:
        print(json.dumps({"seq": head.seq, "hash": head.hash}))
    else:
        print(f"{head.seq}:{head.hash}")
    return 0


# -- the log in PostgreSQL ---------------------------------------------------------------------


def run_database_head(args: argparse.Namespace) -> int:
    """The head of each chosen shard as the database holds it; one ``SEQ:HASH`` for an
    unsharded log or one shard, else ``shard NNN SEQ:HASH`` a line (``-`` for no record)."""
    from eventlog.pgstore import PgLogStore
    from eventlog.shards import layout_of

    if args.log_dir:
        raise UsageError("give LOGDIR or --dsn/--shard, not both")
    settings = settings_for(args)
    layout = layout_of(settings)
    shards = chosen_shards(layout, args.shard)
    heads: list[tuple[int, tuple[int, str] | None]] = []
    for shard in shards:
        with PgLogStore(layout.settings(settings, shard), read_only=True) as store:
            store.require()
            heads.append((shard, store.head()))
    if len(heads) == 1 and (one_shard(args.shard) or not layout.sharded):
        got = heads[0][1]
        if got is None:
            raise UsageError("the log in the database has no records")
        print(json.dumps({"seq": got[0], "hash": got[1]}) if args.json else f"{got[0]}:{got[1]}")
        return 0
    if args.json:
        print(
            json.dumps(
                {
                    "shards": [
                        {"shard": k, "seq": h[0] if h else None, "hash": h[1] if h else None}
                        for k, h in heads
                    ]
                }
            )
        )
    else:
        for k, h in heads:
            print(f"shard {k:03d} {f'{h[0]}:{h[1]}' if h else '-'}")
    return 0


def add_database_parsers(sub2: Any) -> None:
    init = sub2.add_parser(
        "init",
        help="create or upgrade the log's tables in PostgreSQL (bide_*)",
        description="Create the bide_ tables in the DSN's search path, or upgrade them to this "
        "version's schema; idempotent. Optionally grant the daemons' role what a node needs "
        "(SELECT, and EXECUTE on the functions that append and keep the lease, which check the "
        "epoch and the chain: never INSERT or UPDATE) and an auditor's role SELECT. Run it as "
        "the role that should own the tables, never as the daemons' role: any write privilege "
        "another role holds on them is taken back.",
    )
    add_dsn_flags(init)
    init.add_argument(
        "--writer-role",
        metavar="ROLE",
        help="grant the daemons' role (the role in each node's dsn)",
    )
    init.add_argument("--reader-role", metavar="ROLE", help="grant an auditor's read-only role")
    init.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="split the log into N shards (each its own schema, chain, lease and epoch) so "
        "that several nodes are active at once; fixed once made (16 suits 2-8 nodes)",
    )
    add_config_flag(init)
    init.set_defaults(func=run_init)

    export = sub2.add_parser(
        "export",
        help="write the database's log as segment files (byte-identical)",
        description="Write every record in the database to segment files in DIR, byte for byte "
        "as the file store writes them: `bide verify DIR --verify-key verify.pub` then checks "
        "them with no database. Needs only SELECT (an auditor's read-only role). A sharded "
        "log is written one directory per shard, DIR/shard-007/ (each a log of its own), "
        "with DIR/shards.json naming them: `bide verify DIR` then checks every shard; "
        "--shard K writes shard K alone into DIR itself.",
    )
    export.add_argument("out_dir", metavar="DIR", help="an empty or new directory")
    add_dsn_flags(export)
    add_shard_flag(export, what="a sharded log: the shard to export into DIR itself")
    add_config_flag(export)
    export.set_defaults(func=run_export)

    imp = sub2.add_parser(
        "import",
        help="move a file log into an empty database log, chain intact",
        description="Verify LOGDIR with the public key, then copy its records, byte for byte, "
        "into the database (which must be initialized and empty, with no daemon holding it). "
        "Into a sharded log: a sharded export (a directory with shards.json, as `bide log "
        "export` writes it) goes back shard by shard into a log of the same count, every "
        "shard verified before any is copied; one shard's directory goes into --shard K.",
    )
    imp.add_argument("log_dir", metavar="LOGDIR")
    imp.add_argument(
        "--verify-key",
        metavar="FILE",
        required=True,
        help="verify.pub: the log is verified before anything is copied",
    )
    add_dsn_flags(imp)
    add_shard_flag(imp, what="a sharded log: the shard to import one shard's directory into")
    add_config_flag(imp)
    imp.set_defaults(func=run_import)
    log_shards.add_parser(sub2)


def run_init(args: argparse.Namespace) -> int:
    if args.shards is not None:
        return _init_sharded(args)
    with store_for(args) as store:
        before, after = store.init(reader=args.reader_role, writer=args.writer_role)
        unfenced = store.unfenced(args.writer_role) if args.writer_role else None
    if before is None:
        print(f"created the bide schema, version {after}")
    elif before == after:
        print(f"the bide schema is at version {after}; nothing to upgrade")
    else:
        print(f"upgraded the bide schema from version {before} to {after}")
    if unfenced:
        print(
            f"warning: {unfenced}: the database cannot fence the daemons under it (their "
            f"statements are not limited to the checked functions); give the daemons a "
            f"role of their own, as in the deploy guide's section on PostgreSQL",
            file=sys.stderr,
        )
    return 0


def _init_sharded(args: argparse.Namespace) -> int:
    from eventlog.shards import init_sharded

    settings = settings_for(args)
    layout, versions = init_sharded(
        settings, args.shards, reader=args.reader_role, writer=args.writer_role
    )
    made = sum(1 for before, _ in versions if before is None)
    after = versions[0][1]
    print(
        f"{layout.count} shard(s) in schema {layout.base}: {made} created, "
        f"{layout.count - made} already there, all at bide schema version {after}"
    )
    if args.writer_role:
        from eventlog.pgstore import PgLogStore

        with PgLogStore(layout.settings(settings, 0)) as shard0:
            unfenced = shard0.unfenced(args.writer_role)
        if unfenced:
            print(
                f"warning: {unfenced}: the database cannot fence the daemons under it; give "
                f"the daemons a role of their own (deploy guide, PostgreSQL)",
                file=sys.stderr,
            )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from eventlog.shards import layout_of

    out = Path(args.out_dir)
    settings = settings_for(args)
    layout = layout_of(settings)
    shards = chosen_shards(layout, args.shard)
    if layout.sharded and not one_shard(args.shard):
        from daemon.shardexport import export_shards, shard_dir_name

        counts = export_shards(settings, layout, shards, out)
        for shard, n in counts.items():
            print(f"shard {shard:03d}: wrote {n} records to {out / shard_dir_name(shard)}")
        print(
            f"wrote {sum(counts.values())} records of {layout.count} shards to {out} "
            f"(index: {out / 'shards.json'})"
        )
        return 0
    from eventlog.pgstore import PgLogStore

    with PgLogStore(layout.settings(settings, shards[0]), read_only=True) as store:
        store.require()
        n = store.export(out)
    which = f" of shard {shards[0]}" if layout.sharded else ""
    print(f"wrote {n} records{which} to {out}")
    return 0


def _clean(log_dir: Path, verify_key: VerifyKey) -> Report:
    report = verify_log(log_dir, verify_key)
    if report.damage is not None or report.torn is not None or report.writer_live:
        raise UsageError(
            f"{log_dir} is not a clean, closed log ({report.summary()}); run "
            f"`bide verify {log_dir}` and stop its daemon first: nothing copied"
        )
    return report


def run_import(args: argparse.Namespace) -> int:
    from daemon.shardexport import read_export
    from eventlog.pgstore import PgLogStore
    from eventlog.shards import layout_of

    log_dir = Path(args.log_dir)
    if not log_dir.is_dir():
        raise UsageError(f"log directory {log_dir} does not exist")
    verify_key = load_verify_key(Path(args.verify_key))
    settings = settings_for(args)
    layout = layout_of(settings)
    export = read_export(log_dir)
    if export is not None:
        return _import_shards(args, export, layout, settings, verify_key)
    shards = chosen_shards(layout, args.shard)
    if layout.sharded and not one_shard(args.shard):
        raise UsageError(
            f"the log in schema {layout.base} is sharded ({layout.count} shards): import a "
            f"sharded export (a directory with shards.json), or one shard's directory with "
            f"--shard K"
        )
    report = _clean(log_dir, verify_key)
    with PgLogStore(layout.settings(settings, shards[0])) as store:
        store.require()
        n = store.import_lines(file_lines(log_dir))
    into = f" into shard {shards[0]}" if layout.sharded else ""
    print(f"imported {n} records{into} (head {report.head_seq}:{report.head_hash})")
    return 0


def _import_shards(
    args: argparse.Namespace,
    export: ShardExport,
    layout: Layout,
    settings: PgSettings,
    verify_key: VerifyKey,
) -> int:
    """A sharded export back into an initialized sharded log of the same count: every
    exported shard verified first (nothing copied if one is not clean), then each copied
    into its own shard."""
    from eventlog.pgstore import PgLogStore

    if one_shard(args.shard):
        raise UsageError(
            f"{export.root} is a sharded export: import it whole, or give --shard K one "
            f"shard's directory ({export.root}/shard-007)"
        )
    if layout.count != export.count:
        raise UsageError(
            f"{export.root} holds an export of {export.count} shard(s) but the log in schema "
            f"{layout.base} has {layout.count}: make it with `bide log init --shards "
            f"{export.count}` (a shard's records stay in their shard): nothing copied"
        )
    reports = {k: _clean(d, verify_key) for k, d in export.dirs.items() if _has_segments(d)}
    for shard, report in reports.items():
        with PgLogStore(layout.settings(settings, shard)) as store:
            store.require()
            n = store.import_lines(file_lines(export.dirs[shard]))
        print(
            f"shard {shard:03d}: imported {n} records (head {report.head_seq}:{report.head_hash})"
        )
    print(f"imported {len(reports)} shard(s) of {layout.count}")
    return 0


def _has_segments(log_dir: Path) -> bool:
    return any(p.name.startswith("seg-") for p in log_dir.iterdir())
