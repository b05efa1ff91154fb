"""Which keys sign the daemon's log, chosen at start-up from the log itself and the config.

    new log, or a format-3 log   forward-secure (``eventlog.epochs``): the root key
                                 (``signing.key``) is needed only to create the log; the
                                 epoch keys live in ``<state_dir>/epochs/``. The state
                                 snapshot is tagged with the current epoch key's MAC key
                                 (``daemon.snapshots.SnapshotKeys``), so it evolves with them
    format-2 log, or             the one ``signing.key`` signs every checkpoint, seals every
    ``[log] forward_secure=false``  write and tags the snapshot, as before

Every signed checkpoint is also recorded in ``<state_dir>/heads.jsonl`` (``eventlog.heads``),
which refuses, on open, a log behind or forking from what was published.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from daemon.config import Config
from daemon.snapshots import SnapshotKeys
from eventlog.envelope import FORMAT_SINGLE_KEY, Genesis, decode_record
from eventlog.epochs import EPOCHS_DIR, EpochPolicy, EpochSigning
from eventlog.errors import KeyFileError
from eventlog.heads import HEADS_FILE, HeadStore
from eventlog.keys import SIGNING_KEY, VERIFY_KEY, Signer, load_signer, load_verify_key
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


def open_signing(config: Config, keys_dir: Path) -> LogSigning:
    heads = HeadStore(config.state_dir / HEADS_FILE)
    root = load_signer(keys_dir) if (keys_dir / SIGNING_KEY).exists() else None
    fmt = log_format(config.log_dir)
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
        config.state_dir / EPOCHS_DIR,
        policy=policy,
        root=root,
    )
    out = LogSigning(signing, heads)
    if root is not None:
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
