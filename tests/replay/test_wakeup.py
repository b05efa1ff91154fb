"""S32 order on a wake-up, exactly; S9, S12, S13, S16, S17, S28; registration."""

from __future__ import annotations

import msgspec
import pytest

from replay import (
    OperationRegistered,
    OperationStopped,
    RegistrationRejected,
    StatusRequestIntended,
    WakeUp,
    decide,
    evolve,
    register,
)
from replay.errors import InvalidInputError
from replay.state import Operation

from .helpers import HOUR, T0, Daemon, contract, registration, tags


def _op(**changes: object) -> Operation:
    op = Daemon.start().op
    return msgspec.structs.replace(op, **changes)


# Each row: state changes, now offset from T0, expected tags, expected stop reason.
S32_ORDER = [
    pytest.param({"phase": "succeeded"}, 10 * HOUR, [], None, id="S32-terminal-nothing"),
    pytest.param({"phase": "escalated"}, 10 * HOUR, [], None, id="S32-escalated-nothing"),
    pytest.param({"phase": "closed"}, 10 * HOUR, [], None, id="S32-closed-nothing"),
    pytest.param({"in_flight": 3}, 10 * HOUR, [], None, id="S32-in-flight-nothing"),
    pytest.param(
        {"status_requests_used": 12},
        2400.0,
        ["operation_stopped", "escalation_raised"],
        "deadline_exceeded",
        id="S32-deadline-before-budget",
    ),
    pytest.param(
        {"next_poll_at": T0 + 99 * HOUR},
        2400.0,
        ["operation_stopped", "escalation_raised"],
        "deadline_exceeded",
        id="S32-deadline-before-not-due",
    ),
    pytest.param(
        {"status_requests_used": 12, "next_poll_at": T0 + 2000},
        100.0,
        ["operation_stopped", "escalation_raised"],
        "request_budget_exhausted",
        id="S32-budget-before-not-due",
    ),
    pytest.param({"next_poll_at": T0 + 100}, 99.0, [], None, id="S32-not-yet-due"),
    pytest.param(
        {"next_poll_at": T0 + 100},
        100.0,
        ["status_request_intended"],
        None,
        id="S32-due-intent",
    ),
]


@pytest.mark.parametrize(("changes", "offset", "expected", "reason"), S32_ORDER)
def test_s32_order_on_wake_up(
    changes: dict[str, object], offset: float, expected: list[str], reason: str | None
) -> None:
    op = _op(**changes)
    events = decide(op, WakeUp(), T0 + offset, 0.0)
    assert tags(events) == expected
    if reason is not None:
        assert isinstance(events[0], OperationStopped)
        assert events[0].reason == reason


def test_s13_intent_carries_counter_after_increment_and_deadline() -> None:
    d = Daemon.start()
    [intent] = d.wake(T0 + 5)
    assert intent == StatusRequestIntended(
        operation_id=d.op.operation_id,
        at=T0 + 5,
        request_number=1,
        deadline_at=T0 + 2400,
        max_status_requests=12,
    )
    # S13: the state counts it before any response exists.
    assert d.op.status_requests_used == 1
    assert d.op.in_flight == 1


def test_s9_no_catch_up_burst_after_downtime() -> None:
    d = Daemon.start()
    d.poll_and_respond()
    late = d.op.next_poll_at + 1500  # the daemon slept through many intervals
    assert tags(d.wake(late)) == ["status_request_intended"]
    assert d.wake(late) == []  # one in flight: no second request
    assert d.wake(late + 1) == []
    assert d.op.status_requests_used == 2


@pytest.mark.parametrize(
    ("state", "expected_last"),
    [
        pytest.param("running", "running", id="S16-reports-last-state"),
        pytest.param("processing", "processing", id="S16-state-just-changed"),
    ],
)
def test_s16_deadline_stops_even_if_state_just_changed(state: str, expected_last: str) -> None:
    from .helpers import body

    d = Daemon.start()
    d.poll_and_respond(content=body("running"))
    # The state changes on the very response received at the deadline: still a timeout.
    d.poll(T0 + 2399)
    events = d.respond(T0 + 2400, content=body(state))
    assert tags(events) == ["response_classified", "operation_stopped", "escalation_raised"]
    stopped = events[1]
    assert isinstance(stopped, OperationStopped)
    assert stopped.reason == "deadline_exceeded"
    assert stopped.last_state == expected_last
    assert d.op.phase == "escalated"


def test_s16_wake_up_at_deadline_reports_last_state() -> None:
    from .helpers import body

    d = Daemon.start()
    d.poll_and_respond(content=body("queued"))
    events = d.wake(T0 + 2400)
    assert tags(events) == ["operation_stopped", "escalation_raised"]
    assert isinstance(events[0], OperationStopped)
    assert events[0].last_state == "queued"
    assert "last state 'queued'" in events[0].detail


@pytest.mark.parametrize(
    ("business_offset", "now_offset", "reason", "named"),
    [
        pytest.param(600.0, 600.0, "business_deadline_exceeded", "business", id="S28-business"),
        pytest.param(9000.0, 2400.0, "deadline_exceeded", "operation", id="S28-operation"),
    ],
)
def test_s28_stops_at_whichever_deadline_comes_first(
    business_offset: float, now_offset: float, reason: str, named: str
) -> None:
    d = Daemon.start(business_deadline_at=T0 + business_offset)
    assert d.op.effective_deadline == (min(T0 + business_offset, T0 + 2400), named)
    events = d.wake(T0 + now_offset)
    assert isinstance(events[0], OperationStopped)
    assert events[0].reason == reason
    assert f"{named} deadline" in events[0].detail


def test_s28_intent_names_effective_deadline_and_record_keeps_both() -> None:
    d = Daemon.start(business_deadline_at=T0 + 600)
    [intent] = d.wake(T0 + 5)
    assert isinstance(intent, StatusRequestIntended)
    assert intent.deadline_at == T0 + 600
    assert (d.op.deadline_at, d.op.business_deadline_at) == (T0 + 2400, T0 + 600)


def test_s17_budget_stop_when_next_request_would_exceed() -> None:
    d = Daemon.start(max_status_requests=2)
    d.poll_and_respond()
    events = d.poll_and_respond()
    # The second response used the budget: stop at once rather than wake once more (S17).
    assert tags(events)[-2:] == ["operation_stopped", "escalation_raised"]
    assert isinstance(events[-2], OperationStopped)
    assert events[-2].reason == "request_budget_exhausted"
    assert d.op.status_requests_used == 2


# --- registration (S5, S10, S12) ---------------------------------------------------------------

REJECTIONS = [
    pytest.param({"provider": "other"}, "provider_mismatch", id="provider"),
    pytest.param({"provider_job_id": ""}, "empty_job_id", id="empty-job-id"),
    pytest.param({"provider_job_id": "x" * 257}, "job_id_too_long", id="long-job-id"),
    pytest.param({"provider_job_id": "a\nb"}, "job_id_not_printable", id="control-job-id"),
    pytest.param({"deadline_at": T0}, "deadline_not_in_future", id="deadline-now"),
    pytest.param({"deadline_at": T0 - 1}, "deadline_not_in_future", id="deadline-past"),
    pytest.param({"business_deadline_at": T0}, "business_deadline_not_in_future", id="business"),
    pytest.param({"max_status_requests": 0}, "budget_not_positive", id="budget-zero"),
    pytest.param({"max_transport_failures": -1}, "budget_not_positive", id="transport-neg"),
    pytest.param({"started_at": T0 + 1}, "started_in_future", id="started-future"),
    pytest.param({"expected_terminal_state": "running"}, "unknown_expected_state", id="expect"),
]


@pytest.mark.parametrize(("changes", "reason"), REJECTIONS)
def test_s12_registration_rejected_with_reason(changes: dict[str, object], reason: str) -> None:
    request = msgspec.structs.replace(registration(), **changes)
    [event] = register(request, contract(), T0)
    assert isinstance(event, RegistrationRejected)
    assert event.reason == reason


def test_s5_s12_registration_record_has_defaults_from_contract() -> None:
    c = contract()
    [event] = register(registration(), c, T0)
    assert isinstance(event, OperationRegistered)
    op = evolve(None, event)
    assert (op.operation_id, op.provider, op.provider_job_id) == (
        "report-export-2025-04-18-01",
        "acme",
        "exp_71c",
    )
    assert (op.account_context, op.request_fingerprint) == ("acme/reports", "sha256:abc")
    assert op.started_at == T0
    assert op.deadline_at == T0 + 2400
    assert (op.max_status_requests, op.max_transport_failures, op.max_rate_limited) == (12, 3, 3)
    assert (op.status_requests_used, op.transport_failures_used, op.rate_limited_used) == (0, 0, 0)
    assert op.next_poll_at == T0 + 5  # S7: the provider's first-poll delay (the base here)
    assert op.contract == c
    assert len(op.contract_digest) == 64
    assert op.phase == "live"
    assert op.last_state is None


def test_s7_first_poll_follows_the_provider_schedule() -> None:
    fast = contract(
        first_poll_after_seconds=0.5,
        backoff_base_seconds=1.0,
        backoff_cap_seconds=10.0,
        rate_limited_delay_seconds=60.0,
    )
    [event] = register(registration(), fast, T0)
    assert isinstance(event, OperationRegistered)
    assert event.first_poll_at == T0 + 0.5
    [event] = register(registration(first_poll_after_seconds=60.0), fast, T0)
    assert isinstance(event, OperationRegistered)
    assert event.first_poll_at == T0 + 60


def test_registration_decoding_enforces_constraints() -> None:
    with pytest.raises(msgspec.ValidationError):
        registration(provider_job_id="")
    with pytest.raises(msgspec.ValidationError):
        registration(max_status_requests=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_decide_rejects_non_finite_now(bad: float) -> None:
    with pytest.raises(InvalidInputError):
        decide(_op(), WakeUp(), bad, 0.0)


@pytest.mark.parametrize("draw", [-0.1, 1.0, 2.0])
def test_decide_rejects_draw_outside_unit_interval(draw: float) -> None:
    with pytest.raises(InvalidInputError):
        decide(_op(), WakeUp(), T0, draw)
