"""S9, S32 step 4 with a wall clock set back (issue 14): the wait between two polls is an
interval, the deadline a wall-clock fact. ``WakeUp.timer_elapsed`` is the daemon's monotonic
timer saying the wait has run out; the intent records it, and ``check`` re-derives it."""

from __future__ import annotations

import msgspec
import pytest

from replay import OperationStopped, StatusRequestIntended, WakeUp, check, decide
from replay.events import Event
from replay.state import Operation

from .helpers import HOUR, T0, Daemon


def _op(**changes: object) -> Operation:
    return msgspec.structs.replace(Daemon.start().op, **changes)


@pytest.mark.parametrize(
    ("timer_elapsed", "offset", "expect"),
    [
        pytest.param(False, 99.0, [], id="S32-not-due-by-either-clock"),
        pytest.param(True, 99.0 - HOUR, [True], id="S9-wall-set-back-timer-elapsed-due"),
        pytest.param(False, 100.0, [False], id="S32-due-by-the-wall-clock"),
        pytest.param(True, 100.0, [False], id="due-by-both-recorded-as-wall"),
    ],
)
def test_a_wait_the_timer_says_has_elapsed_is_due(
    timer_elapsed: bool, offset: float, expect: list[bool]
) -> None:
    op = _op(next_poll_at=T0 + 100)
    events = decide(op, WakeUp(timer_elapsed=timer_elapsed), T0 + offset, 0.0)
    assert [e.due_by_timer for e in events if isinstance(e, StatusRequestIntended)] == expect
    assert all(isinstance(e, StatusRequestIntended) for e in events)


def test_the_deadline_still_stops_first_whatever_the_timer_says() -> None:
    op = _op(next_poll_at=T0 + 100)
    [stopped, _] = decide(op, WakeUp(timer_elapsed=True), op.deadline_at, 0.0)
    assert isinstance(stopped, OperationStopped)
    assert stopped.reason == "deadline_exceeded"


def test_check_rederives_an_intent_made_due_by_the_timer() -> None:
    daemon = Daemon.start()
    early = daemon.op.next_poll_at - HOUR  # the wall clock was set back an hour
    intent = decide(daemon.op, WakeUp(timer_elapsed=True), early, 0.0)
    assert [type(e) for e in intent] == [StatusRequestIntended]
    assert isinstance(intent[0], StatusRequestIntended)
    assert intent[0].due_by_timer
    log: list[Event] = [*daemon.log, *intent]
    assert check(log) == []
    # An early intent that does not carry the timer's word is not explained: check flags it.
    forged: list[Event] = [*daemon.log, msgspec.structs.replace(intent[0], due_by_timer=False)]
    assert check(forged)
