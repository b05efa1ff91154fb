"""S26/S27 escalations (reasons, options, context, no secret), S36 decisions, S17 counters,
S24 (no retry with the same credential), S29 (no resubmission without idempotency + key)."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from replay import (
    DecisionRecorded,
    DecisionRejected,
    EscalationRaised,
    OperationStopped,
    PollScheduled,
    encode_event,
)
from replay.decide import decide
from replay.events import StopReason
from replay.observations import InternalFault
from replay.tables import OPTION_EFFECTS, REASON_OPTIONS

from .helpers import T0, Daemon, body, contract, tags


def _escalate(d: Daemon, reason: StopReason) -> EscalationRaised:
    """Drive ``d`` into a stop with ``reason``."""
    if reason == "deadline_exceeded":
        d.poll_and_respond()
        d.wake(d.op.deadline_at)
    elif reason == "business_deadline_exceeded":
        d.wake(d.op.effective_deadline[0])
    elif reason == "request_budget_exhausted":
        while d.op.phase == "live":
            d.poll_and_respond()
    elif reason == "retry_after_past_deadline":
        d.poll_and_respond(status=503, retry_after="99999")
    elif reason == "rate_limited":
        while d.op.phase == "live":
            d.poll_and_respond(status=429)
    elif reason == "internal_error":
        d.poll_and_respond()
        d._append(
            decide(d.op, InternalFault(detail="ValueError while polling"), d.op.next_poll_at, 0.0)
        )
    elif reason == "delivery_ambiguous":
        while d.op.phase == "live":
            now = d.op.next_poll_at
            d.poll(now)
            d.fail(now + 1, "read_timeout")
    else:
        content = {
            "unknown_state": body("paused"),
            "unparseable_response": b"<html>",
            "contradiction": body("succeeded"),
            "provider_failure": body("failed", error="boom"),
            "canceled": body("canceled"),
            "expired": body("expired"),
        }
        status = {
            "integration_failure": 302,
            "not_found": 404,
            "authorization_denied": 401,
        }
        if reason == "not_found":
            d.poll(T0 + 100)
            d.respond(T0 + 100, 404)
        else:
            d.poll_and_respond(status=status.get(reason, 200), content=content.get(reason, b""))
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised), tags(d.log[-3:])
    assert raised.reason == reason
    return raised


ALL_REASONS: list[StopReason] = list(REASON_OPTIONS)


def _business(reason: StopReason) -> dict[str, float]:
    return {"business_deadline_at": T0 + 1200} if reason == "business_deadline_exceeded" else {}


@pytest.mark.parametrize("reason", [pytest.param(r, id=f"S26-{r}") for r in ALL_REASONS])
def test_s26_every_reason_reachable_with_its_permitted_options(reason: StopReason) -> None:
    c = contract(cancel_documented=True, idempotent_submit=True)
    d = Daemon.start(c=c, idempotency_key="idem-1", **_business(reason))
    raised = _escalate(d, reason)
    offered = [o.id for o in raised.options]
    assert offered == list(REASON_OPTIONS[reason])
    assert d.op.phase == "escalated"
    assert d.op.stop_reason == reason
    assert d.wake(T0 + 99_999) == []  # escalated: nothing more happens on its own


@pytest.mark.parametrize("reason", [pytest.param(r, id=f"S27-{r}") for r in ALL_REASONS])
def test_s27_cancel_only_documented_resubmit_only_idempotent(reason: StopReason) -> None:
    d = Daemon.start(c=contract(), idempotency_key="idem-1", **_business(reason))
    offered = [o.id for o in _escalate(d, reason).options]
    assert "cancel_at_provider" not in offered  # not documented
    assert "retry_same_idempotency_key" not in offered  # S29: not idempotent
    d = Daemon.start(c=contract(idempotent_submit=True), **_business(reason))
    offered = [o.id for o in _escalate(d, reason).options]
    assert "retry_same_idempotency_key" not in offered  # S29: no key recorded
    assert offered  # a finite, non-empty list: never "continue?"


def test_s24_authorization_denied_never_retries_with_same_credential() -> None:
    c = contract(cancel_documented=True, idempotent_submit=True)
    d = Daemon.start(c=c, idempotency_key="k")
    offered = {o.id for o in _escalate(d, "authorization_denied").options}
    assert offered == {"rotate_credential_and_resume", "inspect_provider_console", "abandon"}
    assert "extend" not in offered


def test_s29_canceled_expired_failure_never_resubmit() -> None:
    for reason in ("canceled", "expired", "provider_failure"):
        assert "retry_same_idempotency_key" not in REASON_OPTIONS[reason]
        assert "extend" not in REASON_OPTIONS[reason]


def test_s27_options_carry_concrete_numbers() -> None:
    """S37: the request for approval states the proposed extra time and checks, as numbers."""
    d = Daemon.start()
    raised = _escalate(d, "request_budget_exhausted")
    extend = raised.options[0]
    assert extend.id == "extend"
    assert extend.label == (
        "extend: deadline 2025-04-18T10:40:00Z -> 2025-04-18T10:55:00Z (+15 min, counted from "
        "the approval if the deadline has passed by then), checks 12 -> 16 (+4), "
        "transport failures 3 -> 6 (+3), rate-limited 3 -> 6 (+3)"
    )
    assert extend.params == {
        "add_seconds": 900,
        "add_status_requests": 4,
        "add_transport_failures": 3,
        "add_rate_limited": 3,
    }


def test_s27_retry_after_past_deadline_extension_covers_the_wait() -> None:
    d = Daemon.start()
    raised = _escalate(d, "retry_after_past_deadline")
    extend = raised.options[0]
    assert extend.params["add_seconds"] == 99_999 + 900
    d.decision(T0 + 10, "extend")
    scheduled = d.log[-1]
    assert isinstance(scheduled, PollScheduled)
    # S20: the extension does not skip the provider's guidance.
    assert scheduled.next_poll_at == T0 + 5 + 99_999
    assert scheduled.delay_source == "manual_extension"


def test_s27_context_and_histogram_without_secrets() -> None:
    d = Daemon.start(account_context="acme/reports")
    d.poll_and_respond(content=body("queued"), request_id="r1")
    d.poll_and_respond(status=503, content=b"", request_id="r2")
    d.poll_and_respond(content=body("running"), request_id="r3")
    d.poll_and_respond(
        content=body("succeeded", result={"url": "ftp://x/?token=SECRET"}), request_id="r4"
    )
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    ctx = raised.context
    assert (ctx.operation_id, ctx.provider_job_id, ctx.provider) == (
        "report-export-2025-04-18-01",
        "exp_71c",
        "acme",
    )
    assert ctx.reason == "contradiction"
    assert ctx.last_state == "succeeded"
    assert (ctx.status_requests_used, ctx.max_status_requests) == (4, 12)
    assert (ctx.transport_failures_used, ctx.max_transport_failures) == (1, 3)
    assert (ctx.last_http_status, ctx.last_provider_request_id) == (200, "r4")
    assert ctx.last_http_at == d.op.last_http_at
    assert ctx.elapsed_seconds == raised.at - T0
    assert ctx.histogram.status_codes == {"200": 3, "503": 1}
    assert ctx.histogram.job_states == {"queued": 1, "running": 1, "succeeded": 1}
    encoded = encode_event(raised)
    assert b"SECRET" not in encoded
    assert b"acme/reports" not in encoded


# --- S36 decisions ------------------------------------------------------------------------------


def test_s36_extension_is_new_authorization_with_approver_counters_kept() -> None:
    d = Daemon.start()
    _escalate(d, "request_budget_exhausted")
    before = d.op
    now = T0 + 1000
    events = d.decision(now, "extend", approver="alice", note="export is worth it")
    assert tags(events) == ["decision_recorded", "poll_scheduled"]
    recorded, scheduled = events
    assert isinstance(recorded, DecisionRecorded)
    assert isinstance(scheduled, PollScheduled)
    assert (recorded.approver, recorded.note) == ("alice", "export is worth it")
    assert recorded.resumes
    assert recorded.new_deadline_at == max(before.deadline_at, now) + 900
    assert recorded.new_max_status_requests == 12 + 4
    assert scheduled.delay_source == "manual_extension"
    # S17: counters are never reset.
    assert d.op.status_requests_used == before.status_requests_used == 12
    assert d.op.phase == "live"
    assert d.op.escalation is None
    assert tags(d.wake(scheduled.next_poll_at)) == ["status_request_intended"]
    assert d.op.status_requests_used == 13


def test_s36_deadline_extension_moves_the_deadline() -> None:
    d = Daemon.start()
    _escalate(d, "deadline_exceeded")
    now = T0 + 2500
    d.decision(now, "extend")
    assert d.op.deadline_at == now + 900
    assert d.op.status_requests_used == 1  # S17


def test_s28_business_extension_moves_the_business_deadline() -> None:
    d = Daemon.start(business_deadline_at=T0 + 600)
    _escalate(d, "business_deadline_exceeded")
    d.decision(T0 + 700, "extend")
    assert d.op.business_deadline_at == T0 + 700 + 900
    assert d.op.deadline_at == T0 + 2400


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        pytest.param("continue", "was not offered", id="S36-not-offered"),
        pytest.param("cancel_at_provider", "was not offered", id="S36-cancel-undocumented"),
        pytest.param("", "was not offered", id="S36-empty"),
    ],
)
def test_s36_decision_not_offered_is_rejected_and_changes_nothing(option: str, reason: str) -> None:
    d = Daemon.start()
    _escalate(d, "request_budget_exhausted")
    before = d.op
    [rejected] = d.decision(T0 + 1000, option, approver="mallory")
    assert isinstance(rejected, DecisionRejected)
    assert reason in rejected.reason
    assert rejected.approver == "mallory"
    assert d.op == before


def test_s36_decision_without_open_escalation_or_stale_is_rejected() -> None:
    d = Daemon.start()
    before = d.op
    [rejected] = d.decision(T0 + 1, "extend")
    assert isinstance(rejected, DecisionRejected)
    assert "no escalation" in rejected.reason
    assert d.op == before
    _escalate(d, "request_budget_exhausted")
    from replay import DecisionSubmitted, decide

    stale = DecisionSubmitted(option="extend", approver="bob", escalation_id=7)
    [rejected] = decide(d.op, stale, T0 + 5, 0.0)
    assert isinstance(rejected, DecisionRejected)
    assert "escalation 7" in rejected.reason
    [rejected] = d.decision(T0 + 5, "extend", approver="  ")
    assert isinstance(rejected, DecisionRejected)
    assert "approver" in rejected.reason


@pytest.mark.parametrize(
    "option",
    [
        pytest.param(o, id=f"S36-closes-{o}")
        for o in (
            "abandon",
            "inspect_provider_console",
            "cancel_at_provider",
            "retry_same_idempotency_key",
        )
    ],
)
def test_s36_closing_options_name_a_follow_up(option: str) -> None:
    c = contract(cancel_documented=True, idempotent_submit=True)
    d = Daemon.start(c=c, idempotency_key="k")
    _escalate(d, "delivery_ambiguous")
    [recorded] = d.decision(T0 + 10_000, option)
    assert isinstance(recorded, DecisionRecorded)
    assert not recorded.resumes
    assert recorded.follow_up == option
    assert d.op.phase == "closed"
    assert d.op.follow_up == option
    assert d.wake(T0 + 20_000) == []
    [again] = d.decision(T0 + 20_001, "extend")
    assert isinstance(again, DecisionRejected)


def test_s24_rotate_credential_resumes_as_new_authorization() -> None:
    d = Daemon.start()
    _escalate(d, "authorization_denied")
    events = d.decision(T0 + 100, "rotate_credential_and_resume", approver="ops")
    assert tags(events) == ["decision_recorded", "poll_scheduled"]
    assert d.op.phase == "live"


def test_s17_counters_never_reset_across_extensions() -> None:
    d = Daemon.start(max_status_requests=2, max_transport_failures=1)
    seen = []
    for round_ in range(3):
        while d.op.phase == "live":
            now = d.op.next_poll_at
            d.poll(now)
            d.fail(now + 1, "dns") if round_ == 1 else d.respond(now, 200, body("running"))
        seen.append((d.op.status_requests_used, d.op.transport_failures_used))
        d.decision(d.op.next_poll_at + 1, "extend")
    assert seen == sorted(seen)
    assert all(a <= b for a, b in itertools.pairwise(seen))


def test_option_effects_table_is_complete() -> None:
    kinds = {k for ks in REASON_OPTIONS.values() for k in ks}
    assert kinds == set(OPTION_EFFECTS)
    assert {k for k, v in OPTION_EFFECTS.items() if v} == {"extend", "rotate_credential_and_resume"}


def test_stop_precedes_escalation_and_escalation_ids_count_up() -> None:
    d = Daemon.start(max_status_requests=1)
    first = _escalate(d, "request_budget_exhausted")
    assert isinstance(d.log[-2], OperationStopped)
    d.decision(T0 + 100, "extend")
    while d.op.phase == "live":
        d.poll_and_respond()
    second = d.log[-1]
    assert isinstance(second, EscalationRaised)
    assert (first.escalation_id, second.escalation_id) == (1, 2)
    assert msgspec.structs.asdict(d.op)["escalations_raised"] == 2
