"""An operation's state is the fold of its events, and nothing else.

:func:`evolve` applies one event to one operation's state; :func:`fold` applies a whole log,
which may interleave many operations (every event carries ``operation_id``). ``evolve`` takes no
decision: it applies what the event says. The only arithmetic it does is counting facts, by the
literal tables in :mod:`replay.tables` (a 5xx or a transport failure counts against the
transport-failure budget, a 429 against the rate-limited budget: S10, S21, S25), so a counter
moves with the fact even if the daemon dies before it records the decision.

Counters only grow (S17): nothing here ever lowers ``status_requests_used``,
``transport_failures_used`` or ``rate_limited_used``, whatever the events.

Memory (issue 8: 100,000 live operations in one process). ``evolve`` returns equal values
whatever it shares, but it shares what repeats across operations instead of keeping one copy per
operation: one ``Contract`` (and digest string) per contract, interned strings for the provider,
account context, expected state and job states, one ``Histogram`` object per distinct set of
counts, one empty ``results`` dict, and a timestamp object reused where two fields hold the same
instant. A state is never mutated in place (not its dicts either), so sharing is invisible to
readers; :func:`compact` applies the same sharing to a state built some other way (a snapshot).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import msgspec

from replay.contract import Contract
from replay.errors import ReplayOrderError
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    EscalationContext,
    EscalationRaised,
    Event,
    ExtendRule,
    HintRejected,
    Histogram,
    NodeTookOver,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    OperationWithdrawn,
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

__all__ = ["OpenEscalation", "Operation", "Phase", "compact", "evolve", "fold"]

#: ``live``: polling; ``succeeded``: a validated success; ``escalated``: stopped, a decision is
#: awaited; ``closed``: a human decided not to resume.
Phase = Literal["live", "succeeded", "escalated", "closed"]


class OpenEscalation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The escalation awaiting a decision.

    Attributes:
        escalation_id: Its id (1, 2, ...).
        reason: The stop reason.
        options: The options offered.
        raised_at: When it was raised.
        context: What the decision needs to know, as raised (so ``bide escalations
            --offline`` answers from the state snapshot instead of reading the whole log).
    """

    escalation_id: int
    reason: StopReason
    options: tuple[Option, ...]
    raised_at: float
    context: EscalationContext | None = None


class Operation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One operation's state (S5, S12): the record ``decide`` reads.

    Not tracked by the garbage collector (``gc=False``): its values are strings, numbers,
    frozen structs and dicts of strings, which cannot refer back to it, so it is never part of
    a cycle; untracked, it is 16 bytes smaller and full collections skip 100,000 of them.

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
        registered_by: Who asked for the operation (the daemon's word, not the request's).
        registered_by_uid: Their uid, when known: whose operation it is, for the local API.
        registered_seq: The log sequence number of the registration, when the fold knew it
            (set by the ledger, not by ``evolve``: a position, not a fact of the event).
        request_digest: The registering API request's digest (idempotent retries).
        extend_rule: What an approved extension does (``replay.events.ExtendRule``).
        stop_reason: Why the wait last stopped, while escalated or closed.
        provider_error: The provider's own error from a failure stop (S3), as stored: bounded by
            the contract's ``error_cap_bytes``; the JSON text of the error when it fit.
        provider_error_truncated: ``provider_error`` was cut at the cap (then it is text, and
            may no longer parse as JSON).
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
    registered_by: str = ""
    registered_by_uid: int | None = None
    registered_seq: int | None = None
    request_digest: str = ""
    extend_rule: ExtendRule = "at_least"
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
    stop_reason: StopReason | Literal["withdrawn_by_owner"] | None = None
    provider_error: str | None = None
    provider_error_truncated: bool = False
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


# --- sharing what repeats across operations (see the module docstring) ---------------------

#: Bound on each table below; a full table is emptied (what it handed out stays valid).
_TABLE_LIMIT: Final = 4096
#: Contract in force by digest: (the digest string, the contract), one object each.
_contracts: dict[str, tuple[str, Contract]] = {}
#: Histograms by their counts, in insertion order (so a shared one encodes the same).
_histograms: dict[
    tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]],
    Histogram,
] = {}
_EMPTY_HISTOGRAM: Final = Histogram()
_NO_RESULTS: Final[dict[str, str]] = {}


def _text(value: str | None) -> str | None:
    """One object per distinct string, for the strings that repeat across operations."""
    return None if value is None else sys.intern(value)


def _contract(contract: Contract, digest: str) -> tuple[Contract, str]:
    """The one shared (contract, digest) equal to these."""
    shared = _contracts.get(digest)
    if shared is not None and (shared[1] is contract or shared[1] == contract):
        return shared[1], shared[0]
    if len(_contracts) >= _TABLE_LIMIT:
        _contracts.clear()
    _contracts[digest] = (digest, contract)
    return contract, digest


def _histogram(
    status_codes: dict[str, int], job_states: dict[str, int], transport: dict[str, int]
) -> Histogram:
    """The one shared histogram with these counts (operations polled alike count alike)."""
    key = (tuple(status_codes.items()), tuple(job_states.items()), tuple(transport.items()))
    hist = _histograms.get(key)
    if hist is None:
        if len(_histograms) >= _TABLE_LIMIT:
            _histograms.clear()
        hist = _histograms[key] = Histogram(
            status_codes=status_codes, job_states=job_states, transport=transport
        )
    return hist


def _same(value: float, other: float | None) -> float:
    """``other`` when it is the same instant as ``value`` (one float object for both)."""
    if type(other) is type(value) and other == value and value != 0.0:
        return other
    return value


def _budget(value: int, default: int) -> int:
    """The contract's default object when the budget is the default (an int above 256 is
    an object of its own)."""
    return default if type(value) is type(default) and value == default else value


def _bump(counts: Mapping[str, int], key: str) -> dict[str, int]:
    new = dict(counts)
    new[key] = new.get(key, 0) + 1
    return new


def compact(op: Operation) -> Operation:
    """The same state, sharing what repeats across operations as :func:`evolve` does.

    For a state that did not come from ``evolve`` (a snapshot, a test); equal to ``op``.
    """
    contract, digest = _contract(op.contract, op.contract_digest)
    h = op.histogram
    hist = _histogram(
        {sys.intern(k): v for k, v in h.status_codes.items()},
        {sys.intern(k): v for k, v in h.job_states.items()},
        {sys.intern(k): v for k, v in h.transport.items()},
    )
    return msgspec.structs.replace(
        op,
        provider=sys.intern(op.provider),
        account_context=sys.intern(op.account_context),
        registered_by=sys.intern(op.registered_by),
        expected_terminal_state=_text(op.expected_terminal_state),
        contract=contract,
        contract_digest=digest,
        started_at=_same(op.started_at, op.registered_at),
        max_status_requests=_budget(op.max_status_requests, contract.default_max_status_requests),
        max_transport_failures=_budget(
            op.max_transport_failures, contract.default_max_transport_failures
        ),
        max_rate_limited=_budget(op.max_rate_limited, contract.default_max_rate_limited),
        last_state=_text(op.last_state),
        last_state_at=(
            None if op.last_state_at is None else _same(op.last_state_at, op.last_http_at)
        ),
        last_transport_failure=_text(op.last_transport_failure),
        results=op.results or _NO_RESULTS,
        histogram=hist,
    )


def _registered(event: OperationRegistered) -> Operation:
    contract, digest = _contract(event.contract, event.contract_digest)
    return Operation(
        operation_id=event.operation_id,
        provider=sys.intern(event.provider),
        provider_job_id=event.provider_job_id,
        account_context=sys.intern(event.account_context),
        request_fingerprint=event.request_fingerprint,
        expected_terminal_state=_text(event.expected_terminal_state),
        idempotency_key=event.idempotency_key,
        status_location=event.status_location,
        contract=contract,
        contract_digest=digest,
        registered_at=event.at,
        registered_by=sys.intern(event.registered_by),
        registered_by_uid=event.registered_by_uid,
        request_digest=event.request_digest,
        extend_rule=event.extend_rule,
        started_at=_same(event.started_at, event.at),
        deadline_at=event.deadline_at,
        business_deadline_at=event.business_deadline_at,
        max_status_requests=_budget(
            event.max_status_requests, contract.default_max_status_requests
        ),
        max_transport_failures=_budget(
            event.max_transport_failures, contract.default_max_transport_failures
        ),
        max_rate_limited=_budget(event.max_rate_limited, contract.default_max_rate_limited),
        next_poll_at=event.first_poll_at,
        results=_NO_RESULTS,
        histogram=_EMPTY_HISTOGRAM,
    )


def evolve(state: Operation | None, event: Event) -> Operation:
    """Apply one event to one operation's state.

    Args:
        state: The state before, or ``None`` before the operation's registration.
        event: An event of that operation.

    Returns:
        The state after. ``DecisionRejected``, ``HintRejected``, ``RegistrationRejected`` and
        ``NodeTookOver`` leave it unchanged.

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
            counts = status_counts_as(event.status_code, event.headers.ratelimit_remaining)
            h = s.histogram
            hist = _histogram(
                _bump(h.status_codes, str(event.status_code)), h.job_states, h.transport
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
            h = s.histogram
            hist = _histogram(h.status_codes, h.job_states, _bump(h.transport, event.kind))
            counted = event.kind in COUNTED_TRANSPORT_KINDS
            return msgspec.structs.replace(
                s,
                in_flight=None,
                last_transport_failure=sys.intern(event.kind),
                last_transport_failure_at=event.at,
                transport_failures_used=s.transport_failures_used + counted,
                histogram=hist,
            )
        case RequestOutcomeUnknown():
            # S11: counted already as a status request; its delivery is ambiguous (S18).
            h = s.histogram
            hist = _histogram(h.status_codes, h.job_states, _bump(h.transport, "outcome_unknown"))
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
            job_state = sys.intern(event.job_state)
            h = s.histogram
            hist = _histogram(h.status_codes, _bump(h.job_states, job_state), h.transport)
            return msgspec.structs.replace(
                s,
                last_state=job_state,
                last_state_at=_same(event.at, s.last_http_at),
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
                s,
                phase="succeeded",
                results=dict(event.results),
                last_state=sys.intern(event.state),
            )
        case OperationStopped():
            return msgspec.structs.replace(
                s,
                phase="escalated",
                stop_reason=event.reason,
                provider_error=event.provider_error,
                provider_error_truncated=event.provider_error_truncated,
            )
        case EscalationRaised():
            return msgspec.structs.replace(
                s,
                phase="escalated",
                escalation=OpenEscalation(
                    escalation_id=event.escalation_id,
                    reason=event.reason,
                    options=event.options,
                    raised_at=event.at,
                    context=event.context,
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
        case OperationWithdrawn():
            return msgspec.structs.replace(
                s, phase="closed", escalation=None, stop_reason="withdrawn_by_owner"
            )
        case DecisionRejected() | HintRejected() | RegistrationRejected() | NodeTookOver():
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
