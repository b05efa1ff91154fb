"""Followers: the in-memory projections kept beside the chain, each fed every folded event.

One job: keep what the API, the metrics and the waiters read, derived from the events the
chain folds (:class:`daemon.engine.chain.Follower`), so none of it is wired into the fold.

* :class:`LiveCounts`: live operations per registrant (``[api] max_live_per_principal``).
* :class:`Stories`: every operation's recent events (:class:`daemon.history.Histories`).
* :class:`Waiters`: who waits for an operation's next event, or for any change.
* :class:`Observed`: the metrics of each event, and each escalation announced (the outbox
  file and the journal lines).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import anyio

from daemon import logfmt
from daemon.config import Config
from daemon.history import Histories
from daemon.metrics import Metrics
from daemon.outbox import escalation_text, write_escalation
from replay.events import ActionEvent, EscalationRaised, LogEvent, OperationRetired
from replay.ledger import Ledger
from replay.state import Operation


class LiveCounts:
    """Live operations per registrant's uid."""

    def __init__(self) -> None:
        self.by_owner: collections.Counter[int | None] = collections.Counter()

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        self.by_owner = collections.Counter(
            op.registered_by_uid for op in ledger.ops.values() if op.phase == "live"
        )

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        if after is not None and (before is None or before.phase != after.phase):
            if after.phase == "live":
                self.by_owner[after.registered_by_uid] += 1
            elif before is not None and before.phase == "live":
                self.by_owner[after.registered_by_uid] -= 1

    def batch_done(self) -> None:
        pass


class Stories:
    """Each operation's events as recorded, for the API's stories (daemon.history)."""

    def __init__(self, histories: Histories, ledger: Callable[[], Ledger]) -> None:
        self.histories = histories
        self._ledger = ledger

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        self.histories.start_seq = head_seq  # later events reach the histories live

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        if isinstance(ev, OperationRetired):
            self.histories.forget(ev.operation_id)
            return
        self.histories.add(ev.operation_id, payload, self._phase_after(ev, after))

    def batch_done(self) -> None:
        pass

    def _phase_after(self, ev: LogEvent, op: Operation | None) -> str | None:
        """The phase of the event's operation, for the stories kept: an action's event counts
        for its operation, or, for a submit that never made one, ends with the action."""
        if op is not None:
            return op.phase
        ledger = self._ledger()
        target = ledger.ops.get(ev.operation_id)
        if target is not None:
            return target.phase
        action = ledger.actions.get(ev.action_id) if isinstance(ev, ActionEvent) else None
        return "closed" if action is not None and action.phase in ("failed", "closed") else None


class Waiters:
    """Who waits: for the next event of one operation (the API's waits), or for any recorded
    change (:meth:`wait_until`)."""

    def __init__(self) -> None:
        self.watchers: dict[str, anyio.Event] = {}  # op id -> set at its next recorded event
        self._watching: collections.Counter[str] = collections.Counter()  # waiters per op id
        self._changed = anyio.Event()
        self._change_waiters = 0

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        pass

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        watcher = self.watchers.pop(ev.operation_id, None)
        if watcher is not None:
            watcher.set()

    def batch_done(self) -> None:
        self.announce()

    def announce(self) -> None:
        """Wake whoever waits in :meth:`wait_until`; with no one waiting (nearly always), no
        new Event is made for each recorded change."""
        if self._change_waiters:
            self._changed.set()
            self._changed = anyio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, re-checking after every recorded change."""
        while not predicate():
            self._change_waiters += 1
            try:
                await self._changed.wait()
            finally:
                self._change_waiters -= 1

    async def next_event_of(self, op_id: str) -> None:
        """Wait until the next event of ``op_id`` is durable (a waiter of the API). The last
        waiter to leave (answered, timed out or gone) takes the entry with it."""
        watcher = self.watchers.get(op_id)
        if watcher is None:
            watcher = self.watchers[op_id] = anyio.Event()
        self._watching[op_id] += 1
        try:
            await watcher.wait()
        finally:
            self._watching[op_id] -= 1
            if not self._watching[op_id]:
                del self._watching[op_id]
                if self.watchers.get(op_id) is watcher:
                    del self.watchers[op_id]


class Observed:
    """The metrics of each operation's events, and each escalation raised announced: its
    outbox file and its lines in the journal."""

    def __init__(self, config: Config, metrics: Metrics, ledger: Callable[[], Ledger]) -> None:
        self.config = config
        self.metrics = metrics
        self._ledger = ledger

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        pass

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        if isinstance(ev, OperationRetired):
            self.metrics.operations_retired += 1
            return
        if after is None or isinstance(ev, ActionEvent):
            return
        self.metrics.observe(ev, after.provider)
        if isinstance(ev, EscalationRaised):
            self._announce(ev)

    def batch_done(self) -> None:
        pass

    def _announce(self, ev: EscalationRaised) -> None:
        op = self._ledger().ops.get(ev.operation_id)
        path = write_escalation(self.config.outbox_dir, ev, op)
        logfmt.warn(
            "escalation raised",
            op=ev.operation_id,
            reason=ev.reason,
            escalation=ev.escalation_id,
            outbox=path,
            options=",".join(o.id for o in ev.options),
        )
        for line in escalation_text(ev, op).rstrip().splitlines():
            logfmt.info(line.strip(), op=ev.operation_id)
