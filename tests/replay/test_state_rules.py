"""State rules (replay/rules.py): the first matching rule names the state and its category,
none matching is unknown; values compare by JSON type; the analysis refuses rules that can never
match, are shadowed, or overlap another category without saying so."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import Contract, StatusResponseReceived, contract_digest
from replay.events import OperationStopped
from replay.reading import read_response
from replay.rules import Condition, StateRule, first_match, holds, rule_problems
from tests.replay.helpers import Daemon, contract

CATEGORIES = ("pending", "success", "failure", "canceled", "expired")
scalars = st.one_of(
    st.text(max_size=4), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5])
)


def eq(pointer: str, *values: object) -> Condition:
    return msgspec.convert({"pointer": pointer, "test": "equals", "values": values}, Condition)


def rule(state: str, category: str, *when: Condition, fallback: bool = False) -> StateRule:
    return msgspec.convert(
        {"state": state, "category": category, "when": when, "fallback": fallback}, StateRule
    )


@given(st.lists(st.tuples(st.sampled_from("abc"), scalars), min_size=1, max_size=6), scalars)
def test_s3_the_first_matching_rule_wins_and_no_match_is_none(
    specs: list[tuple[str, object]], value: object
) -> None:
    rules = [rule(f"s{n}", CATEGORIES[n % 5], eq(f"/{k}", v)) for n, (k, v) in enumerate(specs)]
    document = {"a": value, "b": value, "c": value}
    expected = next(
        (r for r, (k, v) in zip(rules, specs, strict=True) if holds(eq(f"/{k}", v), document)),
        None,
    )
    assert first_match(rules, document) == expected


@given(scalars, scalars)
def test_s3_values_compare_by_json_type(a: object, b: object) -> None:
    same_type = (
        (isinstance(a, bool) and isinstance(b, bool))
        or (isinstance(a, str) and isinstance(b, str))
        or (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
        )
    )
    assert holds(eq("/v", a), {"v": b}) == (same_type and a == b)


@pytest.mark.parametrize(
    ("condition", "value"),
    [(eq("/v", "1"), 1), (eq("/v", 1), "1"), (eq("/v", True), "true"), (eq("/v", 1), True)],
)
def test_a_string_is_not_a_number_and_true_is_not_a_string(
    condition: Condition, value: object
) -> None:
    assert not holds(condition, {"v": value})


def test_present_absent_null_range_and_some() -> None:
    present = Condition(pointer="/v", test="present")
    absent = Condition(pointer="/v", test="absent")
    null = Condition(pointer="/v", test="null")
    ranged = Condition(pointer="/v", test="range", minimum=1, maximum=2)
    assert [holds(c, {}) for c in (present, absent, null, ranged)] == [False, True, False, False]
    assert [holds(c, {"v": None}) for c in (present, absent, null, ranged)] == [
        False,
        False,
        True,
        False,
    ]
    assert holds(ranged, {"v": 1.5})
    assert not holds(ranged, {"v": True})
    assert not holds(ranged, {"v": "1.5"})
    some = Condition(
        pointer="/c", test="some", where=(eq("/type", "Failed"), eq("/status", "True"))
    )
    assert holds(
        some, {"c": [{"type": "Complete", "status": "True"}, {"type": "Failed", "status": "True"}]}
    )
    assert not holds(
        some, {"c": [{"type": "Failed", "status": "False"}, {"type": "X", "status": "True"}]}
    )
    assert not holds(some, {"c": {"type": "Failed", "status": "True"}})


RULES = {
    "provider": "gh",
    "job_id_pointer": "/id",
    "results": [{"name": "url", "pointer": "/html_url", "kind": "https_url"}],
    "error_pointer": "/conclusion",
    "state_rules": [
        {
            "state": "running",
            "category": "pending",
            "when": [{"pointer": "/status", "test": "equals", "values": ["queued", "in_progress"]}],
        },
        {
            "state": "success",
            "category": "success",
            "when": [
                {"pointer": "/status", "test": "equals", "values": ["completed"]},
                {"pointer": "/conclusion", "test": "equals", "values": ["success"]},
            ],
        },
        {
            "state": "failure",
            "category": "failure",
            "when": [
                {"pointer": "/status", "test": "equals", "values": ["completed"]},
                {"pointer": "/conclusion", "test": "equals", "values": ["failure"]},
            ],
        },
    ],
}


def read(body: dict[str, object], **overrides: object) -> tuple[str | None, str | None, str | None]:
    c = msgspec.convert({**RULES, **overrides}, Contract)
    d = Daemon.start(c, provider="gh", provider_job_id="42")
    reading = read_response(
        d.op,
        StatusResponseReceived(
            operation_id="x",
            at=0.0,
            request_number=1,
            status_code=200,
            body=json.dumps(body).encode(),
        ),
        d.op.next_poll_at,
    )
    return reading.job_state, reading.job_outcome, reading.provider_error


def test_a_completed_failed_run_is_a_failure_with_its_error() -> None:
    assert read({"id": 42, "status": "completed", "conclusion": "failure"}) == (
        "failure",
        "failure",
        "failure",
    )


def test_no_rule_matching_is_unknown_and_says_what_it_saw() -> None:
    state, outcome, _ = read({"id": 42, "status": "completed", "conclusion": None})
    assert outcome == "unknown"
    assert state is not None
    assert "/conclusion=null" in state


def test_s3_no_rule_matching_stops_the_wait_naming_what_the_rules_saw() -> None:
    d = Daemon.start(msgspec.convert(RULES, Contract), provider="gh", provider_job_id="42")
    now = d.op.next_poll_at
    d.poll(now)
    events = d.respond(now, content=b'{"id": 42, "status": "completed", "conclusion": null}')
    stopped = [e for e in events if isinstance(e, OperationStopped)]
    assert [e.reason for e in stopped] == ["unknown_state"]
    assert "/conclusion=null" in stopped[0].detail
    assert "no state rule classifies this answer" in stopped[0].detail
    assert "state table" not in stopped[0].detail  # the simple format's words, not the rules'


def test_s5_a_numeric_id_in_the_body_matches_the_registered_id_as_text() -> None:
    assert read({"id": 42, "status": "queued"})[1] == "pending"
    c = msgspec.convert(RULES, Contract)
    d = Daemon.start(c, provider="gh", provider_job_id="43")
    reading = read_response(
        d.op,
        StatusResponseReceived(
            operation_id="x",
            at=0.0,
            request_number=1,
            status_code=200,
            body=b'{"id": 42, "status": "queued"}',
        ),
        d.op.next_poll_at,
    )
    assert reading.unreadable is not None
    assert reading.unreadable.reason == "contradiction"


def test_results_and_errors_may_come_from_array_elements() -> None:
    body = {
        "id": 42,
        "status": "completed",
        "conclusion": "failure",
        "jobs": [{"err": "x"}, {"err": "boom"}],
    }
    assert read(body, error_pointer="/jobs/1/err")[2] == "boom"


def test_a_contract_without_rules_keeps_its_digest() -> None:
    # The digest of tests.replay.helpers.contract() on main, before the state rules existed:
    # recorded operations still name the profile in force.
    assert contract_digest(contract()) == (
        "7662995b7d8df7f89aebb620f25ee6d585ef97fa80319864667e77096d6a831c"
    )


def test_the_digest_covers_the_rules() -> None:
    a = msgspec.convert(RULES, Contract)
    changed = json.loads(json.dumps(RULES))
    changed["state_rules"][2]["category"] = "canceled"
    assert contract_digest(a) != contract_digest(msgspec.convert(changed, Contract))


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([rule("x", "failure", eq("/a", "1"), eq("/a", 1))], "can never match"),
        (
            [rule("x", "failure", eq("/a", "y"), Condition(pointer="/a", test="absent"))],
            "can never match",
        ),
        (
            [rule("x", "failure", Condition(pointer="/a", test="range", minimum=3, maximum=1))],
            "can never match",
        ),
        (
            [rule("x", "failure", eq("/a", "s")), rule("y", "pending", eq("/a", "s"), eq("/b", 1))],
            "can never be chosen",
        ),
        (
            [rule("x", "failure", eq("/a", "done")), rule("y", "success", eq("/b", "ok"))],
            "can both match",
        ),
    ],
)
def test_s3_the_analysis_refuses_unsound_rules(rules: list[StateRule], message: str) -> None:
    problems = rule_problems(rules)
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_exclusive_rules_and_a_declared_fallback_are_sound() -> None:
    assert (
        rule_problems([rule("x", "failure", eq("/a", "f")), rule("y", "success", eq("/a", "s"))])
        == []
    )
    assert (
        rule_problems(
            [rule("x", "failure", eq("/a", "f")), rule("y", "pending", eq("/b", 1), fallback=True)]
        )
        == []
    )


def test_a_documented_state_left_unclassified_is_refused() -> None:
    rules = [rule("x", "failure", eq("/a", "f")), rule("y", "success", eq("/a", "s"))]
    assert rule_problems(rules, [("/a", ["f", "s"])]) == []
    [problem] = rule_problems(rules, [("/a", ["f", "s", "timed_out"])])
    assert '"timed_out"' in problem
