"""The polling policy: a pure decider (sans-I/O, like h11's ``Connection``).

Theory of operation
===================

bide waits on an external job under a written contract and never waits without bounds. This
module holds every rule of that wait. It is pure: it reads no clock, draws no randomness and does
no I/O. ``now`` (POSIX seconds, UTC) and the jitter ``draw`` (a float in [0, 1)) are arguments,
and they are written into the events returned, so the log can re-derive every decision
(:func:`replay.check.check`).

Two entry points:

* :func:`register` validates a registration against the contract and ``now`` and returns
  ``[OperationRegistered]`` (the operation record of S5/S12, persisted before the first poll),
  or ``[RegistrationRejected]`` with a machine-readable reason. A bad registration is an
  expected outcome, so it is a value, not an exception.
* :func:`decide` turns one observation into the events that record what happens next. The
  daemon appends a fact (response, transport failure, outcome unknown) first, evolves the
  operation with it, and then calls ``decide``; a wake-up, a quota deferral and a human decision
  are recorded only by what ``decide`` returns.

On a wake-up (S32, in exactly this order)
-----------------------------------------
1. The operation is not live (succeeded, escalated, closed), or a request is in flight:
   nothing.
2. ``now`` is at or past the deadline in force -- the earlier of the operation deadline and the
   business deadline (S28) -- stop ``deadline_exceeded`` or ``business_deadline_exceeded``,
   whichever it was, reporting the last state (S9, S13, S16: even if the state just changed; no
   self-granted extra period).
3. The next request would exceed the status-request budget: stop ``request_budget_exhausted``
   (S17).
4. ``now`` is before ``next_poll_at`` and the daemon's monotonic timer for that wait has not
   run out (``WakeUp.timer_elapsed``): nothing (the daemon keeps its timer). A wall clock set
   back never stretches a wait; the intent records ``due_by_timer`` when it decided. One
   wake-up never sends more than one request: no catch-up bursts (S9).
5. Otherwise ``StatusRequestIntended`` with the counter already incremented (S13: counted before
   transmitting; the daemon makes it durable before it sends).

After a response (S2, S3, S14, S15, S20-S25)
--------------------------------------------
The response is read first, by :func:`replay.reading.read_response`: its HTTP outcome, its
headers' guidance, and for a contract 2xx the job's state, identity, results, error, expiry and
hints, each validated. This module applies the rules to that reading. First a
``ResponseClassified`` records the HTTP outcome and the job outcome as two facts (S2), with any
invalid hint or header recorded as ``HintRejected`` (S8). Then:

* 401/403: stop ``authorization_denied`` at once (S24).
* 3xx, a status the contract does not explain, or a body over the cap: ``integration_failure``.
* 404: inside the grace window after the job's start, "not yet visible" and polled again (it was
  counted as a request); else ``not_found``, with the job id and the time (S23).
* 429: counted in the rate-limited budget; spent: ``rate_limited``; else wait (S21). So is a
  403 or 429 whose provider remaining-requests header says ``0`` (GitHub's primary limit):
  its valid reset is the earliest next poll, clamped to the deadline.
* 5xx: counted in the transport-failure budget; spent: ``delivery_ambiguous`` (S18, S25).
* A contract 2xx: an unparseable body or no state field: ``unparseable_response``; a job id that
  is not the registered one: ``contradiction`` (S5); the state, looked up in the state table
  (S3), is success -> ``OperationSucceeded`` only if every required result field validates
  (S14), else ``contradiction`` (S4); failure -> ``provider_failure`` with the provider's error
  verbatim, capped; canceled / expired -> stop, never resubmit (S29); in no list ->
  ``unknown_state`` (S15); pending past the job's own expiry -> ``contradiction`` (S4); pending ->
  wait.

To wait, in this order: the deadline reached -> stop (S16); the budget spent -> stop
``request_budget_exhausted`` (S17, without waking once more for nothing); a valid Retry-After
at or past the deadline -> stop ``retry_after_past_deadline`` (S20). Else the next poll is at the
latest of: local backoff (``raw = min(cap, base * 2**attempt)``, ``attempt`` = the status
requests made so far, actual uniform in [50%, 100%] of raw from the draw, S6; after a 429 without
Retry-After, the contract's markedly longer 429 delay, S21) and a valid Retry-After (RFC 9110
§10.2.3, never poll before it, S20). A validated provider hint, if no Retry-After came, replaces
the backoff (S8: wait until the hint or the deadline, whichever first). Without a Retry-After,
IETF RateLimit pacing may push it later. The poll is never scheduled past the deadline: it is
clamped to the deadline, where the wake-up stops. ``PollScheduled`` names the delay's source
(S38).

Every stop is ``OperationStopped`` + ``EscalationRaised`` with the context of S27 and the
finite options of ``replay.tables.REASON_OPTIONS``, filtered by the contract (cancel only if
documented; resubmission only with idempotency and a recorded key, S29), each with its numbers.

On a human decision (S36)
-------------------------
An offered option of the open escalation becomes ``DecisionRecorded`` with the approver: a
resuming option is a new authorization (its time added to the deadline, or to ``now`` if the
deadline has passed, its checks and failures added to the budgets: ``replay.extension``; older
logs' operations keep their rule, at least ``now + add_seconds`` and ``used + added``; counters
are never reset, S17) followed by a ``PollScheduled`` with source ``manual_extension``; any
other decision is ``DecisionRejected`` with a reason and changes nothing.

On a quota deferral
-------------------
A live operation's next poll moves to the quota's time (source ``local_quota``), never earlier
than it was and never past the deadline.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import msgspec

from replay.contract import Contract, contract_digest
from replay.errors import InvalidInputError
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    DelaySource,
    EscalationContext,
    EscalationRaised,
    Event,
    HintRejected,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    OperationWithdrawn,
    Option,
    OptionKind,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    ResponseClassified,
    StatusRequestIntended,
    StatusResponseReceived,
    StopReason,
    TransportFailed,
)
from replay.extension import extended, extension_label
from replay.observations import (
    MAX_ID_LENGTH,
    DecisionSubmitted,
    InternalFault,
    Observation,
    QuotaDeferred,
    Registration,
    WakeUp,
    Withdrawal,
)
from replay.reading import Reading, Refusal, read_response
from replay.state import Operation, evolve
from replay.tables import OPTION_EFFECTS, REASON_OPTIONS, TRANSPORT_KINDS
from replay.text import cap, format_time

__all__ = [
    "RegistrationProblem",
    "backoff_delay",
    "decide",
    "decide_reading",
    "format_time",
    "register",
]

#: Why a registration was rejected (``RegistrationRejected.reason``).
RegistrationProblem = Literal[
    "provider_mismatch",
    "invalid_operation_id",
    "empty_job_id",
    "job_id_too_long",
    "job_id_not_printable",
    "invalid_field",
    "started_in_future",
    "deadline_not_in_future",
    "business_deadline_not_in_future",
    "budget_not_positive",
    "unknown_expected_state",
    "over_limit",  # more than the profile lets a registration ask for (S10)
]

_MAX_ATTEMPT: Final = 62  # 2**62 * any base is past every cap; keeps the float finite


def backoff_delay(contract: Contract, attempt: int, draw: float) -> tuple[float, float]:
    """Exponential backoff with a cap and floored jitter (S6).

    Args:
        contract: Gives base and cap.
        attempt: The number of completed polls.
        draw: The jitter draw in [0, 1).

    Returns:
        ``(raw, actual)``: ``raw = min(cap, base * 2**attempt)``, ``actual`` uniform in
        [50%, 100%] of ``raw``.
    """
    raw = min(
        contract.backoff_cap_seconds,
        contract.backoff_base_seconds * 2.0 ** min(max(attempt, 0), _MAX_ATTEMPT),
    )
    return raw, raw * (0.5 + 0.5 * draw)  # S6: floored jitter, not full jitter


# --- registration --------------------------------------------------------------------------------


def _printable(text: str) -> bool:
    return all(0x20 <= ord(c) != 0x7F for c in text) and text == text.strip()


def register(
    request: Registration,
    contract: Contract,
    now: float,
    *,
    registered_by: str = "",
    registered_by_uid: int | None = None,
) -> list[Event]:
    """Validate a registration and return the operation record (S5, S10, S12, S28).

    The daemon checks that the operation id is new in the log; this checks everything else.

    Args:
        request: The registration.
        contract: The contract of the provider it names.
        now: The current time (POSIX seconds, UTC).
        registered_by: Who asked, as the daemon knows it (never from the request itself).
        registered_by_uid: That user's uid.

    Returns:
        ``[OperationRegistered]`` with the contract's defaults filled in, or
        ``[RegistrationRejected]`` with the first problem found.

    Raises:
        InvalidInputError: ``now`` is not finite.
    """
    _check_now(now)

    def reject(reason: RegistrationProblem, detail: str) -> list[Event]:
        return [
            RegistrationRejected(
                operation_id=request.operation_id[:MAX_ID_LENGTH],
                at=now,
                reason=reason,
                detail=detail,
            )
        ]

    if request.provider != contract.provider:
        return reject("provider_mismatch", "the registration names another provider")
    if not (0 < len(request.operation_id) <= MAX_ID_LENGTH) or not _printable(request.operation_id):
        return reject("invalid_operation_id", f"operation id must be 1-{MAX_ID_LENGTH} printable")
    job_id = request.provider_job_id
    if not job_id:
        return reject("empty_job_id", "the provider job id is empty")
    if len(job_id) > MAX_ID_LENGTH:
        return reject("job_id_too_long", f"the provider job id exceeds {MAX_ID_LENGTH} chars")
    if not _printable(job_id):
        return reject("job_id_not_printable", "the provider job id has control characters")
    for name in ("account_context", "request_fingerprint"):
        value: str = getattr(request, name)
        if len(value) > MAX_ID_LENGTH or not all(0x20 <= ord(c) != 0x7F for c in value):
            return reject("invalid_field", f"{name} is too long or not printable")
    started_at = now if request.started_at is None else request.started_at
    if not math.isfinite(started_at) or started_at > now:
        return reject("started_in_future", "the job cannot have started after now")
    deadline_at = (
        now + contract.default_deadline_seconds
        if request.deadline_at is None
        else request.deadline_at
    )
    if not math.isfinite(deadline_at) or deadline_at <= now:
        return reject("deadline_not_in_future", "the deadline must be in the future")
    business = request.business_deadline_at
    if business is not None and (not math.isfinite(business) or business <= now):
        return reject("business_deadline_not_in_future", "the business deadline has passed")
    budgets = (
        request.max_status_requests,
        request.max_transport_failures,
        request.max_rate_limited,
    )
    if any(b is not None and b < 1 for b in budgets):
        return reject("budget_not_positive", "every budget must be at least 1")
    # S10: every operation ends; the profile bounds what a registration may ask for.
    for latest, name in ((deadline_at, "deadline"), (business, "business deadline")):
        if latest is not None and latest - now > contract.limit_deadline_seconds:
            return reject(
                "over_limit",
                f"the {name} {latest - now:.6g} s from now exceeds the "
                f"profile's limit_deadline_seconds {contract.limit_deadline_seconds:g}",
            )
    for asked, limit in zip(
        budgets,
        ("limit_status_requests", "limit_transport_failures", "limit_rate_limited"),
        strict=True,
    ):
        if asked is not None and asked > getattr(contract, limit):
            return reject(
                "over_limit",
                f"a budget of {asked} exceeds the profile's {limit} {getattr(contract, limit)}",
            )
    expected = request.expected_terminal_state
    if expected is not None and expected not in contract.success_states:
        return reject("unknown_expected_state", "the expected state is not a success state")
    first_after = request.first_poll_after_seconds
    if first_after is None:
        first_after = contract.first_poll_after_seconds
    if first_after is None:
        first_after = contract.backoff_base_seconds  # S7: the provider's own schedule
    if not math.isfinite(first_after) or first_after < 0:
        return reject("invalid_field", "first_poll_after_seconds must be a non-negative number")
    effective = deadline_at if business is None else min(deadline_at, business)
    return [
        OperationRegistered(
            operation_id=request.operation_id,
            at=now,
            provider=request.provider,
            provider_job_id=job_id,
            account_context=request.account_context,
            request_fingerprint=request.request_fingerprint,
            expected_terminal_state=expected,
            idempotency_key=request.idempotency_key,
            status_location=request.status_location,
            started_at=started_at,
            deadline_at=deadline_at,
            business_deadline_at=business,
            max_status_requests=request.max_status_requests or contract.default_max_status_requests,
            max_transport_failures=(
                request.max_transport_failures or contract.default_max_transport_failures
            ),
            max_rate_limited=request.max_rate_limited or contract.default_max_rate_limited,
            first_poll_at=min(now + first_after, effective),
            contract=contract,
            contract_digest=contract_digest(contract),
            registered_by=registered_by,
            registered_by_uid=registered_by_uid,
            extend_rule="add",
        )
    ]


# --- decide --------------------------------------------------------------------------------------


def _check_now(now: float) -> None:
    if not isinstance(now, int | float) or not math.isfinite(now):
        raise InvalidInputError("now must be a finite number of POSIX seconds")


def _check_draw(draw: float) -> None:
    if not isinstance(draw, int | float) or not 0.0 <= draw < 1.0:
        raise InvalidInputError("draw must be a number in [0, 1)")


def decide(op: Operation, observation: Observation, now: float, draw: float) -> list[Event]:
    """Decide what one observation means for one operation (see the theory of operation).

    Args:
        op: The operation's state, already evolved with ``observation`` if it is a stored fact.
        observation: What happened.
        now: The current time (POSIX seconds, UTC); recorded as ``at`` of every event returned.
        draw: A jitter draw in [0, 1); recorded in ``PollScheduled.draw`` where used.

    Returns:
        The events to append, in order; possibly none.

    Raises:
        InvalidInputError: ``now`` is not finite, ``draw`` is outside [0, 1), or the
            observation belongs to another operation.
    """
    _check_now(now)
    _check_draw(draw)
    match observation:
        case WakeUp():
            return _on_wake_up(op, now, timer_elapsed=observation.timer_elapsed)
        case InternalFault():
            if op.phase != "live":
                return []  # already stopped: the fault changes nothing a human must decide
            return _stop(op, "internal_error", observation.detail, now, op.status_requests_used)
        case QuotaDeferred():
            return _on_quota(op, observation, now)
        case DecisionSubmitted():
            return _on_decision(op, observation, now)
        case Withdrawal():
            if op.phase not in ("live", "escalated"):
                return []  # already ended: nothing left to stop
            return [
                OperationWithdrawn(
                    operation_id=op.operation_id,
                    at=now,
                    by=observation.by,
                    by_uid=observation.by_uid,
                    note=cap(observation.note, 1000),
                )
            ]
        case StatusResponseReceived() | TransportFailed() | RequestOutcomeUnknown():
            if observation.operation_id != op.operation_id:
                raise InvalidInputError("the observation belongs to another operation")
            if op.phase != "live" or observation.request_number != op.status_requests_used:
                return []  # a stale or late outcome: recorded as a fact, it decides nothing
            if isinstance(observation, StatusResponseReceived):
                reading = read_response(op, observation, now)
                return _on_reading(op, reading, observation.request_number, now, draw)
            return _on_transport(op, observation, now, draw)
    raise InvalidInputError(f"not an observation: {type(observation).__name__}")


def _on_wake_up(op: Operation, now: float, *, timer_elapsed: bool = False) -> list[Event]:
    # S32 step 1: terminal or escalated (or a request still in flight) -> nothing.
    if op.phase != "live" or op.in_flight is not None:
        return []
    # S32 step 2, S9, S13, S16: the deadline first, before any request.
    deadline, _ = op.effective_deadline
    if now >= deadline:
        return _deadline_stop(op, now, 0)
    # S32 step 3, S17: would the next request exceed the budget?
    if op.status_requests_used + 1 > op.max_status_requests:
        return _budget_stop(op, now, 0)
    # S32 step 4: not yet due -> nothing. The wait is an interval: when the daemon's monotonic
    # timer says it has elapsed, a wall clock set back since does not stretch it.
    early = now < op.next_poll_at
    if early and not timer_elapsed:
        return []
    # S32 step 5, S13: counted before transmitting; the daemon makes this durable first.
    return [
        StatusRequestIntended(
            operation_id=op.operation_id,
            at=now,
            request_number=op.status_requests_used + 1,
            deadline_at=deadline,
            max_status_requests=op.max_status_requests,
            due_by_timer=early,
        )
    ]


def _on_quota(op: Operation, deferral: QuotaDeferred, now: float) -> list[Event]:
    if op.phase != "live" or not math.isfinite(deferral.until):
        return []
    deadline, _ = op.effective_deadline
    target = max(op.next_poll_at, deferral.until)
    if target <= op.next_poll_at and op.next_poll_at > now:
        return []  # the quota asks for nothing the schedule does not already do
    next_poll_at = max(now, min(target, deadline))
    return [
        PollScheduled(
            operation_id=op.operation_id,
            at=now,
            next_poll_at=next_poll_at,
            delay_source="local_quota",
            raw_delay=max(0.0, deferral.until - now),
            delay=next_poll_at - now,
            until=deferral.until,
            clamped_to_deadline=target > deadline,
        )
    ]


# --- responses -----------------------------------------------------------------------------------


def decide_reading(
    op: Operation, reading: Reading, request_number: int, now: float, draw: float
) -> list[Event]:
    """The rules after a response, applied to what was read from it.

    :func:`decide` calls this for a ``StatusResponseReceived`` that answers the request in
    flight, with :func:`replay.reading.read_response`'s reading; alone, it lets the rules be
    exercised on any reading.

    Args:
        op: The operation's state, already evolved with the response.
        reading: What the response said.
        request_number: The request it answers.
        now: The current time (POSIX seconds, UTC).
        draw: A jitter draw in [0, 1).

    Returns:
        ``ResponseClassified``, any ``HintRejected``, then ``PollScheduled``, a stop
        (``OperationStopped``, ``EscalationRaised``) or ``OperationSucceeded``.

    Raises:
        InvalidInputError: ``now`` is not finite or ``draw`` is outside [0, 1).
    """
    _check_now(now)
    _check_draw(draw)
    return _on_reading(op, reading, request_number, now, draw)


def _on_reading(
    op: Operation, reading: Reading, number: int, now: float, draw: float
) -> list[Event]:
    contract = op.contract
    retry_after_at, pacing = reading.retry_after_at, reading.pacing
    classified = ResponseClassified(
        operation_id=op.operation_id,
        at=now,
        request_number=number,
        http_status=reading.http_status,
        http_outcome=reading.http_outcome,
        job_state=reading.job_state,
        job_outcome=reading.job_outcome,
        provider_request_id=reading.provider_request_id,
        retry_after_at=retry_after_at,
    )
    events: list[Event] = [classified, *_refused(op, reading.header_refusals, now, number)]
    op = evolve(op, classified)

    def stop(
        reason: StopReason, detail: str, error: str | None = None, truncated: bool = False
    ) -> list[Event]:
        return events + _stop(
            op,
            reason,
            detail,
            now,
            number,
            retry_after_at,
            provider_error=error,
            provider_error_truncated=truncated,
        )

    status = reading.http_status
    outcome = reading.http_outcome
    if outcome == "auth_denied":
        # S24: stop at once; never again with the same credential.
        return stop("authorization_denied", f"HTTP {status}: the credential was refused")
    if outcome in ("redirect", "unexplained"):
        return stop("integration_failure", f"HTTP {status} is not explained by the contract")
    if outcome == "not_found":
        if now - op.started_at >= contract.not_found_grace_seconds:
            # S23: with the job id and the time.
            return stop(
                "not_found",
                f"job {op.provider_job_id!r} not found (HTTP 404) at {format_time(now)}, "
                f"{now - op.started_at:.0f} s after it started, past the "
                f"{contract.not_found_grace_seconds:g} s grace window",
            )
        # S23: not yet visible.
        return events + _wait(op, now, draw, number, retry_after_at, pacing=pacing)
    if outcome == "rate_limited":
        if op.rate_limited_used >= op.max_rate_limited:
            return stop(
                "rate_limited",
                f"HTTP 429 {op.rate_limited_used} of {op.max_rate_limited} times"
                if status == 429
                else f"rate-limited {op.rate_limited_used} of {op.max_rate_limited} times; "
                f"last: HTTP {status} with no requests remaining",
            )
        return events + _wait(
            op,
            now,
            draw,
            number,
            retry_after_at,
            rate_limited=True,
            pacing=pacing,
            reset_at=reading.rate_limit_reset_at,
        )
    if outcome == "server_error":
        if op.transport_failures_used >= op.max_transport_failures:
            # S18, S25: the transport-failure budget is spent.
            return stop(
                "delivery_ambiguous",
                f"transport-failure budget spent ({op.transport_failures_used} of "
                f"{op.max_transport_failures}); last: HTTP {status}",
            )
        return events + _wait(op, now, draw, number, retry_after_at, pacing=pacing)

    # A contract 2xx: the body carries the job state.
    if reading.unreadable is not None:
        return stop(reading.unreadable.reason, reading.unreadable.detail)
    state = reading.job_state or ""
    if reading.job_outcome == "success":
        return events + _success(op, reading, state, now, number)
    if reading.job_outcome == "failure":
        return stop(
            "provider_failure",
            f"the job reported {state!r}",
            reading.provider_error,
            reading.provider_error_truncated,
        )
    if reading.job_outcome == "canceled":
        return stop("canceled", f"the job reported {state!r}; it is not resubmitted")  # S29
    if reading.job_outcome == "expired":
        return stop("expired", f"the job reported {state!r}; it is not resubmitted")  # S29
    if reading.job_outcome == "unknown":
        if contract.state_rules:  # the state names what the rules looked at (replay/rules.py)
            return stop("unknown_state", f"{state}: no state rule classifies this answer")
        return stop("unknown_state", f"state {state!r} is in no list of the state table")

    # Pending. S4: "running" past the job's own expiry is a contradiction.
    expires_at = reading.expires_at
    if expires_at is not None and now > expires_at:
        return stop(
            "contradiction",
            f"state {state!r} past the job's own expiry {format_time(expires_at)}",
        )
    # S8: provider hints are advice, validated; the refusals are recorded.
    events += _refused(op, reading.body_refusals, now, number)
    return events + _wait(
        op, now, draw, number, retry_after_at, hint_at=reading.hint_at, pacing=pacing
    )


def _refused(op: Operation, refusals: tuple[Refusal, ...], now: float, number: int) -> list[Event]:
    """A ``HintRejected`` for each value the reading did not take (S8)."""
    return [
        HintRejected(
            operation_id=op.operation_id,
            at=now,
            request_number=number,
            hint=r.hint,
            value=r.value,
            reason=r.reason,
        )
        for r in refusals
    ]


def _on_transport(
    op: Operation, failure: TransportFailed | RequestOutcomeUnknown, now: float, draw: float
) -> list[Event]:
    number = failure.request_number
    if isinstance(failure, TransportFailed):
        kind: str = failure.kind
        if TRANSPORT_KINDS[failure.kind] == "integration":
            return _stop(
                op, "integration_failure", "the response body exceeded the size cap", now, number
            )
    else:
        kind = "outcome unknown after a restart"  # S11: counted, delivery ambiguous
    if op.transport_failures_used >= op.max_transport_failures:
        # S18: the request may or may not have reached the provider, and the budget is spent.
        return _stop(
            op,
            "delivery_ambiguous",
            f"transport-failure budget spent ({op.transport_failures_used} of "
            f"{op.max_transport_failures}); last: {kind}",
            now,
            number,
        )
    # A timeout does not prove the job failed: observe again (S10).
    return _wait(op, now, draw, number, None)


def _success(op: Operation, reading: Reading, state: str, now: float, number: int) -> list[Event]:
    expected = op.expected_terminal_state
    if expected is not None and state != expected:
        return _stop(
            op,
            "contradiction",
            f"success state {state!r} is not the expected {expected!r}",
            now,
            number,
        )
    if reading.missing_result is not None:
        # S4, S14: a success without what the next step needs is not consumed.
        return _stop(
            op, "contradiction", f"state {state!r} but {reading.missing_result}", now, number
        )
    return [
        OperationSucceeded(
            operation_id=op.operation_id,
            at=now,
            request_number=number,
            state=state,
            results=dict(reading.results),
        )
    ]


def _wait(
    op: Operation,
    now: float,
    draw: float,
    number: int,
    retry_after_at: float | None,
    *,
    rate_limited: bool = False,
    hint_at: float | None = None,
    pacing: float | None = None,
    reset_at: float | None = None,
) -> list[Event]:
    """Schedule the next poll, or stop if waiting is not allowed (S6, S8, S16, S17, S20, S21).

    ``reset_at`` is the provider's own rate-limit reset: like Retry-After, no poll before it,
    but clamped to the deadline rather than a stop (the deadline then stops the operation)."""
    contract = op.contract
    deadline, which = op.effective_deadline
    if now >= deadline:
        return _deadline_stop(op, now, number)  # S16: even if the state just changed
    if op.status_requests_used >= op.max_status_requests:
        return _budget_stop(op, now, number)  # S17: the next request would exceed it
    if retry_after_at is not None and retry_after_at >= deadline:
        # S20: the provider asks us to wait past the deadline: do not poll again.
        return _stop(
            op,
            "retry_after_past_deadline",
            f"Retry-After asks to wait until {format_time(retry_after_at)}, at or past the "
            f"{which} deadline {format_time(deadline)}",
            now,
            number,
            retry_after_at,
        )
    if rate_limited and retry_after_at is None and reset_at is None:
        raw = contract.rate_limited_delay_seconds  # S21: markedly longer without guidance
        actual = raw * (0.5 + 0.5 * draw)
    else:
        raw, actual = backoff_delay(contract, op.status_requests_used, draw)  # S6
    source: DelaySource = "local_backoff"
    target = now + actual
    until: float | None = None
    if retry_after_at is not None:
        if retry_after_at >= target:  # S20: never poll before Retry-After
            source, target, raw = "provider_retry_after", retry_after_at, retry_after_at - now
        until = retry_after_at
    elif hint_at is not None:  # S8: wait until the hint (the deadline is checked above)
        source, target, raw, until = "provider_poll_hint", hint_at, hint_at - now, hint_at
    if reset_at is not None and reset_at > target:  # never poll before the provider's reset
        source, target, raw, until = "provider_retry_after", reset_at, reset_at - now, reset_at
    if retry_after_at is None and pacing is not None and now + pacing > target:
        source, target, raw = "rate_limit_policy", now + pacing, pacing
    next_poll_at = max(now, min(target, deadline))
    return [
        PollScheduled(
            operation_id=op.operation_id,
            at=now,
            next_poll_at=next_poll_at,
            delay_source=source,
            raw_delay=raw,
            delay=next_poll_at - now,
            draw=draw,
            until=until,
            clamped_to_deadline=target > deadline,
        )
    ]


# --- stops and escalations -----------------------------------------------------------------------


def _deadline_stop(op: Operation, now: float, number: int) -> list[Event]:
    deadline, which = op.effective_deadline
    last = "none observed" if op.last_state is None else repr(op.last_state)
    if which == "business":
        return _stop(
            op,
            "business_deadline_exceeded",
            f"business deadline {format_time(deadline)} reached before the operation deadline "
            f"{format_time(op.deadline_at)}; last state {last}",
            now,
            number,
        )
    return _stop(
        op,
        "deadline_exceeded",
        f"operation deadline {format_time(deadline)} reached; last state {last}",
        now,
        number,
    )


def _budget_stop(op: Operation, now: float, number: int) -> list[Event]:
    return _stop(
        op,
        "request_budget_exhausted",
        f"{op.status_requests_used} of {op.max_status_requests} status requests used",
        now,
        number,
    )


def _options(
    op: Operation, reason: StopReason, now: float, retry_after_at: float | None
) -> tuple[Option, ...]:
    contract = op.contract
    options: list[Option] = []
    for kind in REASON_OPTIONS[reason]:
        if kind == "cancel_at_provider" and not contract.cancel_documented:
            continue  # S27: only where the profile documents a cancel call
        if kind == "retry_same_idempotency_key" and not (
            contract.idempotent_submit and op.idempotency_key is not None
        ):
            continue  # S29: never resubmit without idempotency and a persisted key
        options.append(_option(op, kind, reason, now, retry_after_at))
    return tuple(options)


def _option(
    op: Operation,
    kind: OptionKind,
    reason: StopReason,
    now: float,
    retry_after_at: float | None,
) -> Option:
    contract = op.contract
    if OPTION_EFFECTS[kind]:
        add_seconds = contract.extend_seconds
        if reason == "retry_after_past_deadline" and retry_after_at is not None:
            # Concrete numbers: enough time to honour the Retry-After, then the usual extension.
            add_seconds += math.ceil(max(0.0, retry_after_at - now))
        params = {
            "add_seconds": add_seconds,
            "add_status_requests": contract.extend_status_requests,
            "add_transport_failures": contract.default_max_transport_failures,
            "add_rate_limited": contract.default_max_rate_limited,
        }
        label = extension_label(op, kind, params, reason, now)
        return Option(id=kind, label=label, params=params)
    labels: dict[OptionKind, str] = {
        "cancel_at_provider": "cancel the job at the provider (documented cancel call)",
        "retry_same_idempotency_key": "resubmit with the recorded idempotency key",
        "inspect_provider_console": "inspect the job in the provider console; bide stops waiting",
        "abandon": "abandon: stop waiting; the job's result is not used",
    }
    return Option(id=kind, label=labels[kind])


def _stop(
    op: Operation,
    reason: StopReason,
    detail: str,
    now: float,
    number: int,
    retry_after_at: float | None = None,
    *,
    provider_error: str | None = None,
    provider_error_truncated: bool = False,
) -> list[Event]:
    """``OperationStopped`` then ``EscalationRaised`` with the S27 context and options."""
    stopped = OperationStopped(
        operation_id=op.operation_id,
        at=now,
        reason=reason,
        detail=detail,
        last_state=op.last_state,
        provider_error=provider_error,
        provider_error_truncated=provider_error_truncated,
        request_number=number,
    )
    context = EscalationContext(
        operation_id=op.operation_id,
        provider=op.provider,
        provider_job_id=op.provider_job_id,
        reason=reason,
        detail=detail,
        last_state=op.last_state,
        last_state_at=op.last_state_at,
        elapsed_seconds=max(0.0, now - op.started_at),
        started_at=op.started_at,
        deadline_at=op.deadline_at,
        business_deadline_at=op.business_deadline_at,
        status_requests_used=op.status_requests_used,
        max_status_requests=op.max_status_requests,
        transport_failures_used=op.transport_failures_used,
        max_transport_failures=op.max_transport_failures,
        rate_limited_used=op.rate_limited_used,
        max_rate_limited=op.max_rate_limited,
        last_http_status=op.last_http_status,
        last_http_at=op.last_http_at,
        last_provider_request_id=op.last_provider_request_id,
        histogram=op.histogram,
    )
    raised = EscalationRaised(
        operation_id=op.operation_id,
        at=now,
        escalation_id=op.escalations_raised + 1,
        reason=reason,
        options=_options(op, reason, now, retry_after_at),
        context=context,
    )
    return [stopped, raised]


# --- decisions -----------------------------------------------------------------------------------


def _on_decision(op: Operation, decision: DecisionSubmitted, now: float) -> list[Event]:
    def reject(reason: str) -> list[Event]:
        return [
            DecisionRejected(
                operation_id=op.operation_id,
                at=now,
                option_id=cap(decision.option, 64),
                approver=cap(decision.approver, 64),
                note=cap(decision.note, 1000),
                escalation_id=decision.escalation_id,
                reason=reason,
            )
        ]

    escalation = op.escalation
    if op.phase != "escalated" or escalation is None:
        return reject(f"the operation is {op.phase}; no escalation awaits a decision")
    if decision.escalation_id is not None and decision.escalation_id != escalation.escalation_id:
        return reject(
            f"the decision names escalation {decision.escalation_id}; "
            f"the open escalation is {escalation.escalation_id}"
        )
    if not decision.approver.strip():
        return reject("the decision has no approver")
    chosen = next((o for o in escalation.options if o.id == decision.option), None)
    if chosen is None:
        offered = ", ".join(o.id for o in escalation.options)
        return reject(f"option {cap(decision.option, 64)!r} was not offered; offered: {offered}")
    base = DecisionRecorded(
        operation_id=op.operation_id,
        at=now,
        escalation_id=escalation.escalation_id,
        option_id=chosen.id,
        approver=cap(decision.approver, 64),
        note=cap(decision.note, 1000),
        resumes=False,
        new_deadline_at=op.deadline_at,
        new_business_deadline_at=op.business_deadline_at,
        new_max_status_requests=op.max_status_requests,
        new_max_transport_failures=op.max_transport_failures,
        new_max_rate_limited=op.max_rate_limited,
        follow_up=chosen.id,
        self_approved=decision.self_approved,
    )
    if not OPTION_EFFECTS[chosen.id]:
        return [base]  # S34: cancel, resubmit, hand-off are separate operations
    # S36: a new authorization, by the operation's extend rule (replay.extension). S17:
    # budgets grow; counters stay.
    new = extended(op, chosen.params, escalation.reason, now)
    recorded = msgspec.structs.replace(
        base,
        resumes=True,
        follow_up=None,
        new_deadline_at=new.deadline_at,
        new_business_deadline_at=new.business_deadline_at,
        new_max_status_requests=new.max_status_requests,
        new_max_transport_failures=new.max_transport_failures,
        new_max_rate_limited=new.max_rate_limited,
    )
    resumed = evolve(op, recorded)
    deadline, _ = resumed.effective_deadline
    target = max(now, resumed.not_before or now)  # S20: an extension does not skip guidance
    next_poll_at = max(now, min(target, deadline))
    scheduled = PollScheduled(
        operation_id=op.operation_id,
        at=now,
        next_poll_at=next_poll_at,
        delay_source="manual_extension",
        raw_delay=target - now,
        delay=next_poll_at - now,
        clamped_to_deadline=target > deadline,
    )
    return [recorded, scheduled]
