"""Property tests of reading a response (replay/reading.py), apart from any decision (hypothesis).

Whatever a provider sends: reading never raises, and yields the facts or a typed
``Unreadable``; a hint is taken only inside the contract's range and before the deadline in
force, and is otherwise refused with a reason (S8); numbers, numeric strings and booleans are
read as what they are, never coerced; a provider's error is kept verbatim up to its cap (S3).
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import get_args

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from replay import Contract, Operation, ResponseHeaders, StatusResponseReceived
from replay.events import JobOutcome
from replay.reading import BodyProblem, Reading, job_outcome, read_response
from replay.tables import http_outcome

from .helpers import T0, Daemon, contract

#: Any JSON value Python's json writes (integers beyond a float's range have their own test:
#: test_an_integer_beyond_float_range_as_a_hint_is_refused_not_raised).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
states = st.sampled_from(
    ["queued", "running", "processing", "succeeded", "failed", "canceled", "expired", "paused"]
)
#: Documents shaped like the contract's (every pointer of tests/replay/helpers.py), each field
#: plausible or any JSON value.
documents = st.fixed_dictionaries(
    {
        "job_id": st.just("exp_71c") | st.just("exp_71c") | json_values,
        "state": states | states | json_values,
    },
    optional={
        "result": st.just({"url": "https://files.example.com/r.csv"}) | json_values,
        "next_check_at": st.floats(T0 - 100, T0 + 90_000) | json_values,
        "poll_after_seconds": st.floats(-10, 90_000) | st.integers(-10, 90_000) | json_values,
        "expires_at": st.floats(T0 - 100, T0 + 90_000) | json_values,
        "error": json_values,
    },
)
bodies = (
    documents.map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | st.integers(1, 200).map(lambda n: b"[" * n + b"]" * n)
)
header_text = (
    st.none()
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "5",
            "0",
            "120",
            "Fri, 18 Apr 2025 10:30:00 GMT",
            '"d";r=0;t=30',
            '"d";r=5;t=600',
            "limit=10, remaining=2, reset=40",
            '"p";q=10;w=60',
            "100;w=3600",
        ]
    )
)
statuses = st.sampled_from([200, 201, 202, 204, 301, 302, 401, 403, 404, 418, 429, 500, 503])
contracts = st.builds(
    lambda min_hint, horizon, cap: contract(
        min_hint_seconds=min_hint, max_hint_horizon_seconds=horizon, error_cap_bytes=cap
    ),
    st.sampled_from([0.0, 1.0, 30.0]),
    st.sampled_from([120.0, 3600.0, 86_400.0]),
    st.sampled_from([64, 2048]),
)


def in_flight(c: Contract, **registration: object) -> Operation:
    """An operation whose first status request is in flight."""
    d = Daemon.start(c, T0, **registration)
    d.poll(d.op.next_poll_at)
    return d.op


def response(
    op: Operation,
    now: float,
    status: int = 200,
    body: bytes = b"{}",
    *,
    truncated: bool = False,
    **headers: str | None,
) -> StatusResponseReceived:
    return StatusResponseReceived(
        operation_id=op.operation_id,
        at=now,
        request_number=op.status_requests_used,
        status_code=status,
        headers=ResponseHeaders(**headers),
        body=body,
        body_truncated=truncated,
    )


def pending(**fields: object) -> bytes:
    return json.dumps({"job_id": "exp_71c", "state": "running", **fields}).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=contracts,
    status=statuses,
    body=bodies,
    truncated=st.booleans(),
    retry_after=header_text,
    ratelimit=header_text,
    policy=header_text,
    later=st.floats(0, 5000),
)
def test_any_response_is_read_into_facts_or_a_typed_unreadable(
    c: Contract,
    status: int,
    body: bytes,
    truncated: bool,
    retry_after: str | None,
    ratelimit: str | None,
    policy: str | None,
    later: float,
) -> None:
    op = in_flight(c)
    now = op.next_poll_at + later
    fact = response(
        op,
        now,
        status,
        body,
        truncated=truncated,
        retry_after=retry_after,
        ratelimit=ratelimit,
        ratelimit_policy=policy,
    )
    reading = read_response(op, fact, now)  # never raises
    assert reading == read_response(op, fact, now)  # a function of its arguments only
    assert reading.http_status == status
    assert reading.http_outcome == http_outcome(status, c.ok_statuses)
    body_facts = (
        reading.unreadable,
        reading.job_state,
        reading.job_outcome,
        reading.provider_error,
        reading.expires_at,
        reading.hint_at,
    )
    if reading.http_outcome != "ok":
        assert body_facts == (None,) * 6
        assert reading.body_refusals == ()
        return
    if reading.unreadable is not None:
        assert reading.unreadable.reason in get_args(BodyProblem)
        assert reading.unreadable.detail
        if truncated:
            assert reading.unreadable.reason == "integration_failure"
        return
    assert not truncated
    assert isinstance(reading.job_state, str)
    assert 0 < len(reading.job_state) <= 128
    assert reading.job_outcome in get_args(JobOutcome)
    document = json.loads(body)
    assert document["job_id"] == "exp_71c"  # S5: only the registered job is read on
    assert reading.job_outcome == job_outcome(c, document["state"])  # S3, S15
    if reading.job_outcome != "success":
        assert reading.results == ()
        assert reading.missing_result is None
    if reading.job_outcome != "failure":
        assert reading.provider_error is None
    if reading.job_outcome != "pending":
        assert reading.hint_at is None
        assert reading.expires_at is None
        assert reading.body_refusals == ()


def _expected_time(hint: str, value: object, now: float) -> float | None:
    """What a hint value means as an absolute time, if it means one: the spec, from the
    contract's documentation (POSIX seconds or ISO-8601 with an offset; seconds as a JSON
    number or a decimal string; never a boolean)."""
    if isinstance(value, bool):
        return None
    if hint == "next_check_at":
        if isinstance(value, int | float):
            return float(value) if math.isfinite(value) and value >= 0 else None
        if isinstance(value, str):
            try:
                when = datetime.fromisoformat(value.strip())
            except ValueError:
                return None
            return when.timestamp() if when.tzinfo is not None else None
        return None
    if isinstance(value, int | float):
        return now + float(value) if math.isfinite(value) else None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}(\.[0-9]{1,9})?", value.strip()):
        return now + float(value.strip())
    return None


hint_values = (
    st.floats(-100, 100_000)
    | st.integers(-100, 100_000)
    | st.booleans()
    | st.none()
    | st.integers(-100, 100_000).map(str)
    | st.text(max_size=12)
    | json_values
)
instants = (
    st.floats(T0 - 1000, T0 + 100_000)
    | st.floats(T0 - 1000, T0 + 100_000).map(
        lambda t: datetime.fromtimestamp(t, tz=UTC).isoformat()
    )
    | st.floats(T0 - 1000, T0 + 100_000).map(
        lambda t: datetime.fromtimestamp(t, tz=UTC).replace(tzinfo=None).isoformat()
    )
    | hint_values
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=contracts,
    after=hint_values,
    at=instants,
    deadline=st.floats(60, 10_000),
    business=st.none() | st.floats(60, 10_000),
)
def test_s8_a_hint_is_taken_only_inside_its_range_and_before_the_deadline(
    c: Contract,
    after: object,
    at: object,
    deadline: float,
    business: float | None,
) -> None:
    """S8: each hint present is taken or refused with a reason, never both; one taken lies
    within [min_hint_seconds, max_hint_horizon_seconds] from now and before the deadline in
    force; the time used is the latest hint taken."""
    op = in_flight(
        c,
        deadline_at=T0 + deadline,
        business_deadline_at=None if business is None else T0 + business,
    )
    now = op.next_poll_at
    reading = read_response(
        op, response(op, now, body=pending(poll_after_seconds=after, next_check_at=at)), now
    )
    assert reading.job_outcome == "pending"
    assert reading.unreadable is None
    end, _ = op.effective_deadline
    taken: list[float] = []
    refused = {r.hint: r for r in reading.body_refusals}
    assert len(refused) == len(reading.body_refusals)  # one refusal per hint at most
    for hint, value in (("next_check_at", at), ("poll_after_seconds", after)):
        if value is None:  # absent: nothing to take or refuse
            assert hint not in refused
            continue
        when = _expected_time(hint, value, now)
        inside = (
            when is not None
            and c.min_hint_seconds <= when - now <= c.max_hint_horizon_seconds
            and when < end
        )
        if inside:
            assert hint not in refused
            assert when is not None
            taken.append(when)
        else:
            assert hint in refused, (hint, value)
            assert refused[hint].reason
    assert reading.hint_at == (max(taken) if taken else None)
    if reading.hint_at is not None:
        assert c.min_hint_seconds <= reading.hint_at - now <= c.max_hint_horizon_seconds
        assert reading.hint_at < end


@settings(max_examples=300, deadline=None)
@given(seconds=st.integers(1, 3000) | st.floats(1, 3000).map(lambda f: round(f, 3)))
def test_numbers_and_numeric_strings_are_read_as_the_same_value(seconds: float) -> None:
    op = in_flight(
        contract(min_hint_seconds=0.0, max_hint_horizon_seconds=86_400.0), deadline_at=T0 + 10_000
    )
    now = op.next_poll_at
    as_number = read_response(op, response(op, now, body=pending(poll_after_seconds=seconds)), now)
    as_text = read_response(
        op, response(op, now, body=pending(poll_after_seconds=str(seconds))), now
    )
    assert as_number.hint_at == as_text.hint_at == now + seconds
    instant = now + seconds
    iso = datetime.fromtimestamp(instant, tz=UTC).isoformat()
    by_number = read_response(op, response(op, now, body=pending(next_check_at=instant)), now)
    by_text = read_response(op, response(op, now, body=pending(next_check_at=iso)), now)
    assert by_number.hint_at == instant
    assert by_text.hint_at == pytest.approx(instant, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    flag=st.booleans(), field=st.sampled_from(["poll_after_seconds", "next_check_at", "expires_at"])
)
def test_a_boolean_is_never_a_time_nor_a_number_of_seconds(flag: bool, field: str) -> None:
    op = in_flight(contract(min_hint_seconds=0.0))
    now = op.next_poll_at
    reading = read_response(op, response(op, now, body=pending(**{field: flag})), now)
    assert reading.hint_at is None
    assert reading.expires_at is None
    [refusal] = reading.body_refusals
    assert refusal.hint == field
    assert "boolean" in refusal.reason
    assert refusal.value == json.dumps(flag)


@settings(max_examples=200, deadline=None)
@given(number=st.integers(0, 10**12), state=json_values.filter(lambda v: not isinstance(v, str)))
def test_job_ids_and_states_are_read_as_values_never_coerced(number: int, state: object) -> None:
    """S5: a numeric job id is the number's digits, a boolean is no id; a state that is not
    a string is no state."""
    c = contract()
    op = in_flight(c, provider_job_id=str(number))
    now = op.next_poll_at
    read = read_response(
        op, response(op, now, body=json.dumps({"job_id": number, "state": "running"}).encode()), now
    )
    assert read.unreadable is None
    assert read.job_outcome == "pending"
    for job_id in (True, False, float(number) + 0.5, [number], None):
        wrong = read_response(
            op,
            response(op, now, body=json.dumps({"job_id": job_id, "state": "running"}).encode()),
            now,
        )
        assert wrong.unreadable is not None, job_id
    no_state = read_response(
        op, response(op, now, body=json.dumps({"job_id": number, "state": state}).encode()), now
    )
    assert no_state.unreadable is not None
    assert no_state.unreadable.reason == "unparseable_response"
    assert no_state.job_state is None
    assert no_state.job_outcome is None


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_s14_a_result_is_recorded_as_the_provider_wrote_it(value: object) -> None:
    """S14: a result present is kept (a string verbatim, any other value as its JSON text);
    a required result that does not validate is named, never recorded."""
    c = contract(
        results=[
            {"name": "any", "pointer": "/result", "kind": "present"},
            {"name": "url", "pointer": "/url", "kind": "https_url"},
        ]
    )
    op = in_flight(c)
    now = op.next_poll_at
    read = read_response(
        op,
        response(
            op,
            now,
            body=json.dumps(
                {
                    "job_id": "exp_71c",
                    "state": "succeeded",
                    "result": value,
                    "url": "https://files.example.com/r",
                }
            ).encode(),
        ),
        now,
    )
    assert read.job_outcome == "success"
    if value is None:
        assert read.missing_result is not None
        assert "'any'" in read.missing_result
        assert read.results == ()
        return
    assert read.missing_result is None
    expected = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    assert dict(read.results) == {"any": expected, "url": "https://files.example.com/r"}


@settings(max_examples=300, deadline=None)
@given(error=json_values, cap=st.sampled_from([64, 100, 2048]))
def test_s3_a_providers_error_is_kept_verbatim_up_to_its_cap(error: object, cap: int) -> None:
    op = in_flight(contract(error_cap_bytes=cap))
    now = op.next_poll_at
    raw = json.dumps({"job_id": "exp_71c", "state": "failed", "error": error}).encode()
    read = read_response(op, response(op, now, body=raw), now)
    assert read.job_outcome == "failure"
    assert read.provider_error is not None
    full = (
        raw.decode()
        if error is None
        else error
        if isinstance(error, str)
        else msgspec.json.encode(error).decode()
    )
    kept = read.provider_error.encode()
    assert len(kept) <= cap
    assert read.provider_error_truncated == (len(full.encode()) > cap)
    if not read.provider_error_truncated:
        assert read.provider_error == full
    else:
        assert full.encode().startswith(kept)


@settings(max_examples=300, deadline=None)
@given(
    c=contracts,
    retry_after=st.text(max_size=40) | st.integers(0, 10**14).map(str),
    ratelimit=header_text,
    policy=header_text,
    status=statuses,
)
def test_headers_guidance_is_taken_or_refused_never_both(
    c: Contract,
    retry_after: str,
    ratelimit: str | None,
    policy: str | None,
    status: int,
) -> None:
    """S20: a valid Retry-After is never before now; RateLimit pacing is taken only within
    the hint horizon; whatever is not taken is refused with a reason, in header order."""
    op = in_flight(c)
    now = op.next_poll_at
    reading = read_response(
        op,
        response(
            op, now, status, retry_after=retry_after, ratelimit=ratelimit, ratelimit_policy=policy
        ),
        now,
    )
    names = [r.hint for r in reading.header_refusals]
    assert names == sorted(names, key=["retry_after", "ratelimit", "ratelimit_policy"].index)
    assert (reading.retry_after_at is None) == ("retry_after" in names)
    if reading.retry_after_at is not None:
        assert reading.retry_after_at >= now
        if retry_after.strip().isdigit():
            assert reading.retry_after_at == now + int(retry_after.strip())
    if reading.pacing is not None:
        assert 0 <= reading.pacing <= c.max_hint_horizon_seconds
    if all(
        value is None or name in names
        for name, value in (("ratelimit", ratelimit), ("ratelimit_policy", policy))
    ):
        assert reading.pacing is None  # nothing refused is taken
    assert all(r.reason for r in reading.header_refusals)


@pytest.mark.parametrize("field", ["poll_after_seconds", "next_check_at", "expires_at"])
def test_an_integer_beyond_float_range_as_a_hint_is_refused_not_raised(field: str) -> None:
    op = in_flight(contract())
    now = op.next_poll_at
    body = b'{"job_id": "exp_71c", "state": "running", "%s": 1%s}' % (field.encode(), b"0" * 400)
    reading = read_response(op, response(op, now, body=body), now)
    assert [r.hint for r in reading.body_refusals] == [field]


def test_reading_is_a_frozen_value() -> None:
    reading = Reading(http_status=200, http_outcome="ok")
    with pytest.raises(AttributeError):
        reading.http_status = 500  # type: ignore[misc]
