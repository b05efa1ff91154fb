"""Fuzz the response classifier: ``decide`` on arbitrary status responses (hypothesis).

Whatever a provider sends -- any status code, any header text, any bytes as body, truncated
or not, at any moment up to the deadline -- ``decide`` never raises, returns exactly one
outcome (a success, a stop with its escalation, or one scheduled poll), and never schedules a
poll past the deadline in force. The response arrives after an intent, as the daemon records
it; the operation then folds the decision without error.
"""

from __future__ import annotations

import json

import hypothesis.strategies as st
import msgspec
from hypothesis import HealthCheck, given, settings

from replay import ResponseHeaders, StatusResponseReceived, WakeUp, decide, evolve, register
from replay.events import (
    EscalationRaised,
    OperationStopped,
    OperationSucceeded,
    PollScheduled,
    ResponseClassified,
    StatusRequestIntended,
)
from tests.replay.helpers import T0, contract, registration

HEADER_TEXT = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        [
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "Fri, 31 Dec 9999 23:59:59 GMT",
            "0",
            "-1",
            "1e309",
            "315360000",
            " 120 ",
            "120, 5",
            '"d";r=0;t=99999',
            "limit=10, remaining=0, reset=31536000000",
        ]
    ),
)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
STATES = [
    "queued",
    "running",
    "processing",
    "succeeded",
    "failed",
    "canceled",
    "expired",
    "",
    "SUCCEEDED",
    "paused",
]
DOCUMENT = st.fixed_dictionaries(
    {},
    optional={
        "state": st.one_of(st.sampled_from(STATES), JSON_VALUE),
        "job_id": st.one_of(st.just("exp_71c"), JSON_VALUE),
        "result": st.one_of(st.just({"url": "https://files.example.com/x"}), JSON_VALUE),
        "next_check_at": st.one_of(st.floats(allow_nan=False), st.text(max_size=30), JSON_VALUE),
        "poll_after_seconds": st.one_of(st.floats(allow_nan=False), st.integers(), JSON_VALUE),
        "expires_at": st.one_of(st.floats(allow_nan=False), st.text(max_size=30)),
        "error": JSON_VALUE,
    },
)
BODY = st.one_of(
    st.binary(max_size=300),
    DOCUMENT.map(lambda d: json.dumps(d).encode()),
    DOCUMENT.map(lambda d: json.dumps(d).encode()[:-3]),  # cut short
    st.just(b'{"state": "runn\xff\xfeing"}'),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    status=st.one_of(st.integers(100, 599), st.sampled_from([200, 202, 302, 401, 404, 429, 503])),
    headers=st.fixed_dictionaries(
        {
            "retry_after": HEADER_TEXT,
            "ratelimit": HEADER_TEXT,
            "ratelimit_policy": HEADER_TEXT,
            "request_id": HEADER_TEXT,
            "location": HEADER_TEXT,
            "content_type": HEADER_TEXT,
        }
    ),
    content=BODY,
    truncated=st.booleans(),
    elapsed=st.floats(0.0, 1.0),
    draw=st.floats(0.0, 1.0, exclude_max=True),
    business=st.booleans(),
)
def test_decide_on_any_response_is_total_and_bounded(
    status: int,
    headers: dict[str, str | None],
    content: bytes,
    truncated: bool,
    elapsed: float,
    draw: float,
    business: bool,
) -> None:
    reg = registration(
        deadline_at=T0 + 2400.0, business_deadline_at=T0 + 1200.0 if business else None
    )
    [registered] = register(reg, contract(), T0)
    op = evolve(None, registered)
    now = op.next_poll_at
    [intent] = decide(op, WakeUp(), now, 0.5)
    assert isinstance(intent, StatusRequestIntended)
    op = evolve(op, intent)
    deadline = min(d for d in (op.deadline_at, op.business_deadline_at) if d is not None)
    at = now + elapsed * (deadline - now)  # the answer comes some time before the deadline
    fact = StatusResponseReceived(
        operation_id=op.operation_id,
        at=at,
        request_number=intent.request_number,
        status_code=status,
        headers=msgspec.convert(headers, ResponseHeaders),
        body=content,
        body_truncated=truncated,
    )
    op = evolve(op, fact)

    events = decide(op, fact, at, draw)

    assert events, "no decision"
    assert isinstance(events[0], ResponseClassified)
    polls = [e for e in events if isinstance(e, PollScheduled)]
    stops = [e for e in events if isinstance(e, OperationStopped)]
    successes = [e for e in events if isinstance(e, OperationSucceeded)]
    assert len(polls) + len(stops) + len(successes) == 1, events
    if stops:
        assert any(isinstance(e, EscalationRaised) for e in events)
    for poll in polls:
        assert at <= poll.next_poll_at <= deadline, (poll, deadline)
        assert poll.delay >= 0
    for ev in events:  # the decision folds into state and survives the codec
        op = evolve(op, ev)
    assert op.phase in ("live", "succeeded", "escalated")
    assert op.phase == "live" if polls else op.phase != "live"
