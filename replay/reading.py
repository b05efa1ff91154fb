"""Reading a provider's answer: one status response turned into facts, before any rule applies.

:func:`read_response` takes what came back (a ``StatusResponseReceived``) and returns a
:class:`Reading`, which :mod:`replay.decide` consumes. It holds:

* the HTTP outcome, apart from the job's (S2): the status looked up in the contract;
* the headers' guidance: a valid Retry-After as an absolute time (RFC 9110 §10.2.3, either
  form), IETF RateLimit pacing within the hint horizon, and, when the provider's own
  remaining-requests header says ``0`` on a 403 or 429 (GitHub's primary rate limit), the
  answer read as rate-limited with its reset header as the earliest next poll;
* for a contract 2xx, what the body says: the job's state and its outcome in the provider's
  state table (S3; a state in no list is ``unknown``, S15), checked to be about the
  registered job (S5); then what that outcome carries: a success's result fields, validated
  (S14); a failure's error, verbatim and capped (S3); a pending job's own expiry and its poll
  hints, validated against the contract's minimum, its horizon and the deadline in force (S8).

A value that was read and not taken (a malformed header, a hint out of range) is a
:class:`Refusal` with its reason, which ``decide`` records as ``HintRejected``. A body that
does not say what the contract needs is an :class:`Unreadable` naming the stop it leads to.
Nothing here raises on what a provider sends (bodies are decoded bounded,
:func:`replay.signals.parse_json`), and nothing here decides: whether to stop, wait or accept
the success is :mod:`replay.decide`'s. Pure, like all of ``replay``: ``now`` is an argument.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from replay.contract import Contract
from replay.events import HintName, HttpOutcome, JobOutcome, StatusResponseReceived
from replay.rules import first_match, unmatched_state
from replay.signals import (
    Rejected,
    parse_epoch_seconds,
    parse_instant,
    parse_json,
    parse_ratelimit,
    parse_ratelimit_policy,
    parse_retry_after,
    parse_seconds,
    resolve_pointer,
    validate_result,
)
from replay.state import Operation
from replay.tables import http_outcome, provider_rate_limited
from replay.text import cap, cap_bytes, format_time, json_text

__all__ = ["BodyProblem", "Reading", "Refusal", "Unreadable", "job_outcome", "read_response"]

#: The most characters of a job state recorded.
_STATE_CAP: Final = 128

#: Why a contract 2xx body cannot be used, as the stop it leads to.
BodyProblem = Literal["integration_failure", "unparseable_response", "contradiction"]


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A header or hint that was read and not taken (S8); recorded as ``HintRejected``.

    Attributes:
        hint: Which one.
        value: What the provider sent, as text, capped.
        reason: Why it was not taken.
    """

    hint: HintName
    value: str
    reason: str


class Unreadable(msgspec.Struct, frozen=True, kw_only=True):
    """A contract 2xx body that does not say what the contract needs: over the size cap
    (``integration_failure``), not JSON or without a state or a job id
    (``unparseable_response``), or about another job than the registered one
    (``contradiction``, S5)."""

    reason: BodyProblem
    detail: str


class Reading(msgspec.Struct, frozen=True, kw_only=True):
    """The facts one status response gives (see the module docstring).

    Attributes:
        http_status: The HTTP status code.
        http_outcome: What the status means under the contract (S2).
        provider_request_id: The provider's request id header, if any.
        retry_after_at: A valid Retry-After, as POSIX seconds.
        pacing: The longest valid RateLimit pacing, in seconds, within the hint horizon.
        rate_limit_reset_at: On a provider-rate-limited answer, a valid reset header as POSIX
            seconds (in the future, within the hint horizon; the wait is clamped to the
            deadline).
        header_refusals: Retry-After, RateLimit and reset values not taken, in that order.
        unreadable: Set when a contract 2xx body cannot be used; the fields below are then
            only as far as they were read.
        job_state: The job's state as the body says it (capped), for a contract 2xx.
        job_outcome: That state's outcome in the state table (S3, S15).
        results: A success's result fields that validated, ``(name, value)`` in the
            contract's order (S14).
        missing_result: Set when a required result field is missing or invalid: which and why.
        provider_error: A failure's error, verbatim, capped to the contract's bytes (S3).
        provider_error_truncated: Whether it was cut.
        expires_at: A pending job's own expiry, when the body gives a valid one (S4).
        hint_at: The latest valid poll hint of a pending job, as POSIX seconds (S8).
        body_refusals: A pending job's expiry and hints not taken, in that order.
    """

    http_status: int
    http_outcome: HttpOutcome
    provider_request_id: str | None = None
    retry_after_at: float | None = None
    pacing: float | None = None
    rate_limit_reset_at: float | None = None
    header_refusals: tuple[Refusal, ...] = ()
    unreadable: Unreadable | None = None
    job_state: str | None = None
    job_outcome: JobOutcome | None = None
    results: tuple[tuple[str, str], ...] = ()
    missing_result: str | None = None
    provider_error: str | None = None
    provider_error_truncated: bool = False
    expires_at: float | None = None
    hint_at: float | None = None
    body_refusals: tuple[Refusal, ...] = ()


def read_response(op: Operation, response: StatusResponseReceived, now: float) -> Reading:
    """What one response says about ``op``'s job, as facts.

    Args:
        op: The operation (its contract, its job id, the deadline in force).
        response: What came back.
        now: The current time (POSIX seconds, UTC): a Retry-After date and the hints are
            validated against it.

    Returns:
        The reading; never raises on anything a provider sends.
    """
    contract = op.contract
    refusals: list[Refusal] = []
    headers = response.headers

    # RFC 9110 §10.2.3: Retry-After, either form, on any response we will wait after.
    retry_after_at: float | None = None
    if headers.retry_after is not None:
        parsed = parse_retry_after(headers.retry_after, now)
        if isinstance(parsed, Rejected):
            refusals.append(
                Refusal(hint="retry_after", value=cap(headers.retry_after), reason=parsed.reason)
            )
        else:
            retry_after_at = parsed

    # IETF RateLimit headers: pacing on any response we wait after (Retry-After takes
    # precedence, in decide); malformed values are recorded and ignored.
    pacing: float | None = None
    hname: HintName
    for hname, value, parser in (
        ("ratelimit", headers.ratelimit, parse_ratelimit),
        ("ratelimit_policy", headers.ratelimit_policy, parse_ratelimit_policy),
    ):
        if value is None:
            continue
        paced = parser(value)
        if isinstance(paced, Rejected):
            refusals.append(Refusal(hint=hname, value=cap(value), reason=paced.reason))
        elif paced is not None and paced > contract.max_hint_horizon_seconds:
            refusals.append(
                Refusal(hint=hname, value=cap(value), reason="pacing beyond the hint horizon")
            )
        elif paced is not None:
            pacing = paced if pacing is None else max(pacing, paced)

    # The provider's own rate limit (GitHub: 403 or 429, x-ratelimit-remaining 0): waited out
    # like a 429, until its reset; a reset that is malformed, past or too far is refused.
    outcome = http_outcome(response.status_code, contract.ok_statuses)
    reset_at: float | None = None
    if provider_rate_limited(response.status_code, headers.ratelimit_remaining):
        outcome = "rate_limited"
        if headers.ratelimit_reset is not None:
            reset = _check_reset(contract, parse_epoch_seconds(headers.ratelimit_reset), now)
            if isinstance(reset, Rejected):
                refusals.append(
                    Refusal(
                        hint="ratelimit_reset",
                        value=cap(headers.ratelimit_reset),
                        reason=reset.reason,
                    )
                )
            else:
                reset_at = reset

    reading = Reading(
        http_status=response.status_code,
        http_outcome=outcome,
        provider_request_id=headers.request_id,
        retry_after_at=retry_after_at,
        pacing=pacing,
        rate_limit_reset_at=reset_at,
        header_refusals=tuple(refusals),
    )
    if reading.http_outcome != "ok":
        return reading
    return _read_body(op, response, now, reading)


def _check_reset(contract: Contract, at: float | Rejected, now: float) -> float | Rejected:
    """A reset time taken only in the future and within the contract's hint horizon (the wait
    it asks for is clamped to the deadline in force by ``decide``)."""
    if isinstance(at, Rejected):
        return at
    if at < now:
        return Rejected("in the past")
    if at - now > contract.max_hint_horizon_seconds:
        return Rejected(f"beyond the hint horizon of {contract.max_hint_horizon_seconds} s")
    return at


def job_outcome(contract: Contract, state: str) -> JobOutcome:
    """What ``state`` means in the contract's state table (S3); in no list: unknown (S15)."""
    table = contract.states
    if table is None:
        return "unknown"
    for category in ("pending", "success", "failure", "canceled", "expired"):
        if state in getattr(table, category):
            outcome: JobOutcome = category
            return outcome
    return "unknown"  # S15: a state in no list is unknown, and unknown stops


def _unreadable(reading: Reading, reason: BodyProblem, detail: str) -> Reading:
    return msgspec.structs.replace(reading, unreadable=Unreadable(reason=reason, detail=detail))


def _read_body(
    op: Operation, response: StatusResponseReceived, now: float, reading: Reading
) -> Reading:
    """The job's state, its identity, and what its outcome carries (a contract 2xx)."""
    contract = op.contract
    if response.body_truncated:
        return _unreadable(reading, "integration_failure", "the body exceeded the size cap")
    parsed, document = parse_json(response.body)  # bounded: never a RecursionError
    if not parsed:
        return _unreadable(reading, "unparseable_response", str(document))
    outcome: JobOutcome
    if contract.state_pointer is None:
        # State rules (replay.rules): the first that matches names the state; none is unknown.
        rule = first_match(contract.state_rules, document)
        if rule is None:
            state, outcome = unmatched_state(contract.state_rules, document, _STATE_CAP), "unknown"
        else:
            state, outcome = rule.state, rule.category
    else:
        found, value = resolve_pointer(document, contract.state_pointer)
        if not found or not isinstance(value, str) or not value:
            return _unreadable(
                reading,
                "unparseable_response",
                f"no job state (a non-empty string) at {contract.state_pointer!r}",
            )
        state, outcome = value, job_outcome(contract, value)
    reading = msgspec.structs.replace(
        reading, job_state=cap(state, _STATE_CAP), job_outcome=outcome
    )
    if contract.job_id_pointer is not None:
        found, job_id = resolve_pointer(document, contract.job_id_pointer)
        if not found or not isinstance(job_id, str | int) or isinstance(job_id, bool):
            return _unreadable(
                reading, "unparseable_response", f"no job id at {contract.job_id_pointer!r}"
            )
        if str(job_id) != op.provider_job_id:
            # S5: the job observed is not the job submitted.
            return _unreadable(
                reading,
                "contradiction",
                f"the response is about another job than {op.provider_job_id!r}",
            )
    if outcome == "success":
        return _read_results(contract, document, reading)
    if outcome == "failure":
        error, truncated = _provider_error(contract, document, response.body)
        return msgspec.structs.replace(
            reading, provider_error=error, provider_error_truncated=truncated
        )
    if outcome == "pending":
        return _read_guidance(op, document, now, reading)
    return reading


def _read_results(contract: Contract, document: object, reading: Reading) -> Reading:
    """A success's result fields: the valid ones, or the first required one that is not
    (S4, S14)."""
    results: list[tuple[str, str]] = []
    for field in contract.results:
        found, value = resolve_pointer(document, field.pointer)
        problem = "is missing" if not found else validate_result(field.kind, value)
        if problem is not None:
            if field.required:
                return msgspec.structs.replace(
                    reading,
                    missing_result=f"required result {field.name!r} ({field.pointer}) {problem}",
                )
            continue
        results.append((field.name, value if isinstance(value, str) else json_text(value)))
    return msgspec.structs.replace(reading, results=tuple(results))


def _provider_error(contract: Contract, document: object, body: bytes) -> tuple[str, bool]:
    """The provider's error, verbatim and capped (S3): at the error pointer, else the body."""
    limit = contract.error_cap_bytes
    if contract.error_pointer is not None:
        found, value = resolve_pointer(document, contract.error_pointer)
        if found and value is not None:
            text = value if isinstance(value, str) else json_text(value)
            return cap_bytes(text, limit)
    return cap_bytes(body.decode("utf-8", errors="replace"), limit)


def _read_guidance(op: Operation, document: object, now: float, reading: Reading) -> Reading:
    """A pending job's own expiry (S4) and its poll hints (S8), validated."""
    contract = op.contract
    refusals: list[Refusal] = []
    expires_at: float | None = None
    if contract.expires_at_pointer is not None:
        found, raw = resolve_pointer(document, contract.expires_at_pointer)
        if found and raw is not None:
            expires = parse_instant(raw)
            if isinstance(expires, Rejected):
                refusals.append(
                    Refusal(hint="expires_at", value=_value_text(raw), reason=expires.reason)
                )
            else:
                expires_at = expires

    # S8: provider hints are advice, validated; the refusals are recorded.
    hint_at: float | None = None
    name: HintName
    for name, pointer in (
        ("next_check_at", contract.next_check_at_pointer),
        ("poll_after_seconds", contract.poll_after_seconds_pointer),
    ):
        if pointer is None:
            continue
        found, raw = resolve_pointer(document, pointer)
        if not found or raw is None:
            continue
        if name == "next_check_at":
            candidate = parse_instant(raw)
        else:
            seconds = parse_seconds(raw)
            candidate = seconds if isinstance(seconds, Rejected) else now + seconds
        checked = _check_hint(op, name, candidate, now)
        if isinstance(checked, Rejected):
            refusals.append(Refusal(hint=name, value=_value_text(raw), reason=checked.reason))
        else:
            hint_at = checked if hint_at is None else max(hint_at, checked)
    return msgspec.structs.replace(
        reading, expires_at=expires_at, hint_at=hint_at, body_refusals=tuple(refusals)
    )


def _check_hint(
    op: Operation, hint: HintName, at: float | Rejected, now: float
) -> float | Rejected:
    """A provider hint resolved to an absolute time, taken only inside the contract's range
    and before the deadline in force (S8)."""
    if isinstance(at, Rejected):
        return at
    contract = op.contract
    deadline, which = op.effective_deadline
    delay = at - now
    if delay < 0:
        return Rejected("negative" if hint == "poll_after_seconds" else "in the past")
    if delay < contract.min_hint_seconds:
        return Rejected(f"sooner than the contract's minimum of {contract.min_hint_seconds} s")
    if delay > contract.max_hint_horizon_seconds:
        return Rejected(f"beyond the hint horizon of {contract.max_hint_horizon_seconds} s")
    if at >= deadline:
        return Rejected(f"past the {which} deadline {format_time(deadline)}")
    return at


def _value_text(value: object) -> str:
    """A JSON value as the text recorded with its refusal (capped)."""
    return cap(value if isinstance(value, str) else json_text(value))
