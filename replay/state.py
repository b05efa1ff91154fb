"""An operation's state is the fold of its events, and nothing else.

:func:`evolve` applies one event to one operation's state; :func:`fold` applies a whole log,
which may interleave many operations (every event carries ``operation_id``). ``evolve`` takes no
decision: it applies what the event says. The only arithmetic it does is counting facts, by the
literal tables in :mod:`replay.tables` (a 5xx or a transport failure counts against the
transport-failure budget, a 429 against the rate-limited budget: S10, S21, S25), so a counter
moves with the fact even if the daemon dies before it records the decision.

Counters only grow (S17): nothing here ever lowers ``status_requests_used``,
``transport_failures_used`` or ``rate_limited_used``, whatever the events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from replay.contract import Contract
from replay.errors import ReplayOrderError
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    EscalationRaised,
    Event,
    HintRejected,
    Histogram,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    Option,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    ResponseClassified,
    StatusRequestIntended,
    StatusResponseReceived,
    StopReason,
    TransportFailed,
)
from replay.tables import COUNTED_TRANSPORT_KINDS, status_counts_as

__all__ = ["OpenEscalation", "Operation", "Phase", "evolve", "fold"]

#: ``live``: polling; ``succeeded``: a validated success; ``escalated``: stopped, a decision is
#: awaited; ``closed``: a human decided not to resume.
Phase = Literal["live", "succeeded", "escalated", "closed"]


class OpenEscalation(msgspec.Struct, frozen=True, kw_only=True):
    """The escalation awaiting a decision.

    Attributes:
        escalation_id: Its id (1, 2, ...).
        reason: The stop reason.
        options: The options offered.
        raised_at: When it was raised.
    """

    escalation_id: int
    reason: StopReason
    options: tuple[Option, ...]
    raised_at: float


class Operation(msgspec.Struct, frozen=True, kw_only=True):
    """One operation's state (S5, S12): the record ``decide`` reads.

    Attributes:
        operation_id: bide's id for the operation.
        provider: The provider.
        provider_job_id: The job id at the provider.
        account_context: The provider account context.
        request_fingerprint: Fingerprint of the original submit request.
        expected_terminal_state: The expected success state, if any.
        idempotency_key: The persisted idempotency key, if any (S29).
        status_location: The status resource from a 202's Location, if any (S22).
        contract: The contract in force.
        contract_digest: Its digest.
        registered_at: When the operation was registered.
        started_at: When the job was submitted.
        deadline_at: The operation deadline (S10, S16).
        business_deadline_at: The business deadline (S28), if any.
        max_status_requests: The status-request budget in force (S10).
        max_transport_failures: The transport-failure budget in force (S10).
        max_rate_limited: The rate-limited budget in force (S21).
        status_requests_used: Status requests intended so far (S11, S13).
        transport_failures_used: Transport failures so far (S10, S25).
        rate_limited_used: Rate-limited responses so far (S21).
        phase: Where the operation is.
        next_poll_at: The earliest time of the next status request.
        not_before: The latest time any provider guidance asked to wait until (S8, S20).
        in_flight: The request intended without an outcome yet, if any (S11).
        last_state: The last job state observed (S16).
        last_state_at: When it was observed.
        last_http_status: The last HTTP status (S27).
        last_http_at: When it was received.
        last_provider_request_id: The provider request id that came with it (S25).
        last_transport_failure: The last transport failure kind.
        last_transport_failure_at: When it happened.
        stop_reason: Why the wait last stopped, while escalated or closed.
        escalation: The open escalation, if any.
        escalations_raised: How many escalations were raised.
        decisions_recorded: How many decisions were recorded.
        follow_up: The follow-up a closing decision named.
        results: The results of a success.
        histogram: What was observed (S27).
    """

    operation_id: str
    provider: str
    provider_job_id: str
    account_context: str
    request_fingerprint: str
    expected_terminal_state: str | None
    idempotency_key: str | None
    status_location: str | None
    contract: Contract
    contract_digest: str
    registered_at: float
    started_at: float
    deadline_at: float
    business_deadline_at: float | None
    max_status_requests: int
    max_transport_failures: int
    max_rate_limited: int
    status_requests_used: int = 0
    transport_failures_used: int = 0
    rate_limited_used: int = 0
    phase: Phase = "live"
    next_poll_at: float
    not_before: float | None = None
    in_flight: int | None = None
    last_state: str | None = None
    last_state_at: float | None = None
    last_http_status: int | None = None
    last_http_at: float | None = None
    last_provider_request_id: str | None = None
    last_transport_failure: str | None = None
    last_transport_failure_at: float | None = None
    stop_reason: StopReason | None = None
    escalation: OpenEscalation | None = None
    escalations_raised: int = 0
    decisions_recorded: int = 0
    follow_up: str | None = None
    results: dict[str, str] = {}
    histogram: Histogram = msgspec.field(default_factory=Histogram)

    @property
    def effective_deadline(self) -> tuple[float, Literal["operation", "business"]]:
        """The deadline in force and which one it is: the earlier of the two (S28)."""
        if self.business_deadline_at is not None and self.business_deadline_at < self.deadline_at:
            return self.business_deadline_at, "business"
        return self.deadline_at, "operation"


def _bump(counts: Mapping[str, int], key: str) -> dict[str, int]:
    new = dict(counts)
    new[key] = new.get(key, 0) + 1
    return new


def _registered(event: OperationRegistered) -> Operation:
    return Operation(
        operation_id=event.operation_id,
        provider=event.provider,
        provider_job_id=event.provider_job_id,
        account_context=event.account_context,
        request_fingerprint=event.request_fingerprint,
        expected_terminal_state=event.expected_terminal_state,
        idempotency_key=event.idempotency_key,
        status_location=event.status_location,
        contract=event.contract,
        contract_digest=event.contract_digest,
        registered_at=event.at,
        started_at=event.started_at,
        deadline_at=event.deadline_at,
        business_deadline_at=event.business_deadline_at,
        max_status_requests=event.max_status_requests,
        max_transport_failures=event.max_transport_failures,
        max_rate_limited=event.max_rate_limited,
        next_poll_at=event.first_poll_at,
    )


def evolve(state: Operation | None, event: Event) -> Operation:
    """Apply one event to one operation's state.

    Args:
        state: The state before, or ``None`` before the operation's registration.
        event: An event of that operation.

    Returns:
        The state after. ``DecisionRejected``, ``HintRejected`` and ``RegistrationRejected``
        leave it unchanged.

    Raises:
        ReplayOrderError: The event cannot follow this state: an event before registration, a
            second registration, or an event of another operation.
    """
    if isinstance(event, OperationRegistered):
        if state is not None:
            raise ReplayOrderError(f"operation {event.operation_id!r} is registered twice")
        return _registered(event)
    if state is None:
        raise ReplayOrderError(
            f"{event.__struct_config__.tag} for operation {event.operation_id!r} "
            "precedes its registration"
        )
    if event.operation_id != state.operation_id:
        raise ReplayOrderError(
            f"{event.__struct_config__.tag} for operation {event.operation_id!r} "
            f"applied to operation {state.operation_id!r}"
        )
    s = state
    match event:
        case StatusRequestIntended():
            # S13: the counter moved before transmitting; it never moves back.
            return msgspec.structs.replace(
                s,
                status_requests_used=max(s.status_requests_used, event.request_number),
                in_flight=event.request_number,
            )
        case StatusResponseReceived():
            counts = status_counts_as(event.status_code)
            hist = msgspec.structs.replace(
                s.histogram, status_codes=_bump(s.histogram.status_codes, str(event.status_code))
            )
            return msgspec.structs.replace(
                s,
                in_flight=None,
                last_http_status=event.status_code,
                last_http_at=event.at,
                last_provider_request_id=event.headers.request_id,
                transport_failures_used=s.transport_failures_used + (counts == "transport"),
                rate_limited_used=s.rate_limited_used + (counts == "rate_limited"),
                histogram=hist,
            )
        case TransportFailed():
            hist = msgspec.structs.replace(
                s.histogram, transport=_bump(s.histogram.transport, event.kind)
            )
            counted = event.kind in COUNTED_TRANSPORT_KINDS
            return msgspec.structs.replace(
                s,
                in_flight=None,
                last_transport_failure=event.kind,
                last_transport_failure_at=event.at,
                transport_failures_used=s.transport_failures_used + counted,
                histogram=hist,
            )
        case RequestOutcomeUnknown():
            # S11: counted already as a status request; its delivery is ambiguous (S18).
            hist = msgspec.structs.replace(
                s.histogram, transport=_bump(s.histogram.transport, "outcome_unknown")
            )
            return msgspec.structs.replace(
                s,
                in_flight=None,
                last_transport_failure="outcome_unknown",
                last_transport_failure_at=event.at,
                transport_failures_used=s.transport_failures_used + 1,
                histogram=hist,
            )
        case ResponseClassified():
            not_before = s.not_before
            if event.retry_after_at is not None:
                not_before = max(not_before or event.retry_after_at, event.retry_after_at)
            if event.job_state is None:
                return msgspec.structs.replace(s, not_before=not_before)
            hist = msgspec.structs.replace(
                s.histogram, job_states=_bump(s.histogram.job_states, event.job_state)
            )
            return msgspec.structs.replace(
                s,
                last_state=event.job_state,
                last_state_at=event.at,
                not_before=not_before,
                histogram=hist,
            )
        case PollScheduled():
            not_before = s.not_before
            if event.delay_source in ("provider_retry_after", "provider_poll_hint"):
                guided = event.until if event.until is not None else event.next_poll_at
                not_before = max(not_before or guided, guided)
            return msgspec.structs.replace(
                s, next_poll_at=event.next_poll_at, not_before=not_before
            )
        case OperationSucceeded():
            return msgspec.structs.replace(
                s, phase="succeeded", results=dict(event.results), last_state=event.state
            )
        case OperationStopped():
            return msgspec.structs.replace(s, phase="escalated", stop_reason=event.reason)
        case EscalationRaised():
            return msgspec.structs.replace(
                s,
                phase="escalated",
                escalation=OpenEscalation(
                    escalation_id=event.escalation_id,
                    reason=event.reason,
                    options=event.options,
                    raised_at=event.at,
                ),
                escalations_raised=max(s.escalations_raised, event.escalation_id),
            )
        case DecisionRecorded():
            # S17: budgets grow by the approved increments; counters are never reset.
            return msgspec.structs.replace(
                s,
                phase="live" if event.resumes else "closed",
                escalation=None,
                stop_reason=None if event.resumes else s.stop_reason,
                follow_up=event.follow_up,
                decisions_recorded=s.decisions_recorded + 1,
                deadline_at=event.new_deadline_at,
                business_deadline_at=event.new_business_deadline_at,
                max_status_requests=event.new_max_status_requests,
                max_transport_failures=event.new_max_transport_failures,
                max_rate_limited=event.new_max_rate_limited,
            )
        case DecisionRejected() | HintRejected() | RegistrationRejected():
            return s
    raise ReplayOrderError(f"unhandled event {event.__struct_config__.tag}")  # pragma: no cover


def fold(events: Iterable[Event]) -> dict[str, Operation]:
    """Replay a log (many operations, interleaved) into each operation's state.

    ``RegistrationRejected`` creates no operation and is skipped.

    Args:
        events: Events in log order.

    Returns:
        Each operation's state, by operation id.

    Raises:
        ReplayOrderError: An event cannot follow its operation's state.
    """
    ops: dict[str, Operation] = {}
    for event in events:
        if isinstance(event, RegistrationRejected):
            continue
        ops[event.operation_id] = evolve(ops.get(event.operation_id), event)
    return ops
