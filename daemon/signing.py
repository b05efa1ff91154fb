"""Which keys sign the daemon's log, chosen at start-up from the log itself and the config.

    new log, or a format-3 log   forward-secure (``eventlog.epochs``): the root key
                                 (``signing.key``) is needed only to create the log; the
                                 epoch keys live in ``<state_dir>/epochs/``. The state
                                 snapshot is tagged with ``<state_dir>/state.key`` (it keys
                                 nothing else: the snapshot is a cache of the log, not history)
    format-2 log, or             the one ``signing.key`` signs every checkpoint, seals every
    ``[log] forward_secure=false``  write and tags the snapshot, as before

Every signed checkpoint is also recorded in ``<state_dir>/heads.jsonl`` (``eventlog.heads``),
which refuses, on open, a log behind or forking from what was published.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from daemon.config import Config
from eventlog.envelope import FORMAT_SINGLE_KEY, Genesis, decode_record
from eventlog.epochs import EPOCHS_DIR, EpochPolicy, EpochSigning
from eventlog.errors import KeyFileError
from eventlog.fsync import fsync_dir
from eventlog.heads import HEADS_FILE, HeadStore
from eventlog.keys import KEY_BYTES, SIGNING_KEY, VERIFY_KEY, Signer, load_signer, load_verify_key
from eventlog.segments import segment_name
from eventlog.signing import CheckpointSigning

STATE_KEY = "state.key"


@dataclass
class LogSigning:
    """What ``bide run`` hands the supervisor."""

    signing: CheckpointSigning | Signer  # for the writer
    snapshot_signer: Signer  # its MAC key tags the state snapshot
    heads: HeadStore
    warnings: list[tuple[str, dict[str, object]]] = field(default_factory=list)


def _genesis(log_dir: Path) -> Genesis | None:
    """The genesis record of the log at ``log_dir``; None without one (or where it does not
    parse: the writer's open names the damage)."""
    try:
        with (log_dir / segment_name(1)).open("rb") as f:
            first = f.readline(1 << 16)
    except FileNotFoundError:
        return None
    try:
        rec = decode_record(first.rstrip(b"\n"))
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
                f"stay on the host; restore it, or start a new forward-secure log")
        return LogSigning(root, root, heads)
    policy = EpochPolicy(every_checkpoints=config.log.epoch_checkpoints,
                         every_seconds=config.log.epoch_seconds)
    signing = EpochSigning(load_verify_key(keys_dir / VERIFY_KEY),
                           config.state_dir / EPOCHS_DIR, policy=policy, root=root)
    out = LogSigning(signing, state_signer(config.state_dir, create=True), heads)
    if root is not None:
        why = ("it is needed once, to create the log; move it offline after this start"
               if fmt is None else
               "the log exists, so the daemon does not need it: move it offline")
        out.warnings.append((
            "the root signing key is readable on this host: whoever reads it can re-sign the "
            "whole log; " + why + " (keep verify.pub)",
            {"key": keys_dir / SIGNING_KEY}))
    return out


def state_signer(state_dir: Path, *, create: bool = False) -> Signer:
    """The key that tags the state snapshot (``<state_dir>/state.key``, 0600)."""
    path = state_dir / STATE_KEY
    if create and not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)  # its mode is the spool's business
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, base64.b64encode(os.urandom(KEY_BYTES)) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(state_dir)
    try:
        st = path.stat()
        raw = base64.b64decode(path.read_bytes().strip(), validate=True)
    except FileNotFoundError:
        raise KeyFileError(f"{path} does not exist (`bide run` creates it)") from None
    except (OSError, binascii.Error, ValueError):
        raw = b""
        st = None
    if st is not None and stat.S_IMODE(st.st_mode) & 0o077:
        raise KeyFileError(f"{path} is accessible by group or others; fix: chmod 600 {path}")
    if len(raw) != KEY_BYTES:
        raise KeyFileError(f"{path} is not a bide key; delete it and `bide run` makes another "
                           f"(the snapshot is then rebuilt from the log)")
    return Signer(Ed25519PrivateKey.from_private_bytes(raw))


def snapshot_signer(config: Config, keys_dir: Path | None) -> Signer | None:
    """The key the daemon tags its snapshot with, for offline readers; None when neither
    ``state.key`` nor a readable ``signing.key`` is here (then read the whole log)."""
    try:
        if (config.state_dir / STATE_KEY).exists():
            return state_signer(config.state_dir)
        if keys_dir is not None:
            return load_signer(keys_dir)
    except (KeyFileError, OSError):
        return None
    return None
