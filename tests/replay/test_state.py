"""State by replay: evolve/fold, illegal moves, multi-operation logs (h11 style)."""

from __future__ import annotations

import msgspec
import pytest

from replay import (
    OperationRegistered,
    PollScheduled,
    RegistrationRejected,
    ReplayOrderError,
    evolve,
    fold,
    register,
)

from .helpers import T0, Daemon, body, contract, registration


def test_fold_equals_incremental_state() -> None:
    d = Daemon.start()
    d.poll_and_respond(content=body("queued"))
    d.poll_and_respond(status=503)
    d.poll_and_respond(content=body("succeeded", result={"url": "https://x.example/r"}))
    assert fold(d.log) == {d.op.operation_id: d.op}
    assert d.op.phase == "succeeded"


def test_fold_interleaved_operations_and_skips_rejected_registrations() -> None:
    a = Daemon.start(operation_id="a")
    b = Daemon.start(operation_id="b", provider_job_id="exp_b")
    a.poll_and_respond()
    b.poll_and_respond(status=401)
    request = msgspec.structs.replace(registration(operation_id="c"), provider_job_id="")
    rejected = register(request, contract(), T0)
    assert isinstance(rejected[0], RegistrationRejected)
    log = [a.log[0], b.log[0], *rejected]
    log += [e for pair in zip(a.log[1:], b.log[1:], strict=False) for e in pair]
    log += a.log[len(b.log) :] + b.log[len(a.log) :]
    assert fold(log) == {"a": a.op, "b": b.op}


def test_illegal_moves_raise_and_name_no_secret() -> None:
    d = Daemon.start()
    registered = d.log[0]
    assert isinstance(registered, OperationRegistered)
    with pytest.raises(ReplayOrderError, match="registered twice"):
        evolve(d.op, registered)
    later = PollScheduled(
        operation_id=d.op.operation_id,
        at=T0,
        next_poll_at=T0,
        delay_source="local_backoff",
        raw_delay=0,
        delay=0,
    )
    with pytest.raises(ReplayOrderError, match="precedes its registration"):
        evolve(None, later)
    with pytest.raises(ReplayOrderError, match="applied to operation"):
        evolve(d.op, msgspec.structs.replace(later, operation_id="other"))


def test_rejections_change_nothing() -> None:
    d = Daemon.start()
    d.poll_and_respond(content=body("running", poll_after_seconds="x"))
    before = d.op
    d.decision(T0 + 100, "extend")  # nothing is escalated: rejected
    assert d.op == before


def test_s5_record_survives_restart_by_replay() -> None:
    d = Daemon.start(idempotency_key="idem-9", expected_terminal_state="succeeded")
    d.poll_and_respond()
    restarted = fold(d.log)[d.op.operation_id]
    assert (restarted.provider_job_id, restarted.account_context) == ("exp_71c", "acme/reports")
    assert (restarted.request_fingerprint, restarted.expected_terminal_state) == (
        "sha256:abc",
        "succeeded",
    )
    assert restarted.idempotency_key == "idem-9"
    assert restarted.contract_digest == d.op.contract_digest


def test_s11_restart_with_intent_in_flight() -> None:
    d = Daemon.start()
    d.poll(T0 + 5)
    restarted = fold(d.log)[d.op.operation_id]
    assert restarted.in_flight == 1
    assert restarted.status_requests_used == 1
    d.outcome_unknown(T0 + 50)
    assert d.op.in_flight is None
    assert d.op.status_requests_used == 1
