"""What bide would make of one provider answer, without sending a request.

``bide check-profile PROFILE --sample BODY.json`` uses :func:`read_sample`: it registers a
synthetic operation under the profile's contract, takes it to its first status request, and
hands the model the answer given, exactly as the daemon's poller would
(:func:`replay.reading.read_response` for the facts, :func:`replay.decide` for the decision).
So what it prints is what the daemon would read and decide, not a re-implementation of it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.profile import Profile
from replay import (
    Registration,
    ResponseHeaders,
    StatusResponseReceived,
    WakeUp,
    decide,
    evolve,
    register,
)
from replay.reading import read_response
from replay.signals import parse_json, resolve_pointer

__all__ = ["SampleError", "parse_header", "read_sample"]

#: The synthetic operation's registration time (any fixed instant: the sample is timeless).
_NOW = 1_800_000_000.0
_OPERATION = "check-profile-sample"


class SampleError(Exception):
    """The sample cannot be tried (a header that does not parse, a rejected registration)."""


_HEADER_FIELDS = {
    "retry-after": "retry_after",
    "ratelimit": "ratelimit",
    "ratelimit-policy": "ratelimit_policy",
    "location": "location",
    "content-type": "content_type",
}


def parse_header(profile: Profile, text: str, into: dict[str, str]) -> None:
    """``Name: value`` into the :class:`replay.ResponseHeaders` field bide reads it as."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise SampleError(f"--header {text!r}: write it as 'Name: value'")
    key = name.strip().lower()
    contract = profile.contract
    own = {
        header.lower(): field
        for header, field in (
            (contract.rate_limit_remaining_header, "ratelimit_remaining"),
            (contract.rate_limit_reset_header, "ratelimit_reset"),
        )
        if header is not None
    }
    if key == profile.status.request_id_header.lower():
        into["request_id"] = value.strip()
    elif key in own:
        into[own[key]] = value.strip()
    elif key in _HEADER_FIELDS:
        into[_HEADER_FIELDS[key]] = value.strip()
    else:
        also = "".join(
            f", {h}"
            for h in (contract.rate_limit_remaining_header, contract.rate_limit_reset_header)
            if h is not None
        )
        raise SampleError(
            f"--header {name.strip()!r}: bide does not read it; it reads Retry-After, "
            f"RateLimit, RateLimit-Policy, Location, Content-Type{also} and "
            f"{profile.status.request_id_header}"
        )


def read_sample(
    profile: Profile,
    body: bytes,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
    job_id: str | None = None,
) -> dict[str, Any]:
    """How the daemon would read ``body`` (answering a first status request) and what it would
    decide, as a JSON-ready dictionary.

    Args:
        profile: The profile.
        body: The status body, as the provider would send it.
        status: The HTTP status.
        headers: The headers, as :class:`replay.ResponseHeaders` fields.
        job_id: The registered job id; unset: the id the body names (identity then holds).

    Raises:
        SampleError: The synthetic operation could not be registered.
    """
    contract = profile.contract
    named: str | None = None
    if contract.job_id_pointer is not None:
        parsed, document = parse_json(body)
        if parsed:
            found, value = resolve_pointer(document, contract.job_id_pointer)
            if found and isinstance(value, str | int) and not isinstance(value, bool):
                named = str(value)
    registered_id = job_id or named or "sample-job"
    registration = Registration(
        operation_id=_OPERATION, provider=profile.name, provider_job_id=registered_id
    )
    events = register(registration, contract, _NOW)
    if events[0].__struct_config__.tag != "operation_registered":
        raise SampleError(f"cannot register a sample operation: {msgspec.to_builtins(events[0])}")
    op = evolve(None, events[0])
    now = op.next_poll_at or _NOW
    for event in decide(op, WakeUp(), now, 0.5):
        op = evolve(op, event)
    response = StatusResponseReceived(
        operation_id=_OPERATION,
        at=now,
        request_number=op.status_requests_used,
        status_code=status,
        headers=msgspec.convert(headers or {}, ResponseHeaders),
        body=body[: profile.status.max_body_bytes],
        body_truncated=len(body) > profile.status.max_body_bytes,
    )
    reading = read_response(op, response, now)
    op = evolve(op, response)
    decision = decide(op, response, now, 0.5)
    identity: str
    if contract.job_id_pointer is None:
        identity = "not checked (the profile sets no job_id_pointer)"
    elif reading.unreadable is not None and reading.unreadable.reason == "contradiction":
        identity = f"about another job than {registered_id!r}"
    elif named is None:
        identity = f"no job id at {contract.job_id_pointer}"
    else:
        identity = f"job {named!r} " + (
            "(the registered id)" if job_id is not None else "(pass --job-id to check it)"
        )
    return {
        "provider": profile.name,
        "http_status": status,
        "http_outcome": reading.http_outcome,
        "state": reading.job_state,
        "category": reading.job_outcome,
        "unreadable": None
        if reading.unreadable is None
        else {"reason": reading.unreadable.reason, "detail": reading.unreadable.detail},
        "identity": identity,
        "results": dict(reading.results),
        "missing_result": reading.missing_result,
        "provider_error": reading.provider_error,
        "hints": {
            "retry_after_in_seconds": None
            if reading.retry_after_at is None
            else round(reading.retry_after_at - now, 3),
            "poll_hint_in_seconds": None
            if reading.hint_at is None
            else round(reading.hint_at - now, 3),
            "pacing_seconds": reading.pacing,
            "rate_limit_reset_in_seconds": None
            if reading.rate_limit_reset_at is None
            else round(reading.rate_limit_reset_at - now, 3),
            "refused": [
                {"hint": r.hint, "value": r.value, "reason": r.reason}
                for r in (*reading.header_refusals, *reading.body_refusals)
            ],
        },
        "decision": [_event(event, now) for event in decision],
    }


def _event(event: object, now: float) -> dict[str, Any]:
    """An event the model would record, without the synthetic operation's id; times as offsets
    from the answer ("in_seconds")."""
    data = msgspec.to_builtins(event)
    out: dict[str, Any] = {"event": type(event).__struct_config__.tag}  # type: ignore[attr-defined]
    for key, value in data.items():
        if key in ("operation_id", "at", "type"):
            continue
        if key.endswith("_at") and isinstance(value, float):
            out[f"{key[:-3]}_in_seconds"] = round(value - now, 3)
        else:
            out[key] = value
    return out
