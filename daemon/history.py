"""Each operation's recorded events, kept in memory so the API answers stories without
reading the log.

What is kept: the encoded payloads (the bytes the log holds, decoded only when a story is
asked for) of every operation that is live or escalated, and of the ``closed_limit`` most
recently ended ones; an older ended operation's story is read offline
(``bide story --offline``). Events appended while the daemon runs are added as they become
durable. Events recorded before this process started are loaded once, lazily, on the first
story that needs them: one pass over the log in a worker thread (the API answers 503 with
``Retry-After`` meanwhile), never a fold on a request's path.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from eventlog.keys import KeyRing
from eventlog.reader import LogReader
from replay.events import LogEvent, decode_log_event

ENDED = ("succeeded", "closed")


class _OperationId(msgspec.Struct):
    operation_id: str = ""


class _Payload(msgspec.Struct):
    event: _OperationId


_peek = msgspec.json.Decoder(_Payload)


class Histories:
    def __init__(self, closed_limit: int = 10_000) -> None:
        self.closed_limit = closed_limit
        self._events: dict[str, list[bytes]] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.start_seq: int | None = None  # events at or before it were recorded earlier
        self.loaded = False  # the earlier events were loaded
        self.loading = False

    def add(self, op_id: str, payload: bytes, phase: str | None) -> None:
        """An event just made durable (``phase``: its operation's phase after it)."""
        self._events.setdefault(op_id, []).append(payload)
        if phase in ENDED:
            self._ended[op_id] = None
            self._ended.move_to_end(op_id)
            while len(self._ended) > self.closed_limit:
                old, _ = self._ended.popitem(last=False)
                self._events.pop(old, None)

    def events(self, op_id: str) -> list[LogEvent] | None:
        """The operation's events in log order, or None when they are not kept."""
        payloads = self._events.get(op_id)
        if payloads is None:
            return None
        return [decode_log_event(p) for p in payloads]

    def complete(self, op_id: str, registered_seq: int | None) -> bool:
        """Whether every event of ``op_id`` is here (it was registered after the start, or
        the earlier events were loaded)."""
        if self.loaded:
            return op_id in self._events
        return (registered_seq is not None and self.start_seq is not None
                and registered_seq > self.start_seq)

    def read_earlier(self, log_dir: Path, keyring: KeyRing, wanted: Callable[[str], bool]
                     ) -> dict[str, list[bytes]]:
        """Read the events recorded before the start, of the operations ``wanted`` says are
        kept (run in a worker thread; :meth:`merge` them on the event loop)."""
        earlier: dict[str, list[bytes]] = {}
        end = self.start_seq if self.start_seq is not None else -1
        for _, payload in read_until(LogReader(log_dir, keyring).payloads([]), end):
            try:
                op_id = _peek.decode(payload).event.operation_id
            except msgspec.DecodeError:
                continue
            if op_id and wanted(op_id):
                earlier.setdefault(op_id, []).append(payload)
        return earlier

    def merge(self, earlier: dict[str, list[bytes]]) -> None:
        for op_id, payloads in earlier.items():
            self._events[op_id] = payloads + self._events.get(op_id, [])
        self.loaded = True

def read_until(payloads: Iterable[tuple[int, bytes]], end: int
               ) -> Iterable[tuple[int, bytes]]:
    for seq, payload in payloads:
        if seq > end:
            return
        yield seq, payload
