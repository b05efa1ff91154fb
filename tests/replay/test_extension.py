"""An approved ``extend`` adds what its label says (issue 37), and an old log keeps its rule.

``tests/vectors/extend_at_least.jsonl`` is a log written by bide before the rule was recorded
(commit ad6464d), one ``encode_event`` per line, never regenerated. It was made with that
commit's ``replay`` and ``tests/replay/helpers.py`` (``git archive ad6464d replay tests``):
``unknown-state-early`` (budget 12) answered queued, running, then the unknown ``paused`` at
request 3, was extended 120 s later with the note "provider says 30 min more" (under the old
rule: nothing added), then polled once more; ``budget-spent`` (budget 3) spent its budget,
was extended 60 s later (budget raised to used + 4) and polled once more. Every draw was 0.5.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import DecisionRecorded, EscalationRaised, check, decode_event, encode_event
from replay.events import Event, OperationRegistered
from replay.state import Operation, fold
from replay.text import format_time

from .helpers import HOUR, T0, Daemon, body

VECTOR = Path(__file__).parents[1] / "vectors" / "extend_at_least.jsonl"


def _vector() -> list[Event]:
    return [decode_event(line) for line in VECTOR.read_bytes().splitlines()]


def _decisions(log: list[Event]) -> list[DecisionRecorded]:
    return [e for e in log if isinstance(e, DecisionRecorded)]


def test_an_old_log_replays_to_the_values_it_had() -> None:
    """S36: an extension recorded under the old rule replays to what it was."""
    log = _vector()
    ops = {e.operation_id: e for e in log if isinstance(e, OperationRegistered)}
    assert {op.extend_rule for op in ops.values()} == {"at_least"}  # no field in the old log
    state: dict[str, Operation] = fold(log)
    early, spent = state["unknown-state-early"], state["budget-spent"]
    # The old rule: "extend 15 minutes and 4 more checks" added nothing to a deadline and a
    # budget that were not reached, and raised a spent budget to used + 4.
    assert (early.deadline_at, early.max_status_requests) == (T0 + 2400, 12)
    assert (spent.deadline_at, spent.max_status_requests) == (T0 + 2400, 3 + 4)
    labels = {o.label for e in log if isinstance(e, EscalationRaised) for o in e.options}
    assert "extend 15 minutes and 4 more checks" in labels


def test_an_old_log_re_derives_exactly_under_its_own_rule() -> None:
    """``bide replay --check`` re-runs today's ``decide`` on the old log: every escalation's
    label and every decision's values come out as they were recorded."""
    assert check(_vector()) == []


def test_a_new_registration_records_the_add_rule() -> None:
    d = Daemon.start()
    registered = d.log[0]
    assert isinstance(registered, OperationRegistered)
    assert registered.extend_rule == "add"
    assert decode_event(encode_event(registered)) == registered


def _unknown_state_early() -> Daemon:
    d = Daemon.start(max_status_requests=12)
    d.poll_and_respond(content=body("queued"))
    d.poll_and_respond(content=body("paused"))  # unknown_state at request 2 of 12
    assert d.op.phase == "escalated"
    return d


def test_extend_adds_its_time_and_checks_to_a_deadline_and_budget_not_reached() -> None:
    d = _unknown_state_early()
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    [extend] = [o for o in raised.options if o.id == "extend"]
    assert extend.label.startswith(
        f"extend: deadline {format_time(T0 + 2400)} -> {format_time(T0 + 3300)} (+15 min, "
    )
    assert "checks 12 -> 16 (+4)" in extend.label
    d.decision(raised.at + 600, "extend", note="provider says 30 min more")
    assert (d.op.deadline_at, d.op.max_status_requests) == (T0 + 2400 + 900, 12 + 4)
    assert (d.op.max_transport_failures, d.op.max_rate_limited) == (3 + 3, 3 + 3)
    assert d.op.status_requests_used == 2  # S17: counters stay


def test_the_same_escalation_under_the_old_rule_adds_nothing() -> None:
    """What the old rule did to the same operation: the reason the rule is recorded."""
    d = _unknown_state_early()
    d.op = msgspec.structs.replace(d.op, extend_rule="at_least")
    d.decision(d.log[-1].at + 600, "extend")
    assert (d.op.deadline_at, d.op.max_status_requests) == (T0 + 2400, 12)


def test_an_extension_approved_after_the_deadline_counts_from_the_approval() -> None:
    d = Daemon.start()
    d.poll_and_respond()
    d.wake(d.op.deadline_at)  # deadline_exceeded
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    [extend] = [o for o in raised.options if o.id == "extend"]
    assert extend.label.startswith(
        f"extend: deadline {format_time(T0 + 2400)} passed -> 15 min after the approval, "
    )
    approved = T0 + 2400 + 2 * HOUR  # a human answered two hours later
    d.decision(approved, "extend")
    assert d.op.deadline_at == approved + 900


_LABEL = re.compile(
    r"deadline (?P<old>\S+) -> (?P<new>\S+) \(\+15 min, .*\), "
    r"checks (?P<c0>\d+) -> (?P<c1>\d+) \(\+4\), "
    r"transport failures (?P<t0>\d+) -> (?P<t1>\d+) \(\+3\), "
    r"rate-limited (?P<r0>\d+) -> (?P<r1>\d+) \(\+3\)$"
)


@settings(max_examples=150, deadline=None)
@given(
    budget=st.integers(min_value=2, max_value=40),
    pending=st.integers(min_value=0, max_value=39),
    unknown=st.booleans(),
    deadline_minutes=st.integers(min_value=120, max_value=24 * 60),
    wait=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_label_states_exactly_what_an_approval_before_the_deadline_applies(
    budget: int, pending: int, unknown: bool, deadline_minutes: int, wait: float
) -> None:
    """S36, S37: the numbers the approver reads are the numbers the decision applies."""
    d = Daemon.start(max_status_requests=budget, deadline_at=T0 + deadline_minutes * 60)
    for _ in range(min(pending, budget - 1)):
        d.poll_and_respond(content=body("running"))
    if unknown:
        d.poll_and_respond(content=body("paused"))
    else:
        while d.op.phase == "live":
            d.poll_and_respond(content=body("running"))
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    [extend] = [o for o in raised.options if o.id == "extend"]
    said = _LABEL.search(extend.label)
    assert said is not None, extend.label
    before = d.op
    approved = raised.at + wait * (before.deadline_at - raised.at)  # any time up to the deadline
    d.decision(approved, "extend")
    assert format_time(before.deadline_at) == said["old"]
    assert format_time(d.op.deadline_at) == said["new"]
    assert d.op.deadline_at == before.deadline_at + 900
    stated = {k: int(v) for k, v in said.groupdict().items() if k not in ("old", "new")}
    assert stated == {
        "c0": before.max_status_requests,
        "c1": d.op.max_status_requests,
        "t0": before.max_transport_failures,
        "t1": d.op.max_transport_failures,
        "r0": before.max_rate_limited,
        "r1": d.op.max_rate_limited,
    }
    assert d.op.max_status_requests == before.max_status_requests + 4
    assert check(d.log) == []


def test_a_business_deadline_stop_moves_the_business_deadline_as_labelled() -> None:
    d = Daemon.start(business_deadline_at=T0 + 600)
    d.wake(T0 + 600)
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    assert raised.reason == "business_deadline_exceeded"
    [extend] = [o for o in raised.options if o.id == "extend"]
    assert extend.label.startswith(
        f"extend: business deadline {format_time(T0 + 600)} passed -> 15 min after the approval"
    )
    d.decision(T0 + 700, "extend")
    assert d.op.business_deadline_at == T0 + 700 + 900
    assert d.op.deadline_at == T0 + 2400  # the operation's own deadline stays


def test_an_extension_past_an_earlier_business_deadline_says_that_one_stays() -> None:
    """The label does not promise time the business deadline (S28) will not give."""
    d = Daemon.start(business_deadline_at=T0 + 1800)
    d.poll_and_respond(content=body("paused"))
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised)
    [extend] = [o for o in raised.options if o.id == "extend"]
    assert f"(the business deadline {format_time(T0 + 1800)} stays)" in extend.label
    d.decision(raised.at + 60, "extend")
    assert d.op.effective_deadline == (T0 + 1800, "business")
