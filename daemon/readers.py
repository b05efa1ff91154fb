"""What the reader commands share: loading the log into events and state, and parsing times.

Readers never write and never take the writer lock; they need the data keys. An event they
cannot read (its data key retired: crypto-shredded; a damaged or foreign payload) or fold is
reported with its sequence number on stderr and left out; the other operations read on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from daemon.config import Config
from daemon.errors import UsageError
from daemon.snapshots import warn_unreadable
from eventlog.keys import KeyRing, keys_directory, load_keyring
from eventlog.reader import LogReader
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
from replay.state import Operation, evolve

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
                       r"(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str, flag: str) -> float:
    """``90``, ``90s``, ``40m``, ``1h30m``, ``2d`` -> seconds."""
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    m = _DURATION.match(t)
    if not t or not m or not any(m.groups()):
        raise UsageError(f"{flag} {text!r} is not a duration (examples: 90s, 40m, 1h30m, 2d)")
    d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s


def parse_time(text: str, flag: str, now: float) -> float:
    """An ISO-8601 time (UTC if no offset), or ``+DURATION`` from now -> POSIX seconds."""
    if text.startswith("+"):
        return now + parse_duration(text[1:], flag)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a time (ISO-8601 like 2026-12-02T18:00:00Z, "
                         f"or +DURATION like +2h)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


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


def load_log(log_dir: Path, keyring: KeyRing, *, until_seq: int | None = None,
             until_time: float | None = None) -> LoadedLog:
    reader = LogReader(log_dir, keyring)
    log = LoadedLog([], {}, -1)
    for seq, payload in reader.payloads(log.unreadable):
        if until_seq is not None and seq > until_seq:
            break
        try:
            ev = decode_log_event(payload)
        except ReplayError as exc:
            log.unreadable.append((seq, str(exc)))
            continue
        if until_time is not None and ev.at > until_time:
            break
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
    log.head_seq = reader.next_seq - 1
    if until_seq is not None:
        log.unreadable = [u for u in log.unreadable if u[0] <= until_seq]
    warn_unreadable(log.unreadable)
    return log


def need_op(log: LoadedLog, op_id: str) -> Operation:
    op = log.ops.get(op_id)
    if op is None:
        hint = ", ".join(sorted(log.ops)[:5])
        raise UsageError(f"no operation {op_id!r} in the log" +
                         (f" (some that exist: {hint})" if hint else " (the log has none yet)"))
    return op


def op_events(log: LoadedLog, op_id: str) -> list[Event]:
    return [ev for _, ev in log.events if ev.operation_id == op_id]


def op_action_events(log: LoadedLog, op_id: str) -> list[ActionEvent]:
    return [ev for ev in log.action_events if ev.operation_id == op_id]
