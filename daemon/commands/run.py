"""``bide run``: the daemon."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from daemon import logfmt
from daemon.config import Config, add_config_flag, load_config
from daemon.errors import ConfigError, UsageError
from daemon.interpreter_access import interpreter_unreachable_by_others
from daemon.signing import log_identity, log_node, open_log_signing, open_signing
from daemon.supervisor import RequestGate, Supervisor
from daemon.witness.publisher import HeadPublisher
from daemon.witness.remote import (
    WitnessUnreachable,
    believed,
    pinned_keys,
    shown,
    witnessed,
)
from daemon.witness.service import TrustError, read_token
from eventlog.headchain import Proof, chain_proof, genesis_line, log_proof
from eventlog.heads import Head
from eventlog.keys import VERIFY_KEY, Signer, keys_directory, load_keyring, load_verify_key
from eventlog.store import LineStore

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings


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
        epilog="examples:\n  bide run --config /etc/bide/bide.toml\n"
        "  bide run --config /etc/bide/bide.toml --log-level debug   # overrides [log] level\n"
        "  bide run --check --config /etc/bide/bide.toml   # check it all, start nothing",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.add_argument(
        "--log-level",
        choices=logfmt.LEVELS,
        metavar="LEVEL",
        help="write log lines at LEVEL and above: debug, info, warning or error "
        "(default: the config's [log] level, else info)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the config, every profile, the keys, the store and the witnesses, print "
        "what was found and every problem (file:line and the fix), and exit: 0 when all is "
        "well, 78 (EX_CONFIG) otherwise; writes nothing",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="with --check: the report as JSON (ok, config, found, problems: file, line, "
        "key, message, fix; warnings)",
    )
    p.set_defaults(func=run)


def witnessed_heads(cfg: Config, keys_dir: Path) -> list[tuple[str, Head]]:
    """The latest head each configured witness holds for the log about to open (file and
    URL witnesses; syslog keeps nothing to ask), once it verifies from verify.pub (and the
    pinned witness keys). One that cannot be asked is named in a warning, one that returns a
    head that does not verify is named in an error (a lying witness), and the daemon starts:
    neither a witness being down nor its word alone may stop the waiting."""
    log_id = log_identity(cfg.log_dir)
    genesis = genesis_line(cfg.log_dir) if log_id is not None else None
    if log_id is None or genesis is None:
        return []
    root = load_verify_key(keys_dir / VERIFY_KEY).raw
    pinned = witness_keys(cfg)
    sources = [str(cfg.witness_file)] if cfg.witness_file is not None else []
    held = []
    for source in [*sources, *cfg.witness.urls]:
        try:
            answer = witnessed(
                source, log_id, timeout=cfg.witness.timeout_seconds, ca_file=cfg.witness_ca
            )
        except WitnessUnreachable as exc:
            logfmt.warn(
                "could not ask a witness for the head it holds; the log is checked "
                "against the heads this daemon recorded only",
                error=str(exc),
            )
            continue
        heads, lies = believed(answer, root, genesis, pinned)
        for lie in lies:
            logfmt.error(
                "a witness returned a head that does not verify: it lies or was "
                "tampered with, and its word is ignored (witness_lied)",
                witness=shown(lie.source),
                head=f"{lie.head.seq}:{lie.head.hash}",
                reason=lie.reason,
            )
        if heads:
            held.append((source, max(heads, key=lambda h: h.seq)))
    return held


def witness_keys(cfg: Config) -> dict[str, bytes] | None:
    """The pinned witness keys ([witness] witness_keys), or None when none are pinned."""
    if not cfg.witness.witness_keys:
        return None
    try:
        return pinned_keys(cfg.witness.witness_keys)
    except ValueError as exc:
        raise ConfigError(
            f"{cfg.where('witness', 'witness_keys')}: witness.witness_keys: {exc}"
        ) from None


def witness_token(cfg: Config) -> bytes | None:
    """The publisher's token ([witness] token_file); required when urls are configured."""
    if cfg.witness_token is None:
        if cfg.witness.urls:
            raise ConfigError(
                f"{cfg.where('witness', 'urls')}: witness.urls: urls need token_file, the "
                f"secret the witness knows this log's publisher by (create it 0600 with "
                f"`bide witness token --out FILE` and put the same file in the witness's "
                f"trust directory)"
            )
        return None
    try:
        return read_token(cfg.witness_token)
    except TrustError as exc:
        raise ConfigError(
            f"{cfg.where('witness', 'token_file')}: witness.token_file: {exc}"
        ) from None


def proof_source(cfg: Config, store: LineStore | None) -> Callable[[int], Proof]:
    """What a witness needs on first contact, read from the log (segment files or the
    database): the genesis record and the key certificates before a head."""

    if store is None:
        return lambda before: log_proof(cfg.log_dir, before)

    def lines() -> Iterator[bytes]:
        assert store is not None
        seq = -1
        while page := store.lines_after(seq, 10_000):
            for line in page:
                yield line.data
            seq = page[-1].seq

    return lambda before: chain_proof(lines(), before)


def run(args: argparse.Namespace) -> int:
    if args.check:
        from daemon.preflight import run_check

        return run_check(args)
    if args.json:
        raise UsageError("--json goes with --check (bide run --check --json)")
    cfg = load_config(args.config)
    level = args.log_level or cfg.log.level
    logfmt.set_level(level)
    logfmt.debug("config loaded", config=cfg.path, log_level=level, log=cfg.log_dir)
    unreachable = interpreter_unreachable_by_others()
    if unreachable is not None:
        logfmt.warn(unreachable)
    if cfg.postgres is not None:
        # psycopg only where the log is in PostgreSQL
        from daemon.node import check_profiles_fit, run_node
        from daemon.pgconfig import config_settings
        from eventlog.shards import layout_of

        settings = config_settings(cfg)
        assert settings is not None
        check_profiles_fit(cfg)  # a profile that could never be sent is named before connecting
        layout = layout_of(settings)
        if layout.sharded:
            from daemon.shards.runtime import run_shard_node

            return run_shard_node(cfg, build_supervisor, layout)
        return run_node(cfg, build_supervisor)
    anyio.run(build_supervisor(cfg).run)
    return 0


def build_supervisor(
    cfg: Config,
    *,
    store: LineStore | None = None,
    lease: RequestGate | None = None,
    ask_witnesses: bool = True,
    edges: bool = True,
    log_settings: PgSettings | None = None,
    node_config: Config | None = None,
    **extra: Any,
) -> Supervisor:
    """The supervisor of one run (of one term as the active node, with the log in
    PostgreSQL: ``store`` and ``lease``). For one shard of a sharded node: ``edges`` False,
    ``log_settings`` the shard's database, ``node_config`` the node's own config (its node
    key chain is the node's, its state the shard's), and ``extra`` the node's
    ``supervisor_kwargs``, passed to the supervisor."""
    keys_dir = keys_directory(cfg.keys_dir)
    if log_settings is None:
        chosen = open_signing(cfg, keys_dir)
    else:  # one shard of a sharded node: its own state, the node's one node key chain
        node = log_node(node_config or cfg, keys_dir, cfg.log_dir, log_settings)
        chosen = open_log_signing(
            cfg,
            keys_dir,
            state_dir=cfg.state_dir,
            log_dir=cfg.log_dir,
            node=node,
            settings=log_settings,
        )
    for message, fields in chosen.warnings:
        logfmt.warn(message, **fields)
    token = witness_token(cfg)
    if ask_witnesses:
        chosen.heads.witnessed = witnessed_heads(cfg, keys_dir)
    publisher = HeadPublisher(
        cfg.witness,
        cfg.state_dir,
        chosen.heads,
        cfg.witness_file,
        cfg.witness_ca,
        token=token,
        proof_for=proof_source(cfg, store),
    )
    signing = None if isinstance(chosen.signing, Signer) else chosen.signing
    root = chosen.signing if isinstance(chosen.signing, Signer) else None
    return Supervisor(
        cfg,
        load_keyring(keys_dir),
        root,
        signing=signing,
        heads=chosen.heads,
        publisher=publisher if publisher.enabled else None,
        store=store,
        lease=lease,
        edges=edges,
        **extra,
    )
