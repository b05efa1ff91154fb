"""Forward-secure checkpoint signing: epoch keys that evolve and forget their past.

The root key (``signing.key``, whose public half is ``verify.pub``) signs one thing per log:
the genesis record, which certifies the public key of epoch 1. From then on the daemon signs
checkpoints with the current *epoch key*. At an epoch boundary (every ``every_checkpoints``
checkpoints or ``every_seconds`` seconds, whichever comes first) it:

    1. creates the next key pair and writes its private half, durably, to the state directory;
    2. writes a checkpoint signed by the current key that certifies the next public key
       (``next_key``) and waits until it is durable;
    3. destroys the old private key: overwrites the file, fsyncs it, unlinks it, fsyncs the
       directory.

``bide verify`` follows the chain root -> epoch 1 -> epoch 2 ... with ``verify.pub`` alone.
Whoever steals the current key (epoch *n*) can sign checkpoints of epoch *n* and later only:
every checkpoint before the boundary that certified epoch *n* was signed by a key that no
longer exists, so history up to that boundary cannot be re-signed. The limit: records of the
current epoch -- the unsigned tail and anything signed with the stolen key since the last
boundary -- are the thief's to rewrite; witnesses (``eventlog.heads``) bound that.

Files, in ``<state_dir>/epochs/`` (0700; never in the log directory):
    <log id>-epoch-<n>.key   one JSON line {"log", "epoch", "seed"}: the private key of epoch n
                             of that log, 0600. One file per log in the steady state; two for a
                             moment during a rotation (the open reconciles after a crash).

With the log in PostgreSQL, where any enrolled node may take the log over, a node that opens
a log does not continue the previous holder's epoch key (it may be on a dead host): it makes the
next epoch's key and signs the checkpoint that certifies it (its takeover) with its own *node
key* (:mod:`eventlog.nodekeys`), whose chain the root certified once at enrolment. The log's
chain then goes on from that key exactly as above. A log such a node creates has its genesis
signed the same way, so the root key is never needed on a node.

Overwriting a file does not guarantee that a copy-on-write file system or an SSD's flash
translation layer forgets the old blocks; the operator's guide (deploy/README.md) says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from eventlog.envelope import (
    FORMAT_SINGLE_KEY,
    FORMAT_VERSION,
    ZERO_HASH,
    Checkpoint,
    Genesis,
    NodeCert,
    NodeLink,
    Takeover,
    checkpoint_message_v2,
    genesis_message_v3,
    takeover_fields,
)
from eventlog.errors import DamagedLogError, KeyFileError
from eventlog.fsync import fsync_dir
from eventlog.keys import Signer, VerifyKey, read_seed_file
from eventlog.position import LogPosition
from eventlog.signing import CheckpointSigning, SingleKey, b64

if TYPE_CHECKING:
    from eventlog.nodekeys import NodeChain
    from eventlog.verify import Report

EPOCHS_DIR = "epochs"
DEFAULT_EPOCH_SECONDS = 3600.0
_NAME_RE = re.compile(r"^([0-9a-f]{32})-epoch-(\d{8,})\.key$")


@dataclass(frozen=True)
class EpochPolicy:
    """When an epoch ends: after ``every_checkpoints`` checkpoints (0: never by count) or
    ``every_seconds`` seconds, whichever comes first."""

    every_checkpoints: int = 0
    every_seconds: float = DEFAULT_EPOCH_SECONDS


class _KeyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    log: str
    epoch: int
    seed: str


def epoch_key_name(log_id: str, epoch: int) -> str:
    return f"{log_id}-epoch-{epoch:08d}.key"


def _public_b64(signer: Signer) -> str:
    return b64(signer.public_bytes)


def write_epoch_key(directory: Path, log_id: str, epoch: int, private: Ed25519PrivateKey) -> Path:
    """Write an epoch's private key durably (0600, fsync, directory fsync); returns the path.
    A leftover file of the same name (a key never certified) is destroyed first."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / epoch_key_name(log_id, epoch)
    if path.exists():
        destroy_key_file(path)
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    data = msgspec.json.encode(_KeyFile(log_id, epoch, b64(seed))) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)
    fsync_dir(directory)
    return path


def read_epoch_key(path: Path) -> tuple[str, int, Signer]:
    """(log id, epoch, signer) of an epoch key file; errors name the file, never the key."""
    kf, signer = read_seed_file(path, "epoch key", _KeyFile)
    return kf.log, kf.epoch, signer


def destroy_key_file(path: Path) -> None:
    """Overwrite with zeros, fsync, unlink, fsync the directory."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        os.write(fd, b"\0" * max(size, 1))
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fsync_dir(path.parent)


def epoch_key_files(directory: Path, log_id: str) -> list[tuple[int, Path]]:
    """This log's epoch key files, by epoch."""
    if not directory.is_dir():
        return []
    out = []
    for path in directory.iterdir():
        m = _NAME_RE.match(path.name)
        if m and m.group(1) == log_id:
            out.append((int(m.group(2)), path))
    return sorted(out)


def epoch_signer_at(directory: Path, position: LogPosition) -> Signer | None:
    """The key of the epoch ``position`` names, if this host still holds it: its file in
    ``directory`` names the same log and epoch and holds the public key the position records.
    None when it does not (destroyed when the epoch ended, never here, or another key)."""
    path = directory / epoch_key_name(position.log_id, position.epoch)
    if position.format != FORMAT_VERSION or not path.exists():
        return None
    try:
        log, epoch, signer = read_epoch_key(path)
    except KeyFileError:
        return None
    if (log, epoch, _public_b64(signer)) != (position.log_id, position.epoch, position.epoch_key):
        return None
    return signer


def forget_epoch_keys(directory: Path, log_id: str | None = None) -> int:
    """Destroy the epoch keys in ``directory`` (of ``log_id``, or of every log). A node whose
    term on a log ended keeps no key of it: its next term starts with a takeover signed by its
    node key, and a key left behind would let a thief re-sign the log's epoch in which this
    node's term ended. Returns how many keys were destroyed."""
    if not directory.is_dir():
        return 0
    n = 0
    for path in sorted(directory.iterdir()):
        m = _NAME_RE.match(path.name)
        if m and (log_id is None or m.group(1) == log_id):
            destroy_key_file(path)
            n += 1
    return n


@dataclass
class _State:
    signer: Signer | None
    path: Path | None
    epoch: int
    t_us: int
    checkpoints: int
    cert_seq: int = 0  # the record that certified the key (0: the genesis record)


class EpochSigning(CheckpointSigning):
    """Format 3 signing (see the module docstring). A format-2 log opened with it is signed
    the old way, with the root key, which must then be on the host."""

    def __init__(
        self,
        verify_key: VerifyKey,
        key_dir: Path,
        *,
        policy: EpochPolicy | None = None,
        root: Signer | None = None,
        node: NodeChain | None = None,
        tail_epochs: Callable[[int], list[tuple[int, int]]] | None = None,
    ) -> None:
        self.verify_key = verify_key
        self.key_dir = key_dir
        self.policy = policy or EpochPolicy()
        self._root = root
        #: An enrolled node's key chain: this log is opened by a node that takes it over
        #: (see the module docstring); None on one host.
        self.node = node
        #: The next epoch's key, made on open by a node, until the checkpoint signed with the
        #: node key certifies it (its takeover); None otherwise.
        self._next: tuple[Signer, Path] | None = None
        self._pending_key = ""  # the log's current epoch key (public) while _next waits
        #: (seq, lease epoch it was committed under) of the records after a given one, from
        #: the database: a node checks the tail it is about to sign over (see opened()).
        self.tail_epochs = tail_epochs
        self._next_taken: tuple[Signer, Path] | None = None  # _next, until its write is durable
        self._legacy: SingleKey | None = None
        self._log_id = ""
        self._s = _State(None, None, 0, 0, 0)
        self._before: _State | None = None  # the state before an uncommitted write
        self._destroy: list[Path] = []  # old keys to destroy once that write is durable
        #: Seconds spent creating, storing and destroying epoch keys (for the benchmark).
        self.rotation_seconds = 0.0
        self.rotations = 0

    # -- what the writer reads ----------------------------------------------------------------

    @property
    def format(self) -> int:
        return FORMAT_VERSION

    @property
    def legacy(self) -> bool:
        """The log opened is format 2: signed with the root key, no epochs."""
        return self._legacy is not None

    @property
    def mac_key(self) -> bytes:
        if self._legacy is not None:
            return self._legacy.mac_key
        if self._next is not None and self._s.signer is None:
            return self._next[0].mac_key  # seals written before the takeover checkpoint
        return self._current().mac_key

    @property
    def seals_checkable(self) -> bool:
        """Whether this host can check the seals of the log's current epoch: not a node that
        takes over a log whose epoch key is on another host (it adopts the chained tail the
        database committed under the previous holder's term; eventlog/AUDIT.md)."""
        return self._legacy is not None or self._s.signer is not None

    @property
    def epoch(self) -> int:
        return self._s.epoch

    @property
    def epoch_key(self) -> str:
        if self._s.signer is None:
            return self._pending_key
        return _public_b64(self._s.signer)

    def snapshot_key(self, position: LogPosition) -> bytes | None:
        """The key that tags a state snapshot at ``position``: the seal MAC key of the epoch
        in force, when ``position`` names that epoch and its key (a snapshot of an earlier
        epoch has none: its key is destroyed, so whoever keeps a copy of it cannot tag one).
        A format-2 log's: the root key's."""
        if self._legacy is not None:
            return self._legacy.mac_key if position.format != FORMAT_VERSION else None
        signer = self._s.signer
        if (
            signer is None
            or position.log_id != self._log_id
            or (position.epoch, position.epoch_key) != (self._s.epoch, self.epoch_key)
        ):
            return None
        return signer.mac_key

    def stamp(self, position: LogPosition) -> LogPosition:
        if self._legacy is not None:
            return self._legacy.stamp(position)
        s = self._s
        return msgspec.structs.replace(
            position,
            format=FORMAT_VERSION,
            epoch=s.epoch,
            epoch_key=self.epoch_key,
            epoch_cert_seq=s.cert_seq,
            epoch_t_us=s.t_us,
            epoch_checkpoints=s.checkpoints,
        )

    def _current(self) -> Signer:
        if self._s.signer is None:
            raise KeyFileError("no epoch key is loaded: the log was not opened")
        return self._s.signer

    # -- creating and opening ------------------------------------------------------------------

    def genesis(self, log_id: str, t_us: int, checkpoint_every: int) -> Genesis:
        """The genesis of a new log: its first epoch key made and certified, by the enrolled
        node's key where there is one, else by the root key (which must then be here)."""
        if self.node is None and self._root is None:
            raise KeyFileError(
                "creating a new log needs the root signing key (signing.key): it certifies the "
                "log's first epoch key in the genesis record, once. Make it readable for the "
                "first start, then move it offline (see deploy/README.md)"
            )
        first = Ed25519PrivateKey.generate()
        path = write_epoch_key(self.key_dir, log_id, 1, first)
        signer = Signer(first)
        node, root = self.node, self._root
        cert: NodeCert | None = None
        links: tuple[NodeLink, ...] = ()
        if node is not None:
            fp = self.verify_key.fingerprint
            msg = genesis_message_v3(log_id, fp, t_us, checkpoint_every, signer.public_bytes)
            sig, cert, links = node.sign(msg)
        else:
            assert root is not None
            fp = root.fingerprint
            msg = genesis_message_v3(log_id, fp, t_us, checkpoint_every, signer.public_bytes)
            sig = root.sign(msg)
        self._log_id, self._legacy, self._next = log_id, None, None
        self._s = _State(signer, path, 1, t_us, 0)
        return Genesis(
            0,
            ZERO_HASH,
            FORMAT_VERSION,
            log_id,
            fp,
            t_us,
            checkpoint_every,
            b64(sig),
            _public_b64(signer),
            cert=cert,
            links=links,
        )

    def opened(self, log_dir: Path, report: Report) -> None:
        self._before, self._destroy, self._next, self._next_taken = None, [], None, None
        self._log_id = report.log_id
        if report.format == FORMAT_SINGLE_KEY:
            if self._root is None:
                raise KeyFileError(
                    f"log {log_dir} is format 2 (one signing key, before forward-secure "
                    f"checkpoints): it can be continued only with signing.key, which is not "
                    f"readable here. Restore signing.key, or move the log aside and start a "
                    f"new one"
                )
            self._legacy = SingleKey(self._root)
            return
        self._legacy = None
        want_epoch, want_key = report.epoch, report.epoch_key
        if self.node is not None:
            self._open_for_takeover(report)
            return
        found: tuple[Signer, Path] | None = None
        for epoch, path in epoch_key_files(self.key_dir, report.log_id):
            log, file_epoch, signer = read_epoch_key(path)
            if (
                found is None
                and file_epoch == epoch == want_epoch
                and log == report.log_id
                and _public_b64(signer) == want_key
            ):
                found = (signer, path)
            else:  # an earlier epoch's key (a crash before it was destroyed), or uncertified
                destroy_key_file(path)
        if found is None:
            cert = (
                "the genesis record"
                if report.epoch_cert_seq == 0
                else f"checkpoint {report.epoch_cert_seq}"
            )
            raise KeyFileError(
                f"log {log_dir} is in epoch {want_epoch} (its key certified by {cert}), but "
                f"{self.key_dir / epoch_key_name(report.log_id, want_epoch)} is missing or "
                f"holds another key; only that key can sign the log's next checkpoint. "
                f"Restore the state directory's epochs/ from where it was, or move the log "
                f"aside and start a new one"
            )
        self._s = _State(
            found[0],
            found[1],
            want_epoch,
            report.epoch_t_us,
            report.epoch_checkpoints,
            report.epoch_cert_seq,
        )

    def _open_for_takeover(self, report: Report) -> None:
        """A node opens the log to take it over: the next epoch's key is made now, certified by
        the first checkpoint (signed with the node key). The current epoch's key, if this host
        still has it, only checks the seals of the tail and is destroyed with the takeover."""
        self._check_tail(report)
        held = None
        for epoch, path in epoch_key_files(self.key_dir, report.log_id):
            log, file_epoch, signer = read_epoch_key(path)
            if (
                held is None
                and file_epoch == epoch == report.epoch
                and log == report.log_id
                and _public_b64(signer) == report.epoch_key
            ):
                held = (signer, path)
            else:
                destroy_key_file(path)
        new = Ed25519PrivateKey.generate()
        path = write_epoch_key(self.key_dir, report.log_id, report.epoch + 1, new)
        self._next = (Signer(new), path)
        self._pending_key = report.epoch_key
        self._s = _State(
            held[0] if held else None,
            held[1] if held else None,
            report.epoch,
            report.epoch_t_us,
            report.epoch_checkpoints,
            report.epoch_cert_seq,
        )

    def _check_tail(self, report: Report) -> None:
        """Refuse to sign over records after the last checkpoint that were not committed under
        the lease epoch of the last signed takeover. This node cannot check their seals (the
        MAC key is the previous holder's epoch key, on its host), but only the node holding
        that epoch could write in it; records under an epoch no signed takeover names were
        written by something else holding the nodes' database role."""
        if self.tail_epochs is None:
            return
        after = report.last_checkpoint_seq or 0
        foreign = [(seq, e) for seq, e in self.tail_epochs(after) if e != report.lease_epoch]
        if foreign:
            first, epoch = foreign[0]
            raise DamagedLogError(
                f"log {report.log_id}: record {first} (after the last checkpoint, {after}) was "
                f"committed under lease epoch {epoch}, which no signed takeover record names "
                f"(the last names epoch {report.lease_epoch}): it was written by something "
                f"other than the bide node holding the log, with the nodes' database role. "
                f"Refusing to sign over it; inspect the log with `bide verify --dsn`"
            )

    def _node_checkpoint(
        self,
        log_id: str,
        seq: int,
        head: str,
        t_us: int,
        prev_cp: str,
        final: bool,
        takeover: Takeover | None,
    ) -> Checkpoint:
        """The first checkpoint of a node's term: signed by its node key, it certifies the
        next epoch's key (made on open) and carries the node's certificate and key chain."""
        assert self.node is not None
        assert self._next is not None
        if self._before is None:
            self._before = _State(**vars(self._s))
        epoch = self._s.epoch
        new_signer, path = self._next
        next_key = new_signer.public_bytes
        msg = checkpoint_message_v2(
            log_id, seq, head, t_us, prev_cp, final, epoch, next_key, takeover
        )
        sig, cert, links = self.node.sign(msg)
        if self._s.path is not None:
            self._destroy.append(self._s.path)
        self._s = _State(new_signer, path, epoch + 1, t_us, 0, seq)
        self._next_taken = self._next
        self._next = None
        return Checkpoint(
            seq,
            head,
            log_id,
            t_us,
            prev_cp,
            final,
            b64(sig),
            epoch,
            b64(next_key),
            cert=cert,
            links=links,
            **takeover_fields(takeover),
        )

    # -- signing -------------------------------------------------------------------------------

    def _due(self, t_us: int) -> bool:
        p = self.policy
        if p.every_checkpoints and self._s.checkpoints + 1 >= p.every_checkpoints:
            return True
        return p.every_seconds > 0 and t_us - self._s.t_us >= p.every_seconds * 1e6

    def checkpoint(
        self,
        log_id: str,
        seq: int,
        head: str,
        t_us: int,
        prev_cp: str,
        final: bool,
        *,
        may_rotate: bool = True,
        takeover: Takeover | None = None,
    ) -> Checkpoint:
        if self._legacy is not None:
            return self._legacy.checkpoint(
                log_id, seq, head, t_us, prev_cp, final, takeover=takeover
            )
        if self._next is not None:
            return self._node_checkpoint(log_id, seq, head, t_us, prev_cp, final, takeover)
        signer = self._current()
        if self._before is None:
            self._before = _State(**vars(self._s))
        epoch = self._s.epoch
        next_key = b""
        if may_rotate and self._due(t_us):
            started = time.perf_counter()
            new = Ed25519PrivateKey.generate()
            path = write_epoch_key(self.key_dir, log_id, epoch + 1, new)
            new_signer = Signer(new)
            next_key = new_signer.public_bytes
            if self._s.path is not None:
                self._destroy.append(self._s.path)
            self._s = _State(new_signer, path, epoch + 1, t_us, 0, seq)
            self.rotation_seconds += time.perf_counter() - started
            self.rotations += 1
        else:
            self._s.checkpoints += 1
        msg = checkpoint_message_v2(
            log_id, seq, head, t_us, prev_cp, final, epoch, next_key, takeover
        )
        return Checkpoint(
            seq,
            head,
            log_id,
            t_us,
            prev_cp,
            final,
            b64(signer.sign(msg)),
            epoch,
            b64(next_key) if next_key else "",
            **takeover_fields(takeover),
        )

    def durable(self) -> None:
        self._before, self._next_taken = None, None
        if self._destroy:
            started = time.perf_counter()
            for path in self._destroy:
                destroy_key_file(path)
            self._destroy = []
            self.rotation_seconds += time.perf_counter() - started

    def abandoned(self) -> None:
        # The new key files stay until the next open reconciles them with the log: a write
        # reported failed may still have left its rotation checkpoint on disk.
        if self._before is not None:
            self._s, self._before = self._before, None
        if self._next_taken is not None:  # the takeover is signed again (by the next node key)
            self._next, self._next_taken = self._next_taken, None
        self._destroy = []
