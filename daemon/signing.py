"""Which keys sign the daemon's log, chosen at start-up from the log itself and the config.

    new log, or a format-3 log   forward-secure (``eventlog.epochs``): the root key
                                 (``signing.key``) is needed only to create the log; the
                                 epoch keys live in ``<state_dir>/epochs/``. The state
                                 snapshot is tagged with the current epoch key's MAC key
                                 (``daemon.snapshots.SnapshotKeys``), so it evolves with them
    format-2 log, or             the one ``signing.key`` signs every checkpoint, seals every
    ``[log] forward_secure=false``  write and tags the snapshot, as before

With the log in PostgreSQL (``[postgres]``) and ``forward_secure`` (the default), the node is
an *enrolled node* (``eventlog.nodekeys``, ``bide node enroll``): its node key chain, in
``<state_dir>/node/``, signs the checkpoint that starts each of its terms on a log (and the
genesis of a log it creates), certifying the log's next epoch key made on this host. The root
key is never needed on a node. A node keeps no epoch key of a log between terms
(:func:`term_ended`). A log in PostgreSQL made in format 2 keeps its one key, as before.

For a node holding many logs (the shards of ``eventlog.shards``): :func:`open_log_signing` once
per shard log, with that shard's state directory; every shard shares the process's one
:class:`~eventlog.nodekeys.NodeChain` (:func:`node_chain` returns the same one).

Every signed checkpoint is also recorded in ``<state_dir>/heads.jsonl`` (``eventlog.heads``),
which refuses, on open, a log behind or forking from what was published.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from daemon.config import Config
from daemon.snapshots import SnapshotKeys
from eventlog.envelope import FORMAT_SINGLE_KEY, Genesis, decode_record
from eventlog.epochs import EPOCHS_DIR, EpochPolicy, EpochSigning, forget_epoch_keys
from eventlog.errors import KeyFileError
from eventlog.heads import HEADS_FILE, HeadStore
from eventlog.keys import SIGNING_KEY, VERIFY_KEY, Signer, load_signer, load_verify_key
from eventlog.nodekeys import NODE_DIR, NodeChain

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
from eventlog.segments import genesis_bytes


@dataclass
class LogSigning:
    """What ``bide run`` hands the supervisor."""

    signing: EpochSigning | Signer  # for the writer (and, through it, the snapshot's tag)
    heads: HeadStore
    warnings: list[tuple[str, dict[str, object]]] = field(default_factory=list)


def _genesis(log_dir: Path) -> Genesis | None:
    """The genesis record of the log at ``log_dir`` (kept in its archive boundary once its
    first segments are archived); None without one (or where it does not parse: the writer's
    open names the damage)."""
    first = genesis_bytes(log_dir)
    if first is None:
        return None
    try:
        rec = decode_record(first)
    except (msgspec.DecodeError, ValueError):
        return None
    return rec if isinstance(rec, Genesis) else None


def log_format(log_dir: Path) -> int | None:
    """The format the genesis record of the log at ``log_dir`` names; None without one."""
    genesis = _genesis(log_dir)
    return None if genesis is None else genesis.format


def log_identity(log_dir: Path) -> str | None:
    """The id of the log at ``log_dir``; None without one."""
    genesis = _genesis(log_dir)
    return None if genesis is None else genesis.log


def root_readable(keys_dir: Path) -> bool:
    return os.access(keys_dir / SIGNING_KEY, os.R_OK)


def node_name(configured: str) -> str:
    """The node's name as the lease writes it into takeover records (``[postgres] node``, or
    the host name): one short line of plain characters, whatever the config holds."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", configured or socket.gethostname())[:64]


def node_dir(config: Config) -> Path:
    """Where an enrolled node keeps its node keys: ``<state_dir>/node``."""
    return config.state_dir / NODE_DIR


def enrolled_node(config: Config) -> bool:
    """Whether ``bide run`` signs as an enrolled node: the log in PostgreSQL, forward-secure."""
    return config.postgres is not None and config.log.forward_secure


_chains: dict[Path, NodeChain] = {}
_chains_lock = threading.Lock()


def node_chain(config: Config, keys_dir: Path) -> NodeChain:
    """The process's one node key chain (loaded once: every log the node writes shares it).
    Raises :class:`KeyFileError`, naming ``bide node enroll``, when the node is not enrolled."""
    assert config.postgres is not None
    directory = node_dir(config).resolve()
    with _chains_lock:
        chain = _chains.get(directory)
        if chain is None:
            chain = NodeChain(
                directory,
                load_verify_key(keys_dir / VERIFY_KEY),
                node_name(config.postgres.node),
            )
            _chains[directory] = chain
        return chain


def database_log_format(config: Config, settings: PgSettings | None = None) -> int | None:
    """The format of the log in the database (its genesis record; ``settings``, default the
    config's); None when it has none yet, or the database does not answer (``bide run`` then
    names the failure itself)."""
    from daemon.pgconfig import config_settings
    from eventlog.pgstore import PgLogStore

    settings = settings or config_settings(config)
    if settings is None:
        return None
    try:
        with PgLogStore(settings, read_only=True) as store:
            first = store.lines_after(-1, 1)
    except Exception:
        return None
    if not first:
        return None
    try:
        rec = decode_record(first[0].data)
    except (msgspec.DecodeError, ValueError):
        return None
    return rec.format if isinstance(rec, Genesis) else None


def _settings(config: Config) -> PgSettings:
    from daemon.pgconfig import config_settings

    settings = config_settings(config)
    assert settings is not None
    return settings


def database_tail_epochs(settings: PgSettings) -> Callable[[int], list[tuple[int, int]]]:
    """(seq, lease epoch) of the records after a given one, read from the log in the
    database (``settings``' search path: a shard's schema for a shard)."""
    from eventlog.pgstore import connect

    def read(after: int) -> list[tuple[int, int]]:
        with connect(settings, read_only=True) as conn:
            rows = conn.execute(
                "SELECT seq, epoch FROM bide_records WHERE seq > %s ORDER BY seq", (after,)
            ).fetchall()
        return [(int(seq), int(epoch)) for seq, epoch in rows]

    return read


def term_ended(state_dir: Path) -> int:
    """An enrolled node's term on the log kept in ``state_dir`` ended (handed over, fenced,
    or the process starting after a crash): destroy its epoch keys of that log. Its next term
    starts with a takeover signed by the node key, so it never needs them again, and a key
    left behind would let a thief re-sign the epoch the term ended in."""
    return forget_epoch_keys(state_dir / EPOCHS_DIR)


def open_signing(config: Config, keys_dir: Path) -> LogSigning:
    """The signing of the daemon's one log (see :func:`open_log_signing`)."""
    node = log_node(config, keys_dir, config.log_dir)
    return open_log_signing(
        config, keys_dir, state_dir=config.state_dir, log_dir=config.log_dir, node=node
    )


def log_node(
    config: Config, keys_dir: Path, log_dir: Path, settings: PgSettings | None = None
) -> NodeChain | None:
    """The node chain that signs the term starts of the log whose copy is ``log_dir`` (in the
    database ``settings``, default the config's): the process's one chain for an enrolled
    node, None with ``forward_secure = false`` or for a log made in format 2 (its one key)."""
    if not enrolled_node(config):
        return None
    fmt = log_format(log_dir)
    if fmt is None:
        fmt = database_log_format(config, settings)
    return None if fmt == FORMAT_SINGLE_KEY else node_chain(config, keys_dir)


def open_log_signing(
    config: Config,
    keys_dir: Path,
    *,
    state_dir: Path,
    log_dir: Path,
    node: NodeChain | None,
    settings: PgSettings | None = None,
) -> LogSigning:
    """The signing of the log whose local copy is ``log_dir``, its heads and epoch keys in
    ``state_dir`` (a shard's own directory, for a node holding many): forward-secure, signed
    at each term's start by ``node`` when given, or with the one key of a format-2 log.
    ``settings``: the log's database (a shard's, from ``Layout.settings``); default the
    config's."""
    heads = HeadStore(state_dir / HEADS_FILE)
    root = load_signer(keys_dir) if (keys_dir / SIGNING_KEY).exists() else None
    fmt = log_format(log_dir)
    legacy = fmt == FORMAT_SINGLE_KEY or (fmt is None and not config.log.forward_secure)
    if legacy:
        if root is None:
            raise KeyFileError(
                f"{keys_dir / SIGNING_KEY} does not exist: the log at {config.log_dir} is "
                f"signed with one key (format 2, or [log] forward_secure = false), which must "
                f"stay on the host; restore it, or start a new forward-secure log"
            )
        return LogSigning(root, heads)
    policy = EpochPolicy(
        every_checkpoints=config.log.epoch_checkpoints, every_seconds=config.log.epoch_seconds
    )
    signing = EpochSigning(
        load_verify_key(keys_dir / VERIFY_KEY),
        state_dir / EPOCHS_DIR,
        policy=policy,
        root=root,
        node=node,
        tail_epochs=database_tail_epochs(settings or _settings(config))
        if node is not None
        else None,
    )
    out = LogSigning(signing, heads)
    if root is not None and node is not None:
        out.warnings.append(
            (
                "the root signing key is readable on this node: an enrolled node never needs "
                "it (bide node enroll is the one step that does); whoever reads it can re-sign "
                "the whole log: move it offline (keep verify.pub)",
                {"key": keys_dir / SIGNING_KEY},
            )
        )
    elif root is not None:
        why = (
            "it is needed once, to create the log; move it offline after this start"
            if fmt is None
            else "the log exists, so the daemon does not need it: move it offline"
        )
        out.warnings.append(
            (
                "the root signing key is readable on this host: whoever reads it can re-sign the "
                "whole log; " + why + " (keep verify.pub)",
                {"key": keys_dir / SIGNING_KEY},
            )
        )
    return out


def snapshot_keys(config: Config, keys_dir: Path | None) -> SnapshotKeys:
    """The keys an offline reader checks the daemon's snapshot with: the epoch keys in
    ``<state_dir>/epochs/`` (forward-secure logs) or a readable ``signing.key`` (format 2).
    A reader without them (an auditor) reads the whole log."""
    root = None
    if keys_dir is not None:
        with contextlib.suppress(KeyFileError, OSError):
            root = load_signer(keys_dir) if root_readable(keys_dir) else None
    return SnapshotKeys(root=root, epochs_dir=config.state_dir / EPOCHS_DIR)
