"""The state snapshot as the daemon uses it: load it, replay the log after it, write it.

The format and its sealing are :mod:`eventlog.snapshot`'s and :mod:`replay.ledger`'s; this
module adds what needs the running daemon's context: the model digest that ties a snapshot to
the code that made it, the key that tags it (:class:`SnapshotKeys`), the fallback to a full
replay, the garbage collector paused while a snapshot loads or the log folds
(:mod:`daemon.gc_tuning`), returning replay's freed heap to the OS, and writing in a worker
thread with a log line either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

import replay
from daemon import logfmt
from daemon.gc_tuning import collector_paused
from eventlog.envelope import FORMAT_VERSION as FORMAT_FORWARD_SECURE
from eventlog.epochs import EpochSigning, epoch_signer_at
from eventlog.errors import StoreError
from eventlog.keys import KeyRing, Signer
from eventlog.parallel import ParallelReader
from eventlog.position import LogPosition
from eventlog.reader import LogReader
from eventlog.snapshot import (
    SnapshotError,
    open_snapshot,
    seal_snapshot,
    snapshot_position,
    snapshot_seq,
    write_atomically,
)
from eventlog.store import LineStore
from replay.ledger import Ledger, SnapshotFormatError


@dataclass
class Snapshot:
    position: LogPosition
    ledger: Ledger


def model_digest() -> str:
    """A digest of the pure model's sources: a snapshot is used only by the code that made
    it, since another version of ``evolve`` could fold the same events differently."""
    h = hashlib.sha256(b"bide.model.v1\n")
    for source in sorted(Path(replay.__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return h.hexdigest()


MODEL = model_digest()


@dataclass(frozen=True)
class SnapshotKeys:
    """Which key tags a state snapshot, chosen by the log position it covers.

    On a forward-secure (format 3) log: the seal MAC key of the epoch key in force at that
    position. The daemon tags with the epoch key it holds, and a snapshot verifies only
    while that key exists, that is within its epoch: at the epoch's end the key is destroyed,
    so a copy of it (an old backup of the state directory) together with the data key cannot
    tag a snapshot the daemon would resume from. A snapshot of an earlier epoch is therefore
    refused, and the log replayed (a clean stop writes one in the current epoch). On a
    format-2 log (one signing key, kept on the host): that key's.

    ``signing`` is the running writer's (tags new snapshots; checks, once the log is open,
    that the snapshot is of the epoch the log is in); ``epochs_dir`` is where epoch keys are
    read before that (and by offline readers); ``root`` is a format-2 log's signing key.
    """

    root: Signer | None = None
    epochs_dir: Path | None = None
    signing: EpochSigning | None = None

    @classmethod
    def of(cls, signing: EpochSigning | Signer) -> SnapshotKeys:
        """The daemon's: its writer's signing (or format 2's one signing key)."""
        if isinstance(signing, Signer):
            return cls(root=signing)
        return cls(epochs_dir=signing.key_dir, signing=signing)

    def to_write(self, position: LogPosition) -> bytes | None:
        """The key to tag a snapshot at ``position`` with; None when its epoch is over."""
        if self.signing is not None:
            return self.signing.snapshot_key(position)
        return self.root.mac_key if self.root is not None else None

    def to_read(self, position: LogPosition, where: str) -> bytes:
        """The key a snapshot at ``position`` must be tagged with; :class:`SnapshotError`
        naming ``where`` and why when this host holds none."""
        if position.format >= FORMAT_FORWARD_SECURE:
            signer = None if self.epochs_dir is None else epoch_signer_at(self.epochs_dir, position)
            if signer is None:
                raise SnapshotError(
                    f"snapshot {where} names epoch {position.epoch} of log {position.log_id}, "
                    f"whose key this host does not hold: the epoch ended (its key was "
                    f"destroyed, so an older snapshot, or one tagged with a key from a backup, "
                    f"is not trusted), or the snapshot is not this daemon's; it will be "
                    f"rebuilt"
                )
            return signer.mac_key
        if self.root is None:
            raise SnapshotError(
                f"snapshot {where} is of a format-2 log, and this log is "
                f"forward-secure (or its signing key is not readable here)"
            )
        return self.root.mac_key


def load_snapshot(
    path: Path, keyring: KeyRing, keys: SnapshotKeys, store: LineStore | None = None
) -> Snapshot | None:
    """The state snapshot at ``path``, or the one ``store`` keeps (the log in PostgreSQL:
    whichever node wrote it last) when that one is later; None (and a warning) when there is
    none or none is usable (damaged, or not tagged with the key ``keys`` gives for the
    position it names: rewritten by someone holding only the data key, or an old key): the
    log is the truth, and a full replay rebuilds everything a snapshot held."""
    found: list[tuple[int, str, bytes]] = []
    try:
        local = path.read_bytes()
        found.append((_seq_or_none(local), str(path), local))
    except FileNotFoundError:
        pass
    except OSError as exc:
        logfmt.warn("state snapshot not readable", snapshot=path, error=exc)
    if store is not None:
        try:
            stored = store.load_snapshot()
        except StoreError as exc:
            logfmt.warn("the database's state snapshot not read", error=exc)
            stored = None
        if stored is not None:
            found.append((_seq_or_none(stored), "the database's snapshot", stored))
    for _, where, data in sorted(found, key=lambda f: f[0], reverse=True):
        try:
            claimed = snapshot_position(data)
            if claimed is None:
                raise SnapshotError(f"snapshot {where} has no readable header; it will be rebuilt")
            position, body = open_snapshot(data, keyring, keys.to_read(claimed, where), where)
            del data
            with collector_paused():
                snapshot = Snapshot(position, Ledger.load(body, MODEL))
            del body
            release_freed_heap()
            return snapshot
        except (SnapshotError, SnapshotFormatError) as exc:
            logfmt.warn("state snapshot not used", snapshot=where, error=exc)
    if found:
        logfmt.warn("no state snapshot usable; replaying the whole log")
    return None


def _seq_or_none(data: bytes) -> int:
    """Where a snapshot claims to be, for ordering (-1: unreadable, tried last)."""
    seq = snapshot_seq(data)
    return -1 if seq is None else seq


def replay_log(
    log_dir: Path, keyring: KeyRing, start: Snapshot | None = None, *, jobs: int | None = None
) -> Ledger:
    """Fold the log into a ledger: every event, or those after ``start``'s position into its
    ledger (the caller has checked that the position still names its record).

    Events that cannot be read (sealed under a retired data key: crypto-shredded) or folded
    (later events of an operation whose registration is unreadable) are left out with a
    warning naming their sequence numbers; every other operation is replayed. A whole large
    log is opened on every core where the process has one thread (the offline readers; the
    daemon, threaded, reads it serially)."""
    reader: LogReader | ParallelReader
    if start is None:
        ledger, reader = Ledger(), ParallelReader(log_dir, keyring, jobs=jobs)
    else:
        ledger, reader = start.ledger, LogReader(log_dir, keyring, start=start.position)
    skipped: list[tuple[int, str]] = []
    with collector_paused():
        ledger.fold(reader.payloads(skipped), skipped)
    release_freed_heap()
    warn_unreadable(skipped)
    return ledger


def warn_unreadable(skipped: list[tuple[int, str]], shown: int = 10) -> None:
    """One warning line per event left out (the first ``shown``), then a count of the rest."""
    skipped.sort()
    for seq, why in skipped[:shown]:
        logfmt.warn(
            "log event left out: unreadable or unfoldable (its operation is unknown or incomplete)",
            seq=seq,
            reason=why,
        )
    if len(skipped) > shown:
        logfmt.warn("more log events left out", count=len(skipped) - shown, last_seq=skipped[-1][0])


def release_freed_heap() -> None:
    """Replay frees nearly everything it reads (segments, records, every registration's
    copy of its contract), but glibc keeps those pages resident until asked: about 1.5 KB per
    operation at 100,000 operations. A no-op where the C library has no ``malloc_trim``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def save_snapshot(
    path: Path,
    keyring: KeyRing,
    mac_key: bytes,
    position: LogPosition,
    ledger: Ledger,
    store: LineStore | None = None,
) -> int:
    """Write the snapshot, tagged with ``mac_key`` (:meth:`SnapshotKeys.to_write`), to
    ``path`` and, with the log in a database, keep the same bytes there for the next node (a
    failure there is logged: the local file is written)."""
    data = seal_snapshot(keyring, mac_key, position, ledger.dump(MODEL))
    write_atomically(path, data)
    if store is not None:
        try:
            if not store.save_snapshot(position.seq, position.hash, data):
                logfmt.info(
                    "state snapshot not kept in the database (a later one is there, "
                    "or this node no longer holds the log)",
                    seq=position.seq,
                )
        except StoreError as exc:
            logfmt.warn(
                "state snapshot not kept in the database; the next node replays more", error=exc
            )
    return len(data)


async def write_snapshot_in_thread(
    path: Path,
    keyring: KeyRing,
    keys: SnapshotKeys,
    position: LogPosition,
    ledger: Ledger,
    store: LineStore | None = None,
) -> None:
    """Encode, seal and write ``ledger`` at ``position`` in a worker thread. A failure is
    logged, not raised: the log is unaffected, and the next start replays more of it."""
    started = time.monotonic()
    mac_key = keys.to_write(position)  # now: the epoch may end while the thread runs
    if mac_key is None:
        logfmt.info(
            "state snapshot not written: its position's epoch has ended",
            seq=position.seq,
            epoch=position.epoch,
        )
        return
    try:
        size = await anyio.to_thread.run_sync(
            save_snapshot, path, keyring, mac_key, position, ledger, store
        )
    except OSError as exc:
        logfmt.warn("state snapshot not written; the log is unaffected", error=exc)
        return
    logfmt.info(
        "state snapshot written",
        seq=position.seq,
        events=ledger.events,
        operations=len(ledger.ops),
        bytes=size,
        seconds=f"{time.monotonic() - started:.3f}",
    )
