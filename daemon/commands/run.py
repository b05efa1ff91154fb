"""``bide run``: the daemon."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from daemon import logfmt
from daemon.config import Config, add_config_flag, load_config
from daemon.signing import log_identity, open_signing
from daemon.supervisor import RequestGate, Supervisor
from daemon.witness.publisher import HeadPublisher
from daemon.witness.remote import WitnessUnreachable, heads_held
from eventlog.heads import Head
from eventlog.keys import Signer, keys_directory, load_keyring
from eventlog.store import LineStore


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run the daemon (foreground; systemd Type=notify)",
        description="Run the daemon: take the log, replay it (from the state snapshot in "
        "state_dir when it still matches the log, plus the events after it), poll every live "
        "operation under its contract, ingest the spool. A snapshot is written every [log] "
        "snapshot_every events and at stop. SIGTERM/SIGINT drain and stop with a final "
        "signed checkpoint; SIGHUP reloads provider profiles. New logs are forward-secure: "
        "signing.key (the root key) certifies the first epoch key once, then may go offline "
        "(the daemon warns while it is readable); every signed head goes to [witness].",
        epilog="example:\n  bide run --config /etc/bide/bide.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def witnessed_heads(cfg: Config) -> list[tuple[str, Head]]:
    """The latest head each configured witness holds for the log about to open (file and
    URL witnesses; syslog keeps nothing to ask). One that cannot be asked is named in a
    warning and the daemon starts: a witness being down must not stop the waiting."""
    log_id = log_identity(cfg.log_dir)
    if log_id is None:
        return []
    sources = [str(cfg.witness_file)] if cfg.witness_file is not None else []
    held = []
    for source in [*sources, *cfg.witness.urls]:
        try:
            heads = heads_held(source, log_id, timeout=cfg.witness.timeout_seconds,
                               ca_file=cfg.witness_ca)
        except WitnessUnreachable as exc:
            logfmt.warn("could not ask a witness for the head it holds; the log is checked "
                        "against the heads this daemon recorded only", error=str(exc))
            continue
        if heads:
            held.append((source, max(heads, key=lambda h: h.seq)))
    return held


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if cfg.postgres is not None:
        from daemon.node import run_node  # psycopg only where the log is in PostgreSQL

        return run_node(cfg, build_supervisor)
    anyio.run(build_supervisor(cfg).run)
    return 0


def build_supervisor(cfg: Config, *, store: LineStore | None = None,
                     lease: RequestGate | None = None, ask_witnesses: bool = True
                     ) -> Supervisor:
    """The supervisor of one run (of one term as the active node, with the log in
    PostgreSQL: ``store`` and ``lease``)."""
    keys_dir = keys_directory(cfg.keys_dir)
    chosen = open_signing(cfg, keys_dir)
    for message, fields in chosen.warnings:
        logfmt.warn(message, **fields)
    if ask_witnesses:
        chosen.heads.witnessed = witnessed_heads(cfg)
    publisher = HeadPublisher(cfg.witness, cfg.state_dir, chosen.heads, cfg.witness_file,
                              cfg.witness_ca)
    signing = None if isinstance(chosen.signing, Signer) else chosen.signing
    root = chosen.signing if isinstance(chosen.signing, Signer) else None
    return Supervisor(cfg, load_keyring(keys_dir), root,
                      signing=signing, heads=chosen.heads,
                      publisher=publisher if publisher.enabled else None,
                      store=store, lease=lease)
