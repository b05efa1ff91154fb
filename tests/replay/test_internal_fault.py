"""A bug in bide is contained to one operation (issue 20): ``InternalFault`` stops the wait
with ``internal_error`` and a finite list of options, and ``check`` explains the stop."""

from __future__ import annotations

from replay import EscalationRaised, OperationStopped, check, decide
from replay.observations import InternalFault
from replay.tables import REASON_OPTIONS

from .helpers import Daemon


def test_a_fault_stops_a_live_operation_with_options_for_a_human() -> None:
    d = Daemon.start()
    d.poll_and_respond()
    events = decide(d.op, InternalFault(detail="KeyError while polling"), d.op.next_poll_at, 0.0)
    stopped, raised = events
    assert isinstance(stopped, OperationStopped)
    assert (stopped.reason, stopped.detail) == ("internal_error", "KeyError while polling")
    assert isinstance(raised, EscalationRaised)
    assert [o.id for o in raised.options] == list(REASON_OPTIONS["internal_error"])
    assert "continue" not in [o.id for o in raised.options]
    assert check([*d.log, *events]) == []


def test_a_fault_after_the_operation_stopped_changes_nothing() -> None:
    d = Daemon.start()
    while d.op.phase == "live":
        d.poll_and_respond()
    assert decide(d.op, InternalFault(detail="x"), d.op.registered_at + 10**6, 0.0) == []
