"""Each operation's recorded events, kept in memory so the API answers stories without
reading the log.

What is kept: the encoded payloads (the bytes the log holds, decoded only when a story is
asked for) of every operation that is live or escalated, and of the ``closed_limit`` most
recently ended ones; an older ended operation's story is read offline
(``bide story --offline``). Per operation at most ``per_operation`` events are kept: the first
eighth of them (its registration and first polls) and the most recent rest, with a count of
those left out between, so a long-lived operation polled for days costs a bounded amount of
memory (about 350 bytes an event) and its story says what it leaves out.

Events appended while the daemon runs are added as they become durable. Events recorded
before this process started are loaded once, lazily, on the first story that needs them: one
pass over the log in a worker thread (the API answers 503 with ``Retry-After`` meanwhile),
never a fold on a request's path.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from eventlog.keys import KeyRing
from eventlog.reader import LogReader, archive_names
from replay.events import LogEvent, decode_log_event

ENDED = ("succeeded", "closed")


class _OperationId(msgspec.Struct):
    operation_id: str = ""


class _Payload(msgspec.Struct):
    event: _OperationId


_peek = msgspec.json.Decoder(_Payload)


class _Kept:
    """One operation's kept events: a head, a tail, and how many were dropped between."""

    __slots__ = ("_head_limit", "_tail_limit", "dropped", "head", "tail")

    def __init__(self, head_limit: int, tail_limit: int) -> None:
        self.head: list[bytes] = []
        # Made only once the head is full: most operations end before (a deque is 600 bytes).
        self.tail: collections.deque[bytes] | None = None
        self.dropped = 0
        self._head_limit = head_limit
        self._tail_limit = tail_limit

    def append(self, payload: bytes) -> None:
        if len(self.head) < self._head_limit:
            self.head.append(payload)
            return
        if self.tail is None:
            self.tail = collections.deque(maxlen=self._tail_limit)
        elif len(self.tail) == self._tail_limit:
            self.dropped += 1
        self.tail.append(payload)

    def payloads(self) -> list[bytes]:
        return [*self.head, *(self.tail or ())]

    def prepend(self, earlier: _Kept) -> None:
        """Put events recorded before these (loaded after a restart) in front. The one gap
        stays after the head: what ``earlier`` dropped, and what no longer fits."""
        later = self.payloads()
        self.head, self.tail, self.dropped = earlier.head, earlier.tail, earlier.dropped
        for payload in later:
            self.append(payload)


class Histories:
    def __init__(self, closed_limit: int = 10_000, per_operation: int = 64) -> None:
        self.closed_limit = closed_limit
        self._head = max(1, per_operation // 8)
        self._tail = max(1, per_operation - self._head)
        self._events: dict[str, _Kept] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.start_seq: int | None = None  # events at or before it were recorded earlier
        self.loaded = False  # the earlier events were loaded
        #: Records at or before it were archived (`bide log archive`): stories of operations
        #: registered there begin in the archive. -1: nothing archived.
        self.archived_seq = -1
        self.archived_where = ""
        self.loading = False

    def add(self, op_id: str, payload: bytes, phase: str | None) -> None:
        """An event just made durable (``phase``: its operation's phase after it)."""
        kept = self._events.get(op_id)
        if kept is None:
            kept = self._events[op_id] = _Kept(self._head, self._tail)
        kept.append(payload)
        if phase in ENDED:
            self._ended[op_id] = None
            self._ended.move_to_end(op_id)
            while len(self._ended) > self.closed_limit:
                old, _ = self._ended.popitem(last=False)
                self._events.pop(old, None)

    def forget(self, op_id: str) -> None:
        """The operation was retired (``[retention]``): its story is the log's alone now."""
        self._events.pop(op_id, None)
        self._ended.pop(op_id, None)

    def events(self, op_id: str) -> tuple[list[LogEvent], int, int] | None:
        """The operation's kept events in log order, how many of them come before the gap,
        and how many were left out there; None when none are kept."""
        kept = self._events.get(op_id)
        if kept is None:
            return None
        decoded = [decode_log_event(p) for p in kept.payloads()]
        return decoded, len(kept.head), kept.dropped

    def complete(self, op_id: str, registered_seq: int | None) -> bool:
        """Whether every event of ``op_id`` is here (it was registered after the start, or
        the earlier events were loaded)."""
        if self.loaded:
            return op_id in self._events
        return (
            registered_seq is not None
            and self.start_seq is not None
            and registered_seq > self.start_seq
        )

    def read_earlier(
        self, log_dir: Path, keyring: KeyRing, wanted: Callable[[str], bool]
    ) -> dict[str, _Kept]:
        """Read the events recorded before the start, of the operations ``wanted`` says are
        kept (run in a worker thread; :meth:`merge` them on the event loop)."""
        earlier: dict[str, _Kept] = {}
        end = self.start_seq if self.start_seq is not None else -1
        reader = LogReader(log_dir, keyring, from_boundary=True)
        if reader.archived is not None:
            self.archived_seq = reader.archived.seq
            self.archived_where = archive_names(reader.archived)
        for _, payload in read_until(reader.payloads([]), end):
            try:
                op_id = _peek.decode(payload).event.operation_id
            except msgspec.DecodeError:
                continue
            if op_id and wanted(op_id):
                kept = earlier.get(op_id)
                if kept is None:
                    kept = earlier[op_id] = _Kept(self._head, self._tail)
                kept.append(payload)
        return earlier

    def merge(self, earlier: dict[str, _Kept]) -> None:
        for op_id, kept in earlier.items():
            current = self._events.get(op_id)
            if current is None:
                self._events[op_id] = kept
            else:
                current.prepend(kept)
        self.loaded = True


def read_until(payloads: Iterable[tuple[int, bytes]], end: int) -> Iterable[tuple[int, bytes]]:
    for seq, payload in payloads:
        if seq > end:
            return
        yield seq, payload
