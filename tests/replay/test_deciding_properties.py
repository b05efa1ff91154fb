"""Property tests of the rules applied to a reading (replay/decide.py), apart from reading.

Given any reading, including ones ``read_response`` would never produce (a hint past the
deadline, a Retry-After long gone), the rules: record the two outcomes first (S2) and every
refusal; end in exactly one of a scheduled poll, a stop with its escalation, or a success;
never schedule a poll before now or past the deadline in force (S16), nor while the budget
is spent (S17); always name the delay's source and honour it (S20, S8, S38); accept a success
only with its results validated (S14); and never let a counter pass its budget.
"""

from __future__ import annotations

from typing import get_args

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, given, settings

from replay import (
    EscalationRaised,
    Event,
    HintRejected,
    Operation,
    OperationStopped,
    OperationSucceeded,
    PollScheduled,
    ResponseClassified,
    ResponseHeaders,
    StatusRequestIntended,
    StatusResponseReceived,
    WakeUp,
    decide,
    evolve,
)
from replay.decide import decide_reading
from replay.events import HintName, JobOutcome
from replay.reading import BodyProblem, Reading, Refusal, Unreadable, read_response
from replay.tables import http_outcome

from .helpers import T0, Daemon, body, contract

#: The sources a response can lead to (manual_extension and local_quota come from elsewhere).
RESPONSE_SOURCES = {
    "provider_retry_after",
    "provider_poll_hint",
    "local_backoff",
    "rate_limit_policy",
}

refusals = st.lists(
    st.builds(
        Refusal,
        hint=st.sampled_from(get_args(HintName)),
        value=st.text(max_size=20),
        reason=st.text(min_size=1, max_size=20),
    ),
    max_size=2,
).map(tuple)
offsets = st.none() | st.floats(-600, 6000)


@st.composite
def readings(draw: st.DrawFn, now: float, ok_statuses: tuple[int, ...]) -> Reading:
    """Any reading of a response received at ``now``: the HTTP outcome follows the status
    (as the fact the operation was evolved with says), everything else is arbitrary."""
    status = draw(
        st.sampled_from([200, 200, 200, 202, 204, 302, 401, 403, 404, 418, 429, 500, 503])
    )

    def at(offset: float | None) -> float | None:
        return None if offset is None else now + offset

    return Reading(
        http_status=status,
        http_outcome=http_outcome(status, ok_statuses),
        provider_request_id=draw(st.none() | st.just("req-1")),
        retry_after_at=at(draw(offsets)),
        pacing=draw(st.none() | st.floats(0, 5000)),
        header_refusals=draw(refusals),
        unreadable=draw(
            st.none()
            | st.none()
            | st.builds(
                Unreadable,
                reason=st.sampled_from(get_args(BodyProblem)),
                detail=st.text(min_size=1, max_size=20),
            )
        ),
        job_state=draw(st.none() | st.sampled_from(["running", "succeeded", "x"])),
        job_outcome=draw(st.none() | st.sampled_from(["pending"] * 5 + list(get_args(JobOutcome)))),
        results=draw(st.just(()) | st.just((("url", "https://files.example.com/r"),))),
        missing_result=draw(st.none() | st.none() | st.just("required result 'url' is null")),
        provider_error=draw(st.none() | st.text(max_size=20)),
        provider_error_truncated=draw(st.booleans()),
        expires_at=at(draw(offsets)),
        hint_at=at(draw(offsets)),
        body_refusals=draw(refusals),
    )


def _tail(events: list[Event]) -> list[str]:
    """The events after the classification and the refusals, by tag."""
    rest = [e for e in events[1:] if not isinstance(e, HintRejected)]
    return [str(e.__struct_config__.tag) for e in rest]


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    data=st.data(),
    max_requests=st.integers(1, 6),
    max_transport=st.integers(1, 3),
    max_rate=st.integers(1, 3),
    deadline=st.floats(60, 8000),
    business=st.none() | st.floats(60, 8000),
    expected=st.none() | st.just("succeeded"),
)
def test_s16_s17_any_reading_is_decided_inside_the_deadline_and_the_budgets(
    data: st.DataObject,
    max_requests: int,
    max_transport: int,
    max_rate: int,
    deadline: float,
    business: float | None,
    expected: str | None,
) -> None:
    c = contract(not_found_grace_seconds=data.draw(st.sampled_from([0.0, 30.0])))
    d = Daemon.start(
        c=c,
        max_status_requests=max_requests,
        max_transport_failures=max_transport,
        max_rate_limited=max_rate,
        deadline_at=T0 + deadline,
        expected_terminal_state=expected,
        business_deadline_at=None if business is None else T0 + business,
    )
    op = d.op
    for _ in range(max_requests + 1):
        if op.phase != "live":
            break
        now = op.next_poll_at
        woke = decide(op, WakeUp(), now, 0.0)
        if not woke or not isinstance(woke[0], StatusRequestIntended):
            assert [e.__struct_config__.tag for e in woke] == [  # S32: sends or stops
                "operation_stopped",
                "escalation_raised",
            ]
            break
        op = evolve(op, woke[0])
        now += data.draw(st.sampled_from([0.0, 0.3, 45.0, 9000.0]))
        reading = data.draw(readings(now, c.ok_statuses))
        fact = StatusResponseReceived(
            operation_id=op.operation_id,
            at=now,
            request_number=op.status_requests_used,
            status_code=reading.http_status,
            headers=ResponseHeaders(),
            body=b"",
        )
        op = evolve(op, fact)
        draw = data.draw(st.floats(0, 1, exclude_max=True))
        events = decide_reading(op, reading, fact.request_number, now, draw)
        _check(op, reading, now, events)
        for e in events:
            op = evolve(op, e)
        assert op.status_requests_used <= op.max_status_requests  # S17
        assert op.transport_failures_used <= op.max_transport_failures  # S18
        assert op.rate_limited_used <= op.max_rate_limited  # S21
        event(f"end={_tail(events)[0]}")


def _check(op: Operation, reading: Reading, now: float, events: list[Event]) -> None:
    """The properties of one decision on ``reading`` (``op`` already holds its response)."""
    classified = events[0]
    assert isinstance(classified, ResponseClassified)  # S2: both outcomes, recorded first
    assert (
        classified.http_status,
        classified.http_outcome,
        classified.job_state,
        classified.job_outcome,
        classified.retry_after_at,
    ) == (
        reading.http_status,
        reading.http_outcome,
        reading.job_state,
        reading.job_outcome,
        reading.retry_after_at,
    )
    rejected = [e for e in events if isinstance(e, HintRejected)]
    assert [(r.hint, r.value, r.reason) for r in rejected[: len(reading.header_refusals)]] == [
        (r.hint, r.value, r.reason) for r in reading.header_refusals
    ]
    tail = _tail(events)
    assert tail in (
        ["poll_scheduled"],
        ["operation_stopped", "escalation_raised"],
        ["operation_succeeded"],
    ), tail
    end, _ = op.effective_deadline
    last = events[-1]
    if isinstance(last, PollScheduled):
        assert now < end  # S16: no poll is scheduled once the deadline is reached
        assert op.status_requests_used < op.max_status_requests  # S17: budget left
        assert now <= last.next_poll_at <= end  # never before now, never past the deadline
        assert last.delay == last.next_poll_at - now
        if last.clamped_to_deadline:
            assert last.next_poll_at == end
        assert last.delay_source in RESPONSE_SOURCES  # S38: the source is always named
        if reading.retry_after_at is not None:
            assert last.next_poll_at >= reading.retry_after_at  # S20: never before it
            assert last.delay_source in ("provider_retry_after", "local_backoff")
        guided = reading.http_outcome == "ok" and reading.job_outcome == "pending"
        if guided and reading.retry_after_at is None and reading.hint_at is not None:
            # S8: a hint replaces the backoff (RateLimit pacing may push it later).
            assert last.delay_source in ("provider_poll_hint", "rate_limit_policy")
            assert last.next_poll_at >= min(reading.hint_at, end)
        if last.delay_source == "provider_poll_hint":
            assert reading.retry_after_at is None
            assert reading.hint_at is not None
            # The hint's time, never before now (a reading handed straight to the rules may
            # carry a hint already past) and never past the deadline.
            assert last.next_poll_at == max(now, min(reading.hint_at, end))
        if last.delay_source == "rate_limit_policy":
            assert reading.retry_after_at is None
            assert reading.pacing is not None
    elif isinstance(last, OperationSucceeded):  # S14: only a valid, readable success
        assert reading.http_outcome == "ok"
        assert reading.job_outcome == "success"
        assert reading.unreadable is None
        assert reading.missing_result is None
        assert op.expected_terminal_state in (None, reading.job_state)
        assert last.results == dict(reading.results)
    else:
        assert isinstance(last, EscalationRaised)
        assert last.options
        stopped = events[-2]
        assert isinstance(stopped, OperationStopped)
        assert stopped.reason == last.reason
        if reading.http_outcome == "ok" and reading.unreadable is not None:
            assert stopped.reason == reading.unreadable.reason


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=st.sampled_from(["running", "succeeded", "failed", "canceled", "paused"]),
    status=st.sampled_from([200, 404, 429, 503]),
    after=st.integers(-5, 4000),
    later=st.floats(0, 3000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_decide_is_reading_then_the_rules(
    state: str, status: int, after: int, later: float, draw: float
) -> None:
    """The seam: deciding a response is deciding what :func:`read_response` read from it."""
    d = Daemon.start()
    d.poll(d.op.next_poll_at)
    now = d.op.next_poll_at + later
    fact = StatusResponseReceived(
        operation_id=d.op.operation_id,
        at=now,
        request_number=d.op.status_requests_used,
        status_code=status,
        headers=ResponseHeaders(retry_after="30"),
        body=body(state, poll_after_seconds=after),
    )
    op = evolve(d.op, fact)
    assert decide(op, fact, now, draw) == decide_reading(
        op, read_response(op, fact, now), fact.request_number, now, draw
    )


def test_s16_a_hint_past_the_deadline_in_a_reading_is_clamped_to_it() -> None:
    """A reading read_response would not give (it refuses such a hint): the rules still
    never schedule past the deadline."""
    d = Daemon.start(deadline_at=T0 + 100)
    d.poll(d.op.next_poll_at)
    op = evolve(
        d.op,
        StatusResponseReceived(
            operation_id=d.op.operation_id,
            at=T0 + 50,
            request_number=1,
            status_code=200,
            headers=ResponseHeaders(),
            body=b"",
        ),
    )
    hinted = Reading(
        http_status=200,
        http_outcome="ok",
        job_state="running",
        job_outcome="pending",
        hint_at=T0 + 10_000,
    )
    [_, scheduled] = decide_reading(op, hinted, 1, T0 + 50, 0.5)
    assert isinstance(scheduled, PollScheduled)
    assert scheduled.next_poll_at == T0 + 100
    assert scheduled.clamped_to_deadline
