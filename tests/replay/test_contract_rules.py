"""Rules of replay/CONTRACT.md that no other test named: S19, S31, S35, S37."""

from __future__ import annotations

import msgspec
import pytest

from daemon.profile import SAFE_METHODS, StatusCall
from replay import EscalationRaised
from replay.events import (
    DecisionRecorded,
    OperationStopped,
    PollScheduled,
    ResponseClassified,
    StatusRequestIntended,
    StatusResponseReceived,
)
from tests.replay.helpers import Daemon, body, tags

URL = "https://api.example/jobs/{job_id}"


@pytest.mark.parametrize(
    ("method", "accepted"),
    [
        pytest.param("GET", True, id="S19-get"),
        pytest.param("HEAD", True, id="S19-head"),
        pytest.param("POST", False, id="S19-post"),
        pytest.param("PUT", False, id="S19-put"),
        pytest.param("DELETE", False, id="S19-delete"),
    ],
)
def test_s19_status_call_uses_safe_methods_only(method: str, accepted: bool) -> None:
    assert SAFE_METHODS == ("GET", "HEAD")
    raw = {"url": URL, "method": method}
    if accepted:
        assert msgspec.convert(raw, StatusCall).method == method
    else:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(raw, StatusCall)


def test_s31_every_step_of_a_poll_is_its_own_event() -> None:
    d = Daemon.start()
    before = len(d.log)
    d.poll_and_respond(content=body("running"))
    step = d.log[before:]
    assert [type(e) for e in step] == [
        StatusRequestIntended,
        StatusResponseReceived,
        ResponseClassified,
        PollScheduled,
    ]


def test_s35_routine_polls_inside_deadline_and_budget_need_no_decision() -> None:
    d = Daemon.start()
    for _ in range(d.op.max_status_requests - 1):
        d.poll_and_respond(content=body("running"))
        assert d.op.phase == "live"
    d.poll_and_respond(content=body("succeeded", result={"url": "https://cdn.example/r.csv"}))
    assert d.op.phase == "succeeded"
    assert not any(isinstance(e, (DecisionRecorded, EscalationRaised)) for e in d.log)
    assert d.op.status_requests_used == d.op.max_status_requests


def test_s37_escalation_states_state_elapsed_calls_and_extension_numbers() -> None:
    d = Daemon.start()
    for _ in range(d.op.max_status_requests):
        d.poll_and_respond(content=body("running"))
    stopped = [e for e in d.log if isinstance(e, OperationStopped)]
    assert [s.reason for s in stopped] == ["request_budget_exhausted"]
    raised = d.log[-1]
    assert isinstance(raised, EscalationRaised), tags(d.log[-3:])
    ctx = raised.context
    assert ctx.last_state == "running"
    assert ctx.elapsed_seconds == raised.at - ctx.started_at > 0
    assert (ctx.status_requests_used, ctx.max_status_requests) == (12, 12)
    extend = [o for o in raised.options if o.id == "extend"]
    assert len(extend) == 1
    assert extend[0].params["add_seconds"] == 900
    assert extend[0].params["add_status_requests"] == 4
    assert "(+15 min," in extend[0].label
    assert "checks 12 -> 16 (+4)" in extend[0].label
    labels = " ".join(o.label.lower() for o in raised.options)
    assert "continue" not in labels
