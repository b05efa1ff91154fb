"""check re-derives every recorded decision (bide replay --check, S40)."""

from __future__ import annotations

import msgspec

from replay import (
    DecisionRecorded,
    Event,
    PollScheduled,
    StatusRequestIntended,
    check,
    decode_event,
    encode_event,
)

from .helpers import OK_RESULT, T0, Daemon, body


def _rich_log() -> list[Event]:
    d = Daemon.start(
        max_status_requests=8, max_transport_failures=5, business_deadline_at=T0 + 3000
    )
    d.poll_and_respond(content=body("queued"), draw=0.3)
    d.poll_and_respond(status=503, retry_after="120", request_id="r")
    d.poll_and_respond(content=body("running", poll_after_seconds=40), ratelimit="x;;")
    due = d.op.next_poll_at
    d.quota(due, due + 20)
    now = d.op.next_poll_at
    d.poll(now)
    d.fail(now + 3, "connect_refused")
    now = d.op.next_poll_at
    d.poll(now)
    d.outcome_unknown(now + 60)
    d.poll_and_respond(status=429)
    d.poll_and_respond(status=404)
    d.decision(d.op.next_poll_at + 10, "nope")
    d.decision(d.op.next_poll_at + 10, "extend", note="ok")
    d.poll_and_respond(content=body("succeeded", result=OK_RESULT))
    return d.log


def test_check_finds_nothing_on_a_protocol_log() -> None:
    """S40: every recorded decision can be re-derived from the log (a disputed one rebuilt)."""
    log = _rich_log()
    assert check(log) == []
    # ... also after the log's encoding round trip.
    assert check([decode_event(encode_event(e)) for e in log]) == []


def test_check_on_interleaved_operations() -> None:
    a = Daemon.start(operation_id="a")
    b = Daemon.start(operation_id="b")
    for _ in range(3):
        a.poll_and_respond()
        b.poll_and_respond(status=503)
    merged = [e for pair in zip(a.log, b.log, strict=False) for e in pair]
    merged += a.log[len(b.log) :] + b.log[len(a.log) :]
    assert check(merged) == []


def _replace_first(log: list[Event], cls: type, skip: int = 0, **changes: object) -> list[Event]:
    out = list(log)
    seen = 0
    for i, e in enumerate(out):
        if isinstance(e, cls):
            if seen == skip:
                out[i] = msgspec.structs.replace(e, **changes)
                return out
            seen += 1
    raise AssertionError("no such event")


def test_check_detects_a_poll_sent_before_it_was_due() -> None:
    log = _rich_log()
    second = [e for e in log if isinstance(e, StatusRequestIntended)][1]
    tampered = _replace_first(log, StatusRequestIntended, skip=1, at=second.at - 3)
    [mismatch] = check(tampered)
    assert mismatch.observation == "wake_up"
    assert "decide returns nothing" in mismatch.message


def test_check_detects_an_altered_schedule() -> None:
    log = _rich_log()
    first = next(e for e in log if isinstance(e, PollScheduled))
    tampered = _replace_first(log, PollScheduled, next_poll_at=first.next_poll_at - 1)
    mismatches = check(tampered)
    assert mismatches
    assert mismatches[0].observation == "status_response_received"
    assert mismatches[0].expected != mismatches[0].recorded


def test_check_detects_a_request_past_the_budget() -> None:
    d = Daemon.start(max_status_requests=1)
    d.poll_and_respond()
    log = d.log[:-2]  # drop the stop and the escalation ...
    log.append(  # ... and pretend a second request was intended
        StatusRequestIntended(
            operation_id=d.op.operation_id,
            at=d.op.next_poll_at + 100,
            request_number=2,
            deadline_at=d.op.deadline_at,
            max_status_requests=1,
        )
    )
    mismatches = check(log)
    assert len(mismatches) >= 1


def test_check_detects_a_decision_that_was_not_offered() -> None:
    log = _rich_log()
    tampered = _replace_first(log, DecisionRecorded, option_id="cancel_at_provider")
    mismatches = check(tampered)
    assert mismatches
    assert mismatches[0].observation == "decision_submitted"
