"""What the reader commands share: loading the log into events and state.

Readers never write and never take the writer lock; they need the data keys. An event they
cannot read (its data key retired: crypto-shredded; a damaged or foreign payload) or fold is
reported with its sequence number on stderr and left out; the other operations read on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from daemon.config import Config
from daemon.errors import UsageError
from daemon.gc_tuning import collector_paused
from daemon.signing import snapshot_keys
from daemon.snapshots import load_snapshot, replay_log, warn_unreadable
from eventlog.errors import EventLogError
from eventlog.keys import KeyRing, keys_directory, load_keyring
from eventlog.parallel import ParallelReader
from eventlog.position import mismatch
from replay.actions import Action, evolve_action
from replay.errors import ReplayError
from replay.events import (
    ActionDecided,
    ActionEvent,
    ActionFailed,
    ActionIntended,
    ActionSucceeded,
    Event,
    decode_log_event,
)
from replay.ledger import Ledger
from replay.retention import Tombstones
from replay.state import Operation, evolve


@dataclass
class LoadedLog:
    events: list[tuple[int, Event]]  # status-operation events
    ops: dict[str, Operation]
    head_seq: int
    action_events: list[ActionEvent] = field(default_factory=list)
    actions: dict[str, Action] = field(default_factory=dict)
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (seq, why), left out


def open_keyring(config: Config) -> KeyRing:
    return load_keyring(keys_directory(config.keys_dir))


def load_log(
    log_dir: Path,
    keyring: KeyRing,
    *,
    until_seq: int | None = None,
    until_time: float | None = None,
    jobs: int | None = None,
) -> LoadedLog:
    """Every event of the log (up to ``until_*``) and the state they fold into; a large log
    is opened on every core (:class:`eventlog.parallel.ParallelReader`) when the process has
    one thread."""
    reader = ParallelReader(log_dir, keyring, jobs=jobs)
    log = LoadedLog([], {}, -1)
    with collector_paused():
        _fold(log, reader.payloads(log.unreadable), until_seq=until_seq, until_time=until_time)
    log.head_seq = reader.next_seq - 1
    if until_seq is not None:
        log.unreadable = [u for u in log.unreadable if u[0] <= until_seq]
    warn_unreadable(log.unreadable)
    return log


def load_operation(
    log_dir: Path, keyring: KeyRing, operation: str, *, jobs: int | None = None
) -> LoadedLog:
    """One operation's events and actions, what its story needs. An event whose plaintext
    does not hold the id as a JSON string cannot be one of them, so it is neither decoded nor
    folded, and a large log is opened on every core, the workers sending back only those."""
    reader = ParallelReader(log_dir, keyring, msgspec.json.encode(operation), jobs=jobs)
    log = LoadedLog([], {}, -1)
    with collector_paused():
        _fold(log, reader.payloads(log.unreadable), operation=operation)
    log.head_seq = reader.next_seq - 1
    warn_unreadable(log.unreadable)
    return log


def _fold(
    log: LoadedLog,
    payloads: Iterator[tuple[int, bytes]],
    *,
    until_seq: int | None = None,
    until_time: float | None = None,
    operation: str | None = None,
) -> None:
    for seq, payload in payloads:
        if until_seq is not None and seq > until_seq:
            break
        try:
            ev = decode_log_event(payload)
        except ReplayError as exc:
            log.unreadable.append((seq, str(exc)))
            continue
        if until_time is not None and ev.at > until_time:
            break
        if operation is not None and ev.operation_id != operation:
            continue  # holds the id in another field (a job id, a note)
        try:
            if isinstance(ev, ActionIntended | ActionSucceeded | ActionFailed | ActionDecided):
                action = evolve_action(log.actions.get(ev.action_id), ev)
                log.action_events.append(ev)
                log.actions[ev.action_id] = action
                continue
            op = evolve(log.ops.get(ev.operation_id), ev)
        except ReplayError as exc:
            log.unreadable.append((seq, str(exc)))
            continue
        log.events.append((seq, ev))
        log.ops[ev.operation_id] = op


def load_state(config: Config, keyring: KeyRing) -> dict[str, Operation]:
    """Every operation's state (see :func:`load_ledger`)."""
    return load_ledger(config, keyring).ops


def load_ledger(config: Config, keyring: KeyRing) -> Ledger:
    """Every operation's and action's state: from the state snapshot and the events after it
    when the snapshot is usable (its tag checks with the signing key, and its position still
    names a record of the log), else by folding the whole log. The same states either way
    (the snapshot is the fold up to its position); the first is what a large log makes
    cheap."""
    try:
        keys_dir: Path | None = keys_directory(config.keys_dir)
    except EventLogError:
        keys_dir = None
    # the current epoch key (forward-secure logs) or signing.key; an auditor has neither:
    # the whole log
    keys = snapshot_keys(config, keys_dir)
    if keys.root is not None or (
        keys.epochs_dir is not None and os.access(keys.epochs_dir, os.R_OK | os.X_OK)
    ):
        snapshot = load_snapshot(config.snapshot_path, keyring, keys)
        if snapshot is not None and mismatch(config.log_dir, snapshot.position) is None:
            return replay_log(config.log_dir, keyring, snapshot)
    return replay_log(config.log_dir, keyring)


def need_op(
    ops: Mapping[str, Operation], op_id: str, tombstones: Tombstones | None = None
) -> Operation:
    op = ops.get(op_id)
    if op is None and tombstones is not None and tombstones.get(op_id) is not None:
        raise UsageError(
            f"operation {op_id!r} ended and was retired from the daemon's state "
            f"([retention]); its story is in the log: bide story {op_id} --offline"
        )
    if op is None:
        hint = ", ".join(sorted(ops)[:5])
        raise UsageError(
            f"no operation {op_id!r} in the log"
            + (f" (some that exist: {hint})" if hint else " (the log has none yet)")
        )
    return op


def op_events(log: LoadedLog, op_id: str) -> list[Event]:
    return [ev for _, ev in log.events if ev.operation_id == op_id]


def op_action_events(log: LoadedLog, op_id: str) -> list[ActionEvent]:
    return [ev for ev in log.action_events if ev.operation_id == op_id]
