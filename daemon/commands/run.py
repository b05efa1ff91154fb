"""``bide run``: the daemon."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from daemon.config import add_config_flag, load_config
from daemon.supervisor import Supervisor
from eventlog.keys import keys_directory, load_keyring, load_signer


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the daemon (foreground; systemd Type=notify)",
        description="Run the daemon: take the log, replay it (from the state snapshot in "
        "state_dir when it still matches the log, plus the events after it), poll every live "
        "operation under its contract, ingest the spool. A snapshot is written every [log] "
        "snapshot_every events and at stop. SIGTERM/SIGINT drain and stop with a final "
        "signed checkpoint; SIGHUP reloads provider profiles.",
        epilog="example:\n  bide run --config /etc/bide/bide.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    keys_dir = keys_directory(cfg.keys_dir)
    supervisor = Supervisor(cfg, load_keyring(keys_dir), load_signer(keys_dir))
    anyio.run(supervisor.run)
    return 0
