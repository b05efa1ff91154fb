"""A provider's own rate-limit headers (GitHub: ``x-ratelimit-remaining`` and
``x-ratelimit-reset``, epoch seconds): a 403 or 429 with nothing remaining is rate-limited (S21),
waited out until the reset, never read as a refused credential (S24)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from replay import Contract, HintRejected, OperationStopped, PollScheduled, ResponseClassified
from replay.contract import contract_digest
from replay.events import Event, StatusResponseReceived

from .helpers import Daemon, contract

GITHUB = {
    "rate_limit_remaining_header": "x-ratelimit-remaining",
    "rate_limit_reset_header": "x-ratelimit-reset",
}


def _start(max_rate_limited: int = 3) -> Daemon:
    return Daemon.start(c=contract(**GITHUB), max_rate_limited=max_rate_limited)


def _limited(d: Daemon, status: int, reset_in: float | None, remaining: str = "0") -> list[Event]:
    """Poll when due; the provider answers ``status`` with nothing ``remaining``."""
    now = d.op.next_poll_at
    assert now is not None
    headers = {"ratelimit_remaining": remaining}
    if reset_in is not None:
        headers["ratelimit_reset"] = str(int(now + reset_in))
    d.poll(now)
    return d.respond(now, status, b'{"message": "API rate limit exceeded"}', headers=headers)


T = TypeVar("T")


def _one(events: list[Event], kind: type[T]) -> T:
    [found] = [e for e in events if isinstance(e, kind)]
    return found


@pytest.mark.parametrize("status", [403, 429])
def test_s21_nothing_remaining_waits_until_the_reset_and_counts(status: int) -> None:
    d = _start()
    now = d.op.next_poll_at
    events = _limited(d, status, reset_in=600)
    assert _one(events, ResponseClassified).http_outcome == "rate_limited"
    scheduled = _one(events, PollScheduled)
    assert scheduled.next_poll_at == int(now + 600)  # at the reset, never before
    assert scheduled.until == int(now + 600)
    assert scheduled.delay_source == "provider_retry_after"
    assert not scheduled.clamped_to_deadline
    assert d.op.rate_limited_used == 1
    assert not [e for e in events if isinstance(e, OperationStopped)]


def test_s21_a_near_reset_replaces_the_long_rate_limited_delay() -> None:
    d = _start()
    now = d.op.next_poll_at
    scheduled = _one(_limited(d, 403, reset_in=20), PollScheduled)
    assert scheduled.next_poll_at == int(now + 20)
    assert scheduled.raw_delay < contract().rate_limited_delay_seconds


def test_s21_a_reset_past_the_deadline_is_clamped_then_the_deadline_stops() -> None:
    d = _start()
    scheduled = _one(_limited(d, 403, reset_in=3 * 3600), PollScheduled)
    assert scheduled.clamped_to_deadline
    assert scheduled.next_poll_at == d.op.deadline_at
    stops = [e for e in d.wake(d.op.deadline_at) if isinstance(e, OperationStopped)]
    assert [s.reason for s in stops] == ["deadline_exceeded"]


def test_s21_the_rate_limited_budget_stops_a_403_too() -> None:
    d = _start(max_rate_limited=1)
    stopped = _one(_limited(d, 403, reset_in=60), OperationStopped)
    assert stopped.reason == "rate_limited"
    assert "HTTP 403 with no requests remaining" in stopped.detail


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-headers"),
        pytest.param({"ratelimit_remaining": "4999", "ratelimit_reset": "1744974000"}, id="left"),
    ],
)
def test_s24_a_403_with_requests_remaining_is_still_a_refused_credential(
    headers: dict[str, str],
) -> None:
    d = _start()
    events = d.poll_and_respond(status=403, content=b"{}", headers=headers)
    assert _one(events, ResponseClassified).http_outcome == "auth_denied"
    assert _one(events, OperationStopped).reason == "authorization_denied"
    assert d.op.rate_limited_used == 0


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("soon", "not epoch seconds (1*DIGIT)"),
        ("-5", "not epoch seconds (1*DIGIT)"),
        ("1744974000.5", "not epoch seconds (1*DIGIT)"),
        ("9" * 13, "epoch seconds absurdly large"),
        ("1000", "in the past"),
        ("1800000000", "beyond the hint horizon of 86400.0 s"),
    ],
)
def test_s8_a_bad_reset_is_refused_recorded_and_the_wait_is_the_429_delay(
    value: str, reason: str
) -> None:
    d = _start()
    events = d.poll_and_respond(
        status=403, content=b"{}", headers={"ratelimit_remaining": "0", "ratelimit_reset": value}
    )
    rejected = _one(events, HintRejected)
    assert (rejected.hint, rejected.value, rejected.reason) == ("ratelimit_reset", value, reason)
    scheduled = _one(events, PollScheduled)
    assert scheduled.raw_delay == contract().rate_limited_delay_seconds
    assert d.op.rate_limited_used == 1


def test_the_headers_go_together_and_are_left_out_of_the_digest_when_unset() -> None:
    with pytest.raises(msgspec.ValidationError, match="give both or neither"):
        contract(rate_limit_remaining_header="x-ratelimit-remaining")
    with pytest.raises(msgspec.ValidationError):
        contract(**{**GITHUB, "rate_limit_reset_header": "bad header"})
    plain = contract()
    assert contract_digest(plain) == contract_digest(
        msgspec.convert(
            {**msgspec.to_builtins(plain), "rate_limit_remaining_header": None}, Contract
        )
    )
    assert contract_digest(contract(**GITHUB)) != contract_digest(plain)


def test_a_response_recorded_before_the_headers_existed_decodes() -> None:
    old = (
        b'{"type":"status_response_received","operation_id":"op","at":1.0,"request_number":1,'
        b'"status_code":403,"headers":{"retry_after":null,"ratelimit":null,'
        b'"ratelimit_policy":null,"request_id":null,"location":null,"content_type":null},'
        b'"body":"","body_truncated":false}'
    )
    event = msgspec.json.decode(old, type=StatusResponseReceived)
    assert event.headers.ratelimit_remaining is None
    assert event.headers.ratelimit_reset is None
