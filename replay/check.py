"""Re-derive every recorded decision from the log (``bide replay --check``, S40).

For each operation, :func:`check` walks its events in order, keeping the state by ``evolve``.
Each recorded decision group is explained by the observation that caused it:

* a stored fact (``StatusResponseReceived``, ``TransportFailed``, ``RequestOutcomeUnknown``):
  ``decide`` is re-run on the state after the fact, with ``now`` = the ``at`` of the decision
  events that follow it and ``draw`` = the draw recorded in the group's ``PollScheduled``;
* a ``StatusRequestIntended`` or an ``OperationStopped`` that follows no fact: a wake-up, re-run
  with its own ``at``;
* a ``PollScheduled`` with source ``local_quota``: a quota deferral until its ``until``;
* a ``DecisionRecorded`` or ``DecisionRejected``: the human decision it records;
* an ``OperationWithdrawn``: the owner's withdrawal it records.

The re-derived events must equal the recorded ones exactly. Each difference is a
:class:`Mismatch`; a log written by bide gives none. The state always follows the *recorded*
events (the log is the truth), so one bad decision is reported once, not at every later step.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from replay.decide import decide
from replay.errors import ReplayError
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    Event,
    NodeTookOver,
    OperationRegistered,
    OperationStopped,
    OperationWithdrawn,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
)
from replay.observations import (
    DecisionSubmitted,
    InternalFault,
    Observation,
    QuotaDeferred,
    WakeUp,
    Withdrawal,
)
from replay.state import Operation, evolve

__all__ = ["Mismatch", "check"]

_FACTS = (StatusResponseReceived, TransportFailed, RequestOutcomeUnknown)
_STARTS = (OperationRegistered, RegistrationRejected, *_FACTS)


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded decision that ``decide`` does not re-derive.

    Attributes:
        operation_id: The operation.
        index: Position, in the events given to :func:`check`, of the first event concerned.
        observation: The observation re-run (its type tag).
        at: The ``now`` it was re-run with.
        message: What differs.
        expected: What ``decide`` returns.
        recorded: What the log holds in their place.
    """

    operation_id: str
    index: int
    observation: str
    at: float
    message: str
    expected: tuple[Event, ...] = ()
    recorded: tuple[Event, ...] = ()


def _tag(obj: msgspec.Struct) -> str:
    return str(obj.__struct_config__.tag)


def check(events: Iterable[Event]) -> list[Mismatch]:
    """Re-run ``decide`` on every recorded observation and compare with the recorded events.

    Args:
        events: A log's events in order (any number of operations, interleaved).

    Returns:
        The mismatches, in log order; empty for a log written by bide.
    """
    per_op: dict[str, list[tuple[int, Event]]] = {}
    for index, event in enumerate(events):
        if isinstance(event, NodeTookOver):
            continue  # no decision: the node that took the log, told in the story
        per_op.setdefault(event.operation_id, []).append((index, event))
    mismatches: list[Mismatch] = []
    for operation_id, indexed in per_op.items():
        mismatches.extend(_check_operation(operation_id, indexed))
    mismatches.sort(key=lambda m: m.index)
    return mismatches


def _group_end(indexed: list[tuple[int, Event]], start: int) -> int:
    end = start
    while end < len(indexed) and not isinstance(indexed[end][1], _STARTS):
        end += 1
    return end


def _check_operation(operation_id: str, indexed: list[tuple[int, Event]]) -> list[Mismatch]:
    found: list[Mismatch] = []
    state: Operation | None = None
    i = 0
    n = len(indexed)
    while i < n:
        index, event = indexed[i]
        if isinstance(event, RegistrationRejected):
            i += 1
            continue
        try:
            if isinstance(event, OperationRegistered) or state is None:
                state = evolve(state, event)
                i += 1
                continue
            observation: Observation
            if isinstance(event, _FACTS):
                state = evolve(state, event)
                observation = event
                i += 1
                run = [e for _, e in indexed[i : _group_end(indexed, i)]]
                now = run[0].at if run else event.at
                draws = [e.draw for e in run if isinstance(e, PollScheduled) and e.draw is not None]
                draw = draws[0] if draws else 0.0
            else:
                now = event.at
                draw = 0.0
                if isinstance(event, StatusRequestIntended):
                    observation = WakeUp(timer_elapsed=event.due_by_timer)
                elif isinstance(event, OperationStopped) and event.reason == "internal_error":
                    observation = InternalFault(detail=event.detail)
                elif isinstance(event, OperationStopped):
                    observation = WakeUp()
                elif isinstance(event, PollScheduled) and event.delay_source == "local_quota":
                    until = event.until if event.until is not None else event.next_poll_at
                    observation = QuotaDeferred(until=until)
                elif isinstance(event, DecisionRecorded | DecisionRejected):
                    observation = DecisionSubmitted(
                        option=event.option_id,
                        approver=event.approver,
                        note=event.note,
                        escalation_id=event.escalation_id,
                        self_approved=isinstance(event, DecisionRecorded) and event.self_approved,
                    )
                elif isinstance(event, OperationWithdrawn):
                    observation = Withdrawal(by=event.by, by_uid=event.by_uid, note=event.note)
                else:
                    found.append(
                        Mismatch(
                            operation_id=operation_id,
                            index=index,
                            observation="none",
                            at=event.at,
                            message=f"{_tag(event)} is not explained by any observation",
                            recorded=(event,),
                        )
                    )
                    state = evolve(state, event)
                    i += 1
                    continue
            expected = decide(state, observation, now, draw)
        except ReplayError as exc:
            found.append(
                Mismatch(
                    operation_id=operation_id,
                    index=index,
                    observation=_tag(event),
                    at=event.at,
                    message=f"cannot re-run: {exc}",
                )
            )
            return found
        end = _group_end(indexed, i)
        take = min(len(expected), end - i)
        if not expected and not isinstance(observation, _FACTS):
            take = 1  # the recorded decision has no cause: report it and step over it
        recorded = [e for _, e in indexed[i : i + take]]
        if recorded != expected:
            found.append(
                Mismatch(
                    operation_id=operation_id,
                    index=indexed[i][0] if i < n else index,
                    observation=_tag(observation),
                    at=now,
                    message=(
                        "recorded events differ from the re-derived decision"
                        if expected
                        else f"{_tag(event)} at {now}: decide returns nothing here"
                    ),
                    expected=tuple(expected),
                    recorded=tuple(recorded),
                )
            )
        try:
            for recorded_event in recorded:
                state = evolve(state, recorded_event)
        except ReplayError as exc:
            found.append(
                Mismatch(
                    operation_id=operation_id,
                    index=indexed[i][0],
                    observation=_tag(observation),
                    at=now,
                    message=f"cannot replay: {exc}",
                )
            )
            return found
        i += take
    return found
