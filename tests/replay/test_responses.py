"""Decisions after a response or a transport failure: S2-S4, S6, S8, S10, S11, S14, S15,
S18, S20, S21, S23-S25, S29, identity, and IETF RateLimit pacing."""

from __future__ import annotations

import pytest

from replay import (
    HintRejected,
    OperationStopped,
    OperationSucceeded,
    PollScheduled,
    ResponseClassified,
)
from replay.decide import backoff_delay, format_time
from replay.events import Event

from .helpers import OK_RESULT, T0, Daemon, body, contract, simple_contract, tags


def _only(events: list[Event], cls: type) -> list[object]:
    return [e for e in events if isinstance(e, cls)]


def _stop_reason(events: list[Event]) -> str | None:
    stops = [e for e in events if isinstance(e, OperationStopped)]
    return stops[0].reason if stops else None


def _schedule(events: list[Event]) -> PollScheduled:
    [scheduled] = [e for e in events if isinstance(e, PollScheduled)]
    return scheduled


# --- S3 state table, S15 unknown, S29 canceled/expired, S14/S4 success --------------------------

S3_TABLE = [
    pytest.param(body("queued"), None, "pending", id="S3-queued-pending"),
    pytest.param(body("running"), None, "pending", id="S3-running-pending"),
    pytest.param(body("processing"), None, "pending", id="S3-processing-pending"),
    pytest.param(body("succeeded", result=OK_RESULT), None, "success", id="S3-S14-success"),
    pytest.param(body("failed", error="quota"), "provider_failure", "failure", id="S3-failure"),
    pytest.param(body("canceled"), "canceled", "canceled", id="S3-S29-canceled"),
    pytest.param(body("expired"), "expired", "expired", id="S3-S29-expired"),
    pytest.param(body("paused"), "unknown_state", "unknown", id="S15-paused-unknown"),
    pytest.param(body("awaiting_review"), "unknown_state", "unknown", id="S15-review-unknown"),
    pytest.param(body("needs_payment"), "unknown_state", "unknown", id="S15-new-value-unknown"),
    pytest.param(body("Running"), "unknown_state", "unknown", id="S3-never-inferred-case"),
    pytest.param(b"not json", "unparseable_response", None, id="S15-unparseable-body"),
    pytest.param(body(None), "unparseable_response", None, id="S15-missing-state-field"),
    pytest.param(b'{"job_id":"exp_71c","state":7}', "unparseable_response", None, id="S15-num"),
    pytest.param(b"[]", "unparseable_response", None, id="S15-not-an-object"),
]


@pytest.mark.parametrize(("content", "reason", "job_outcome"), S3_TABLE)
def test_s3_s15_state_table(content: bytes, reason: str | None, job_outcome: str | None) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(content=content)
    classified = events[0]
    assert isinstance(classified, ResponseClassified)
    assert classified.job_outcome == job_outcome
    assert _stop_reason(events) == reason
    if job_outcome == "pending":
        assert d.op.phase == "live"
        assert tags(events)[-1] == "poll_scheduled"
    elif job_outcome == "success":
        assert d.op.phase == "succeeded"
    else:
        assert d.op.phase == "escalated"


def test_s3_provider_error_kept_verbatim_and_capped() -> None:
    d = Daemon.start(c=contract(error_cap_bytes=64))
    error = {"code": "E_QUOTA", "message": "x" * 500}
    events = d.poll_and_respond(content=body("failed", error=error))
    stopped = _only(events, OperationStopped)[0]
    assert isinstance(stopped, OperationStopped)
    assert stopped.reason == "provider_failure"
    assert stopped.provider_error is not None
    assert stopped.provider_error.startswith('{"code":"E_QUOTA","message":"xxx')
    assert len(stopped.provider_error.encode()) == 64
    assert stopped.provider_error_truncated

    d = Daemon.start()
    events = d.poll_and_respond(content=body("failed", error="Quota exceeded: ü"))
    stopped = _only(events, OperationStopped)[0]
    assert isinstance(stopped, OperationStopped)
    assert (stopped.provider_error, stopped.provider_error_truncated) == (
        "Quota exceeded: ü",
        False,
    )


S14_RESULTS = [
    pytest.param({"url": "https://files.example.com/x.csv"}, None, id="S14-https-url"),
    pytest.param({}, "contradiction", id="S4-succeeded-without-result"),
    pytest.param({"url": None}, "contradiction", id="S4-null-result"),
    pytest.param({"url": ""}, "contradiction", id="S4-empty-result"),
    pytest.param({"url": "http://files.example.com/x"}, "contradiction", id="S14-http-not-https"),
    pytest.param({"url": "ftp://files.example.com/x"}, "contradiction", id="S14-ftp"),
    pytest.param({"url": "https:///nohost"}, "contradiction", id="S14-no-host"),
    pytest.param({"url": "https://a b/"}, "contradiction", id="S14-space"),
    pytest.param({"url": 42}, "contradiction", id="S14-not-a-string"),
]


@pytest.mark.parametrize(("result", "reason"), S14_RESULTS)
def test_s14_s4_success_only_with_valid_required_results(
    result: dict[str, object], reason: str | None
) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(content=body("succeeded", result=result))
    assert _stop_reason(events) == reason
    if reason is None:
        [success] = _only(events, OperationSucceeded)
        assert isinstance(success, OperationSucceeded)
        assert success.results == {"url": result["url"]}
        assert d.op.phase == "succeeded"
        assert d.op.results == success.results
    else:
        assert not _only(events, OperationSucceeded)
        assert d.op.phase == "escalated"


def test_s14_result_kinds_and_optional_fields() -> None:
    c = contract(
        results=[
            {"name": "url", "pointer": "/result/url", "kind": "url"},
            {"name": "rows", "pointer": "/result/rows", "kind": "present"},
            {"name": "etag", "pointer": "/result/etag", "kind": "non_empty", "required": False},
        ]
    )
    d = Daemon.start(c=c)
    events = d.poll_and_respond(
        content=body("succeeded", result={"url": "http://x.example/a", "rows": 3, "etag": " "})
    )
    [success] = _only(events, OperationSucceeded)
    assert isinstance(success, OperationSucceeded)
    assert success.results == {"url": "http://x.example/a", "rows": "3"}


def test_s14_expected_terminal_state_must_match() -> None:
    c = contract(states={"pending": ["running"], "success": ["succeeded", "partial"]})
    d = Daemon.start(c=c, expected_terminal_state="succeeded")
    events = d.poll_and_respond(content=body("partial", result=OK_RESULT))
    assert _stop_reason(events) == "contradiction"


@pytest.mark.parametrize(
    ("expires_at", "reason", "rejected"),
    [
        pytest.param("2025-04-18T09:00:00Z", "contradiction", False, id="S4-running-past-expiry"),
        pytest.param("2025-04-18T12:00:00Z", None, False, id="S4-running-before-expiry"),
        pytest.param(T0 - 1, "contradiction", False, id="S4-expiry-posix"),
        pytest.param("tomorrow", None, True, id="S4-unparseable-expiry-recorded"),
    ],
)
def test_s4_running_past_own_expiry(expires_at: object, reason: str | None, rejected: bool) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(content=body("running", expires_at=expires_at))
    assert _stop_reason(events) == reason
    hints = [e for e in events if isinstance(e, HintRejected)]
    assert [h.hint for h in hints] == (["expires_at"] if rejected else [])


@pytest.mark.parametrize(
    ("job_id", "reason"),
    [
        pytest.param("exp_71c", None, id="S5-identity-same-job"),
        pytest.param("exp_99z", "contradiction", id="S5-identity-other-job"),
        pytest.param(None, "unparseable_response", id="S5-identity-missing"),
    ],
)
def test_identity_job_id_must_match(job_id: str | None, reason: str | None) -> None:
    doc = b'{"state":"running"}' if job_id is None else body("running", job_id=job_id)
    d = Daemon.start()
    events = d.poll_and_respond(content=doc)
    assert _stop_reason(events) == reason


# --- S2: HTTP outcome and job outcome are separate facts ------------------------------------------

S2_TABLE = [
    pytest.param(200, body("failed"), "ok", "failure", id="S2-200-job-failed"),
    pytest.param(200, body("running"), "ok", "pending", id="S2-200-job-running"),
    pytest.param(503, body("running"), "server_error", None, id="S2-503-state-unknown"),
    pytest.param(429, b"", "rate_limited", None, id="S2-429"),
    pytest.param(404, b"", "not_found", None, id="S2-404"),
    pytest.param(401, b"", "auth_denied", None, id="S2-401"),
    pytest.param(302, b"", "redirect", None, id="S2-302"),
    pytest.param(418, b"", "unexplained", None, id="S2-418"),
    pytest.param(202, body("running"), "unexplained", None, id="S2-202-not-in-contract"),
]


@pytest.mark.parametrize(("status", "content", "http", "job"), S2_TABLE)
def test_s2_http_outcome_and_job_outcome_separate(
    status: int, content: bytes, http: str, job: str | None
) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=status, content=content, request_id="req-1")
    classified = events[0]
    assert isinstance(classified, ResponseClassified)
    assert (classified.http_status, classified.http_outcome, classified.job_outcome) == (
        status,
        http,
        job,
    )
    assert classified.provider_request_id == "req-1"


def test_s22_202_read_when_contract_lists_it() -> None:
    d = Daemon.start(c=contract(ok_statuses=[200, 202]))
    events = d.poll_and_respond(status=202, content=body("queued"))
    assert tags(events) == ["response_classified", "poll_scheduled"]


# --- integration failures: 3xx, unexplained codes, over-cap bodies --------------------------------


@pytest.mark.parametrize(
    ("status", "truncated"),
    [
        pytest.param(301, False, id="S23-integration-301"),
        pytest.param(304, False, id="S23-integration-304"),
        pytest.param(307, False, id="S23-integration-307"),
        pytest.param(400, False, id="S23-integration-400"),
        pytest.param(410, False, id="S23-integration-410"),
        pytest.param(204, False, id="S23-integration-204"),
        pytest.param(200, True, id="S23-integration-over-cap-body"),
    ],
)
def test_integration_failure_for_what_the_contract_cannot_explain(
    status: int, truncated: bool
) -> None:
    d = Daemon.start()
    now = d.op.next_poll_at
    d.poll(now)
    events = d.respond(now, status, body("running"), truncated=truncated)
    assert _stop_reason(events) == "integration_failure"


def test_integration_failure_for_body_too_large_transport_kind() -> None:
    d = Daemon.start()
    d.poll(T0 + 5)
    events = d.fail(T0 + 6, "body_too_large")
    assert _stop_reason(events) == "integration_failure"
    assert d.op.transport_failures_used == 0  # not a transport failure


# --- S23 404 grace window --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("respond_offset", "reason"),
    [
        pytest.param(5.0, None, id="S23-inside-grace-polled-again"),
        pytest.param(29.9, None, id="S23-just-inside-grace"),
        pytest.param(30.0, "not_found", id="S23-grace-over"),
        pytest.param(600.0, "not_found", id="S23-long-after"),
    ],
)
def test_s23_404_grace_then_not_found(respond_offset: float, reason: str | None) -> None:
    d = Daemon.start()
    d.poll(T0 + 5)
    events = d.respond(T0 + respond_offset, 404)
    assert _stop_reason(events) == reason
    assert d.op.status_requests_used == 1  # S23: counted as a request
    if reason is None:
        assert _schedule(events).delay_source == "local_backoff"
    else:
        stopped = _only(events, OperationStopped)[0]
        assert isinstance(stopped, OperationStopped)
        assert "exp_71c" in stopped.detail
        assert format_time(T0 + respond_offset) in stopped.detail


# --- S24 401/403 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [pytest.param(401, id="S24-401"), pytest.param(403, id="S24-403")]
)
def test_s24_authorization_denied_at_once(status: int) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=status, draw=0.1)
    assert _stop_reason(events) == "authorization_denied"
    assert d.op.phase == "escalated"
    assert d.wake(T0 + 1000) == []  # no retry with the same credential


# --- S25 / S18 / S10 / S11 transport failures -----------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("connect_refused", id="S10-connect-refused"),
        pytest.param("dns", id="S10-dns"),
        pytest.param("tls", id="S10-tls"),
        pytest.param("connect_timeout", id="S10-connect-timeout"),
        pytest.param("pool_timeout", id="S10-pool-timeout"),
        pytest.param("read_timeout", id="S18-read-timeout"),
        pytest.param("write_timeout", id="S18-write-timeout"),
        pytest.param("connection_reset", id="S18-reset"),
        pytest.param("protocol_error", id="S18-protocol-error"),
    ],
)
def test_s25_s18_transport_budget_then_delivery_ambiguous(kind: str) -> None:
    d = Daemon.start(max_transport_failures=3)
    for n in (1, 2):
        now = d.op.next_poll_at
        d.poll(now)
        events = d.fail(now + 1, kind)  # type: ignore[arg-type]
        # A timeout does not prove the job failed: observe again (S10).
        assert tags(events) == ["poll_scheduled"]
        assert d.op.transport_failures_used == n
    now = d.op.next_poll_at
    d.poll(now)
    events = d.fail(now + 1, kind)  # type: ignore[arg-type]
    assert _stop_reason(events) == "delivery_ambiguous"
    stopped = events[0]
    assert isinstance(stopped, OperationStopped)
    assert kind in stopped.detail
    assert "3 of 3" in stopped.detail
    assert d.op.status_requests_used == 3  # S11: every call counted


@pytest.mark.parametrize(
    "status",
    [pytest.param(code, id=f"S25-{code}") for code in (500, 502, 503)],
)
def test_s25_5xx_counts_keeps_status_time_request_id(status: int) -> None:
    d = Daemon.start(max_transport_failures=2)
    d.poll_and_respond(status=status, content=b"oops", request_id="req-a")
    assert d.op.transport_failures_used == 1
    assert d.op.last_state is None  # 5xx hides the state; nothing is inferred
    assert (d.op.last_http_status, d.op.last_provider_request_id) == (status, "req-a")
    assert d.op.last_http_at == T0 + 5
    events = d.poll_and_respond(status=status, content=b"oops", request_id="req-b")
    assert _stop_reason(events) == "delivery_ambiguous"
    raised = events[-1]
    ctx = raised.context  # type: ignore[union-attr]
    assert (ctx.last_http_status, ctx.last_provider_request_id) == (status, "req-b")
    assert ctx.histogram.status_codes == {str(status): 2}


def test_s11_outcome_unknown_counts_and_is_ambiguous() -> None:
    d = Daemon.start(max_transport_failures=2)
    d.poll(T0 + 5)
    events = d.outcome_unknown(T0 + 100)
    assert tags(events) == ["poll_scheduled"]
    assert (d.op.status_requests_used, d.op.transport_failures_used) == (1, 1)
    assert d.op.in_flight is None
    now = d.op.next_poll_at
    d.poll(now)
    events = d.outcome_unknown(now + 1)
    assert _stop_reason(events) == "delivery_ambiguous"
    assert d.op.status_requests_used == 2


def test_late_or_stale_outcome_decides_nothing() -> None:
    d = Daemon.start()
    d.poll(T0 + 5)
    d.respond(T0 + 6, 401)
    assert d.op.phase == "escalated"
    assert d.respond(T0 + 7, 200, body("running")) == []


# --- S6 backoff -----------------------------------------------------------------------------------

S6_TABLE = [
    # attempt, draw, raw, actual
    pytest.param(0, 0.0, 5.0, 2.5, id="S6-attempt0-floor"),
    pytest.param(1, 0.0, 10.0, 5.0, id="S6-attempt1-floor"),
    pytest.param(2, 0.5, 20.0, 15.0, id="S6-attempt2-mid"),
    pytest.param(3, 0.999, 40.0, 39.98, id="S6-attempt3-top"),
    pytest.param(5, 0.0, 120.0, 60.0, id="S6-capped"),
    pytest.param(400, 0.25, 120.0, 75.0, id="S6-huge-attempt-capped"),
]


@pytest.mark.parametrize(("attempt", "draw", "raw", "actual"), S6_TABLE)
def test_s6_backoff_table(attempt: int, draw: float, raw: float, actual: float) -> None:
    got_raw, got_actual = backoff_delay(contract(), attempt, draw)
    assert got_raw == raw
    assert got_actual == pytest.approx(actual)
    assert raw / 2 <= got_actual <= raw


def test_s6_schedule_uses_completed_polls_as_attempt_and_records_draw() -> None:
    d = Daemon.start()
    delays = []
    for draw in (0.0, 0.0, 0.0, 0.0, 0.0, 0.0):
        events = d.poll_and_respond(draw=draw)
        scheduled = _schedule(events)
        assert scheduled.delay_source == "local_backoff"
        assert scheduled.draw == draw
        delays.append((scheduled.raw_delay, scheduled.delay))
    assert delays == [(10, 5), (20, 10), (40, 20), (80, 40), (120, 60), (120, 60)]


# --- S8 hints ---------------------------------------------------------------------------------

S8_TABLE = [
    pytest.param({"poll_after_seconds": 30}, "provider_poll_hint", 30.0, None, id="S8-relative"),
    pytest.param({"poll_after_seconds": "45"}, "provider_poll_hint", 45.0, None, id="S8-string"),
    pytest.param(
        {"next_check_at": "2025-04-18T10:02:05Z"}, "provider_poll_hint", 120.0, None, id="S8-abs"
    ),
    pytest.param({"next_check_at": T0 + 65}, "provider_poll_hint", 60.0, None, id="S8-posix"),
    pytest.param({"poll_after_seconds": -5}, "local_backoff", None, "negative", id="S8-negative"),
    pytest.param(
        {"poll_after_seconds": "soon"}, "local_backoff", None, "not a number", id="S8-unparseable"
    ),
    pytest.param(
        {"next_check_at": "next tuesday"}, "local_backoff", None, "ISO-8601", id="S8-bad-time"
    ),
    pytest.param(
        {"next_check_at": "2025-04-18T10:02:05"}, "local_backoff", None, "offset", id="S8-naive"
    ),
    pytest.param({"poll_after_seconds": 100000}, "local_backoff", None, "horizon", id="S8-absurd"),
    pytest.param(
        {"poll_after_seconds": 2396},
        "local_backoff",
        None,
        "past the operation deadline",
        id="S8-past-deadline",
    ),
    pytest.param(
        {"next_check_at": "2025-04-18T09:00:00Z"},
        "local_backoff",
        None,
        "in the past",
        id="S8-in-the-past",
    ),
    pytest.param({"poll_after_seconds": 0}, "local_backoff", None, "sooner", id="S8-too-soon"),
    pytest.param({"poll_after_seconds": True}, "local_backoff", None, "boolean", id="S8-bool"),
    pytest.param(
        {"poll_after_seconds": 30, "next_check_at": T0 + 125},
        "provider_poll_hint",
        120.0,
        None,
        id="S8-both-later-wins",
    ),
]


@pytest.mark.parametrize(("fields", "source", "delay", "rejection"), S8_TABLE)
def test_s8_hints_validated_and_rejections_recorded(
    fields: dict[str, object], source: str, delay: float | None, rejection: str | None
) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(content=body("running", **fields), draw=0.0)
    scheduled = _schedule(events)
    assert scheduled.delay_source == source
    rejected = [e for e in events if isinstance(e, HintRejected)]
    if delay is not None:
        assert scheduled.delay == pytest.approx(delay)
        assert scheduled.next_poll_at == d.op.not_before
    if rejection is None:
        assert rejected == []
    else:
        assert len(rejected) == 1
        assert rejection in rejected[0].reason
        assert scheduled.delay == 5.0  # the backoff floor with draw 0 (attempt 1, raw 10)


def test_s8_hint_wins_over_backoff_even_when_shorter() -> None:
    d = Daemon.start()
    for _ in range(4):
        d.poll_and_respond(draw=0.9)
    events = d.poll_and_respond(content=body("running", poll_after_seconds=3), draw=0.9)
    assert _schedule(events).delay == 3.0


# --- S20 Retry-After -----------------------------------------------------------------------------

S20_TABLE = [
    pytest.param(503, "120", 120.0, id="S20-503-delta-seconds"),
    pytest.param(429, "120", 120.0, id="S20-429-delta-seconds"),
    pytest.param(503, "Fri, 18 Apr 2025 10:02:05 GMT", 120.0, id="S20-503-http-date"),
    pytest.param(429, "Fri, 18 Apr 2025 10:02:05 GMT", 120.0, id="S20-429-http-date"),
    pytest.param(503, "Friday, 18-Apr-25 10:02:05 GMT", 120.0, id="S20-rfc850-date"),
    pytest.param(503, "Fri Apr 18 10:02:05 2025", 120.0, id="S20-asctime-date"),
    pytest.param(200, "120", 120.0, id="S20-on-pending-200"),
    pytest.param(404, "120", 120.0, id="S20-on-404-grace"),
]


@pytest.mark.parametrize(("status", "value", "delay"), S20_TABLE)
def test_s20_retry_after_both_forms(status: int, value: str, delay: float) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=status, retry_after=value, draw=0.999)
    scheduled = _schedule(events)
    assert scheduled.delay_source == "provider_retry_after"
    assert scheduled.delay == pytest.approx(delay)
    assert scheduled.until == pytest.approx(T0 + 5 + delay)
    # Never poll before it.
    assert d.wake(scheduled.next_poll_at - 0.001) == []
    assert tags(d.wake(scheduled.next_poll_at)) == ["status_request_intended"]


def test_s20_backoff_longer_than_retry_after_wins() -> None:
    d = Daemon.start()
    for _ in range(5):
        d.poll_and_respond(draw=0.0)
    events = d.poll_and_respond(status=503, retry_after="2", draw=0.999)
    scheduled = _schedule(events)
    assert scheduled.delay_source == "local_backoff"
    assert scheduled.delay > 2
    assert scheduled.until == pytest.approx(T0 + scheduled.at - T0 + 2)


@pytest.mark.parametrize(
    ("status", "value"),
    [
        pytest.param(503, "3000", id="S20-503-past-deadline-delta"),
        pytest.param(429, "Fri, 18 Apr 2025 11:00:00 GMT", id="S20-429-past-deadline-date"),
        pytest.param(503, "2395", id="S20-exactly-at-deadline"),
    ],
)
def test_s20_retry_after_past_deadline_stops(status: int, value: str) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=status, retry_after=value)
    assert _stop_reason(events) == "retry_after_past_deadline"
    assert not _only(events, PollScheduled)  # do not poll again
    stopped = _only(events, OperationStopped)[0]
    assert isinstance(stopped, OperationStopped)
    assert "Retry-After" in stopped.detail
    assert "deadline" in stopped.detail
    assert d.op.phase == "escalated"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("-5", id="S20-negative"),
        pytest.param("1.5", id="S20-fraction"),
        pytest.param("soon", id="S20-garbage"),
        pytest.param("Fri, 31 Feb 2025 10:00:00 GMT", id="S20-impossible-date"),
        pytest.param("9" * 40, id="S20-absurd-digits"),
    ],
)
def test_s20_malformed_retry_after_recorded_and_ignored(value: str) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=503, retry_after=value)
    [rejected] = [e for e in events if isinstance(e, HintRejected)]
    assert rejected.hint == "retry_after"
    assert _schedule(events).delay_source == "local_backoff"


# --- S21 429 -------------------------------------------------------------------------------------


def test_s21_429_without_retry_after_markedly_longer_and_budgeted() -> None:
    c = contract()
    d = Daemon.start(c=c, max_rate_limited=3)
    ordinary_max = c.backoff_cap_seconds
    for n in (1, 2):
        events = d.poll_and_respond(status=429, draw=0.0)
        scheduled = _schedule(events)
        assert scheduled.delay_source == "local_backoff"
        assert scheduled.raw_delay == c.rate_limited_delay_seconds
        assert scheduled.delay >= ordinary_max  # markedly longer than any ordinary poll
        assert d.op.rate_limited_used == n
    events = d.poll_and_respond(status=429)
    assert _stop_reason(events) == "rate_limited"
    assert d.op.transport_failures_used == 0  # its own budget


def test_s21_429_with_retry_after_counts_too() -> None:
    d = Daemon.start(max_rate_limited=1)
    events = d.poll_and_respond(status=429, retry_after="60")
    assert _stop_reason(events) == "rate_limited"


# --- IETF RateLimit / RateLimit-Policy ------------------------------------------------------

RATELIMIT_TABLE = [
    pytest.param({"ratelimit": '"default";r=0;t=90'}, "rate_limit_policy", 90.0, [], id="RL-r0"),
    pytest.param({"ratelimit": '"default";r=2;t=100'}, "rate_limit_policy", 50.0, [], id="RL-pace"),
    pytest.param(
        {"ratelimit": "limit=10, remaining=0, reset=70"},
        "rate_limit_policy",
        70.0,
        [],
        id="RL-old-dictionary",
    ),
    pytest.param(
        {"ratelimit_policy": '"default";q=2;w=120'}, "rate_limit_policy", 60.0, [], id="RL-policy"
    ),
    pytest.param(
        {"ratelimit_policy": "10;w=600"}, "rate_limit_policy", 60.0, [], id="RL-old-policy"
    ),
    pytest.param({"ratelimit": '"default";r=100;t=1'}, "local_backoff", 5.0, [], id="RL-no-effect"),
    pytest.param(
        {"ratelimit": '"default";r=-1;t=5'},
        "local_backoff",
        5.0,
        ["ratelimit"],
        id="RL-malformed-negative",
    ),
    pytest.param({"ratelimit": "%%%"}, "local_backoff", 5.0, ["ratelimit"], id="RL-garbage"),
    pytest.param(
        {"ratelimit_policy": '"d";q=0;w=5'},
        "local_backoff",
        5.0,
        ["ratelimit_policy"],
        id="RL-policy-zero-quota",
    ),
    pytest.param(
        {"ratelimit": '"d";r=0;t=90', "retry_after": "30"},
        "provider_retry_after",
        30.0,
        [],
        id="RL-retry-after-precedence",
    ),
]


@pytest.mark.parametrize(("headers", "source", "delay", "rejected"), RATELIMIT_TABLE)
def test_ratelimit_headers_pace_with_retry_after_precedence(
    headers: dict[str, str], source: str, delay: float, rejected: list[str]
) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(draw=0.0, headers=headers)
    scheduled = _schedule(events)
    assert scheduled.delay_source == source
    assert scheduled.delay == pytest.approx(delay)
    assert [e.hint for e in events if isinstance(e, HintRejected)] == rejected


def test_poll_clamped_to_deadline_then_stops_there() -> None:
    d = Daemon.start(deadline_at=T0 + 60)
    d.poll_and_respond(draw=0.0)
    events = d.poll_and_respond(status=200, ratelimit='"d";r=0;t=55')
    scheduled = _schedule(events)
    assert scheduled.clamped_to_deadline
    assert scheduled.next_poll_at == T0 + 60
    stop = d.wake(T0 + 60)
    assert _stop_reason(stop) == "deadline_exceeded"


def test_quota_deferral_records_local_quota_never_past_deadline() -> None:
    d = Daemon.start()
    d.poll_and_respond(draw=0.0)
    due = d.op.next_poll_at
    [scheduled] = d.quota(due, due + 30)
    assert isinstance(scheduled, PollScheduled)
    assert (scheduled.delay_source, scheduled.next_poll_at) == ("local_quota", due + 30)
    assert d.wake(due + 29) == []
    [far] = d.quota(due + 30, T0 + 99999)
    assert isinstance(far, PollScheduled)
    assert far.next_poll_at == T0 + 2400
    assert far.clamped_to_deadline
    assert d.quota(due + 31, due + 1) == []  # a quota never makes a poll earlier


def test_simple_contract_without_optional_pointers() -> None:
    d = Daemon.start(c=simple_contract())
    assert tags(d.poll_and_respond(content=b'{"state":"running"}')) == [
        "response_classified",
        "poll_scheduled",
    ]
    events = d.poll_and_respond(content=b'{"state":"done"}')
    assert tags(events) == ["response_classified", "operation_succeeded"]


def test_ratelimit_paces_a_429_beyond_its_default_delay() -> None:
    d = Daemon.start()
    events = d.poll_and_respond(status=429, draw=0.0, ratelimit='"d";r=0;t=1000')
    scheduled = _schedule(events)
    assert (scheduled.delay_source, scheduled.delay) == ("rate_limit_policy", 1000.0)


@pytest.mark.parametrize(
    "state", [pytest.param(s, id=f"S1-{s}") for s in ("queued", "running", "processing")]
)
def test_s1_pending_only_permits_observing_again(state: str) -> None:
    d = Daemon.start()
    events = d.poll_and_respond(
        content=body(state, result=OK_RESULT), ratelimit='"d";r=1;t=1', request_id="r"
    )
    # Nothing but the classification and the next observation: no success, no results.
    assert set(tags(events)) <= {"response_classified", "hint_rejected", "poll_scheduled"}
    assert tags(events)[-1] == "poll_scheduled"
    assert d.op.phase == "live"
    assert d.op.results == {}
