"""Property tests over arbitrary sequences of observations and clocks (hypothesis).

For every run of a fake daemon that follows the protocol against an arbitrary provider:
status requests never exceed the authorized budget; no request is intended at or after the
deadline in force, nor before ``next_poll_at``, a Retry-After or an accepted hint; every
authorization ends in a stop or a success within (budget + 1) due wake-ups; local backoff stays
within [50%, 100%] of raw; counters never decrease; folding the log from scratch (also after the
codec round trip) gives the incremental state; ``check`` finds no mismatch.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings

from replay import (
    EscalationRaised,
    Event,
    PollScheduled,
    StatusRequestIntended,
    WakeUp,
    check,
    decide,
    decode_event,
    encode_event,
    fold,
)
from replay.decide import backoff_delay
from replay.events import TransportKind

from .helpers import OK_RESULT, T0, Daemon, body, contract

STATES = [
    "queued",
    "running",
    "processing",
    "running",
    "running",
    "queued",
    "succeeded",
    "succeeded-no-result",
    "failed",
    "canceled",
    "expired",
    "paused",
]
TRANSPORT = [
    "connect_refused",
    "dns",
    "tls",
    "connect_timeout",
    "pool_timeout",
    "read_timeout",
    "write_timeout",
    "connection_reset",
    "protocol_error",
    "body_too_large",
    "not_sent",
]

retry_after = st.one_of(
    st.none(),
    st.none(),
    st.integers(0, 4000).map(lambda s: ("delta", s)),
    st.integers(-100, 4000).map(lambda s: ("date", s)),
    st.just(("raw", "soon")),
)
hint = st.one_of(st.none(), st.integers(-10, 5000), st.just("x"))
ratelimit = st.one_of(
    st.none(),
    st.none(),
    st.builds(lambda r, t: f'"d";r={r};t={t}', st.integers(-1, 5), st.integers(0, 300)),
    st.just("garbage;;"),
)
response = st.one_of(
    st.tuples(st.just("ok"), st.sampled_from(STATES), hint, retry_after, ratelimit),
    st.tuples(st.just("ok"), st.sampled_from(STATES[:3]), hint, retry_after, ratelimit),
    st.tuples(
        st.just("status"),
        st.sampled_from([404, 401, 403, 429, 500, 502, 503, 302, 418]),
        retry_after,
    ),
    st.tuples(st.just("transport"), st.sampled_from(TRANSPORT)),
    st.tuples(st.just("unknown")),
)


def _http_date(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")


def _retry_after_header(spec: object, now: float) -> dict[str, str]:
    if spec is None:
        return {}
    kind, value = cast(tuple[str, object], spec)
    if kind == "date":
        return {"retry_after": _http_date(now + cast(int, value))}
    return {"retry_after": str(value)}


def _content(state: str, hint_value: object) -> bytes:
    fields: dict[str, object] = {}
    if hint_value is not None:
        fields["poll_after_seconds"] = hint_value
    if state == "succeeded":
        fields["result"] = OK_RESULT
    if state == "succeeded-no-result":
        state = "succeeded"
    return body(state, **fields)


def _check_invariants(d: Daemon, before_len: int, counters: list[tuple[int, int, int]]) -> None:
    for e in d.log[before_len:]:
        if isinstance(e, PollScheduled):
            assert e.delay >= 0
            if e.delay_source == "local_backoff" and not e.clamped_to_deadline:
                assert e.draw is not None
                assert e.raw_delay / 2 <= e.delay <= e.raw_delay  # S6: floored jitter
    op = d.op
    assert op.status_requests_used <= op.max_status_requests  # S17
    now_counters = (op.status_requests_used, op.transport_failures_used, op.rate_limited_used)
    assert all(a <= b for a, b in zip(counters[-1], now_counters, strict=True))  # never reset
    counters.append(now_counters)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    data=st.data(),
    max_requests=st.integers(1, 8),
    max_transport=st.integers(1, 4),
    max_rate=st.integers(1, 3),
    deadline=st.floats(30, 4000),
    business=st.one_of(st.none(), st.floats(20, 5000)),
    grace=st.sampled_from([0.0, 30.0, 300.0]),
)
def test_properties_over_arbitrary_runs(
    data: st.DataObject,
    max_requests: int,
    max_transport: int,
    max_rate: int,
    deadline: float,
    business: float | None,
    grace: float,
) -> None:
    c = contract(
        not_found_grace_seconds=grace,
        cancel_documented=data.draw(st.booleans()),
        idempotent_submit=data.draw(st.booleans()),
    )
    d = Daemon.start(
        c=c,
        max_status_requests=max_requests,
        max_transport_failures=max_transport,
        max_rate_limited=max_rate,
        deadline_at=T0 + deadline,
        business_deadline_at=None if business is None else T0 + business,
        idempotency_key=data.draw(st.one_of(st.none(), st.just("idem"))),
    )
    counters = [(0, 0, 0)]
    now = T0
    due_wake_ups = 0
    remaining = d.op.max_status_requests - d.op.status_requests_used
    decisions = 0
    for _ in range(200):
        op = d.op
        if op.phase in ("succeeded", "closed"):
            break
        if op.phase == "escalated":
            assert op.escalation is not None
            offered = [o.id for o in op.escalation.options]
            choice = data.draw(st.sampled_from([*offered, "bogus", "stop"]))
            if choice == "stop" or decisions >= 3:
                break
            decisions += 1
            now += data.draw(st.floats(0, 3000))
            n = len(d.log)
            d.decision(now, choice, approver="alice")
            _check_invariants(d, n, counters)
            if d.op.phase == "live":  # a new authorization
                due_wake_ups = 0
                remaining = d.op.max_status_requests - d.op.status_requests_used
            continue
        # An early wake-up never sends anything.
        if data.draw(st.booleans()) and op.next_poll_at > now:
            early = now + data.draw(st.floats(0, 0.999)) * (op.next_poll_at - now)
            got = decide(op, WakeUp(), early, 0.0)
            assert not any(isinstance(e, StatusRequestIntended) for e in got)
        # Sometimes the daemon's quota holds the poll back.
        if data.draw(st.integers(0, 9)) == 0:
            n = len(d.log)
            due = max(now, op.next_poll_at)
            d.quota(due, due + data.draw(st.floats(0, 600)))
            _check_invariants(d, n, counters)
            op = d.op
        now = max(now, op.next_poll_at) + data.draw(st.sampled_from([0.0, 0.0, 0.5, 7.0, 900.0]))
        deadline_in_force, _ = op.effective_deadline
        n = len(d.log)
        events = d.wake(now)
        due_wake_ups += 1
        assert due_wake_ups <= remaining + 1  # stop or success within budget + 1
        _check_invariants(d, n, counters)
        if not events or not isinstance(events[0], StatusRequestIntended):
            assert d.op.phase != "live"  # a due wake-up either sends or stops
            continue
        intent = events[0]
        assert intent.at < deadline_in_force  # never at or after the deadline
        assert intent.at >= op.next_poll_at
        assert op.not_before is None or intent.at >= op.not_before  # Retry-After / hint
        assert intent.request_number <= op.max_status_requests
        now += data.draw(st.sampled_from([0.0, 0.2, 3.0, 40.0]))
        spec: tuple[object, ...] = data.draw(response)
        draw = data.draw(st.floats(0, 1, exclude_max=True))
        n = len(d.log)
        if spec[0] == "ok":
            headers = _retry_after_header(spec[3], now)
            if spec[4] is not None:
                headers["ratelimit"] = str(spec[4])
            d.respond(now, 200, _content(str(spec[1]), spec[2]), draw, headers=headers)
        elif spec[0] == "status":
            status = cast(int, spec[1])
            d.respond(now, status, b"{}", draw, headers=_retry_after_header(spec[2], now))
        elif spec[0] == "transport":
            d.fail(now, cast(TransportKind, spec[1]), draw)
        else:
            d.outcome_unknown(now, draw)
        _check_invariants(d, n, counters)
    # Whole-log properties.
    event(f"phase={d.op.phase}")
    for raised in _escalations(d.log):
        event(f"stop={raised.reason}")
    assert fold(d.log) == {d.op.operation_id: d.op}
    decoded = [decode_event(encode_event(e)) for e in d.log]
    assert fold(decoded) == {d.op.operation_id: d.op}
    assert check(d.log) == []
    json.dumps([json.loads(encode_event(e)) for e in d.log])


def _escalations(log: list[Event]) -> list[EscalationRaised]:
    return [e for e in log if isinstance(e, EscalationRaised)]


@settings(max_examples=500, deadline=None)
@given(
    attempt=st.integers(0, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
    base=st.floats(0.01, 600),
    factor=st.floats(1, 100),
)
def test_property_s6_jitter_within_bounds(
    attempt: int, draw: float, base: float, factor: float
) -> None:
    c = contract(
        backoff_base_seconds=base,
        backoff_cap_seconds=base * factor,
        rate_limited_delay_seconds=2 * base * factor,
    )
    raw, actual = backoff_delay(c, attempt, draw)
    assert raw == min(base * factor, base * 2.0 ** min(attempt, 62))
    assert raw * 0.5 <= actual <= raw
    assert actual == pytest.approx(raw * (0.5 + 0.5 * draw))


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 200), data=st.data())
def test_property_fold_prefix_then_rest_equals_fold_all(cut: int, data: st.DataObject) -> None:
    from replay import evolve

    d = Daemon.start(max_status_requests=6)
    for _ in range(6):
        if d.op.phase != "live":
            break
        status = data.draw(st.sampled_from([200, 200, 503, 429, 404]))
        d.poll_and_respond(status=status, draw=data.draw(st.floats(0, 0.99)))
    log = d.log
    cut = min(cut, len(log))
    prefix = fold(log[:cut])
    state = prefix.get(d.op.operation_id)
    for e in log[cut:]:
        state = evolve(state, e)
    assert state == fold(log)[d.op.operation_id]
