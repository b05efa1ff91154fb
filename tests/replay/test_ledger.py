"""The ledger and its snapshot: loading a snapshot and folding the rest equals folding it all."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.contract import Contract
from replay.errors import NewerSchemaError, ReplayError
from replay.events import ActionIntended, LogEvent, StatusResponseReceived, encode_event
from replay.ledger import Ledger, SnapshotFormatError
from tests.replay.helpers import T0, Daemon, body, contract, simple_contract


def _history() -> list[LogEvent]:
    """Several operations, two contracts, an escalation answered, a fact left undecided (a
    crash between the fact and its decision), and an action."""
    log: list[LogEvent] = []
    ok = Daemon.start(operation_id="op-ok")
    ok.poll_and_respond(content=body("running"))
    ok.poll_and_respond(content=body("succeeded", result={"url": "https://r.example/1"}))
    log += ok.log
    stuck = Daemon.start(
        simple_contract(default_max_status_requests=1),
        operation_id="op-budget",
        provider_job_id="j2",
    )
    stuck.poll_and_respond(content=b'{"state": "running"}')
    stuck.decision(stuck.op.next_poll_at + 5, "extend")
    log += stuck.log
    crashed = Daemon.start(
        contract(provider="other"), operation_id="op-crash", provider_job_id="j3", provider="other"
    )
    crashed.poll(crashed.op.next_poll_at)
    log += crashed.log
    log.append(
        StatusResponseReceived(
            operation_id="op-crash",
            at=T0 + 60,
            request_number=1,
            status_code=200,
            body=body("running"),
        )
    )
    log.append(
        ActionIntended(
            operation_id="op-ok",
            at=T0 + 70,
            action_id="op-ok.fetch.1",
            kind="fetch",
            provider="acme",
            method="GET",
            url="https://r.example/1",
            timeout_seconds=5,
            max_bytes=10,
        )
    )
    return log


def _fold(events: list[LogEvent], ledger: Ledger | None = None) -> Ledger:
    ledger = ledger or Ledger()
    for ev in events:
        ledger.apply(ev)
    return ledger


def _same(a: Ledger, b: Ledger) -> None:
    assert a.ops == b.ops
    assert a.actions == b.actions
    assert a.undecided == b.undecided
    assert a.events == b.events
    assert a.contracts == b.contracts


def test_round_trip_keeps_everything() -> None:
    full = _fold(_history())
    assert set(full.undecided) == {"op-crash"}
    assert {op.operation_id: op.phase for op in full.ops.values()} == {
        "op-ok": "succeeded",
        "op-budget": "live",
        "op-crash": "live",
    }
    assert full.ops["op-budget"].decisions_recorded == 1
    assert len(full.contracts) == 3
    loaded = Ledger.load(full.dump())
    _same(loaded, full)
    # Operations under one digest share one contract object after loading, as before.
    by_digest: dict[str, Contract] = {}
    for op in loaded.ops.values():
        assert by_digest.setdefault(op.contract_digest, op.contract) is op.contract


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=len(_history())))
def test_snapshot_at_any_point_then_the_tail_equals_the_full_fold(cut: int) -> None:
    events = _history()
    resumed = _fold(events[cut:], Ledger.load(_fold(events[:cut]).dump()))
    _same(resumed, _fold(events))


def test_a_copy_does_not_follow_later_events() -> None:
    events = _history()
    ledger = _fold(events[:5])
    copy = ledger.copy()
    _fold(events[5:], ledger)
    _same(copy, _fold(events[:5]))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 10,
        msgspec.msgpack.encode([2, 0, {}, [], [], []]),
        msgspec.msgpack.encode({"format": 1}),
    ],
)
def test_bytes_that_are_not_a_snapshot_are_refused(data: bytes) -> None:
    with pytest.raises(SnapshotFormatError):
        Ledger.load(data)


def test_an_operation_naming_a_missing_contract_is_refused() -> None:
    full = _fold(_history())
    raw = msgspec.msgpack.decode(full.dump())
    raw[3] = {}  # drop the contracts
    with pytest.raises(SnapshotFormatError, match="contract"):
        Ledger.load(msgspec.msgpack.encode(raw))


def test_a_snapshot_made_by_another_model_version_is_refused() -> None:
    data = _fold(_history()).dump("model-a")
    assert Ledger.load(data, "model-a").events == len(_history())
    with pytest.raises(SnapshotFormatError, match="another version of the model"):
        Ledger.load(data, "model-b")


def test_a_bad_undecided_fact_is_a_format_error_not_a_crash() -> None:
    raw = msgspec.msgpack.decode(_fold(_history()).dump())
    raw[6] = [b"not an event"]
    with pytest.raises(SnapshotFormatError):
        Ledger.load(msgspec.msgpack.encode(raw))


def test_fold_leaves_out_what_it_cannot_read_and_names_it() -> None:
    events = _history()
    encoded = [(seq, encode_event(ev)) for seq, ev in enumerate(events, start=1)]
    registration = encoded[0]
    assert b"operation_registered" in registration[1]
    damaged = [(seq, b"\x00 not an event" if seq == registration[0] else p) for seq, p in encoded]
    skipped: list[tuple[int, str]] = []
    ledger = Ledger()
    ledger.fold(damaged, skipped)
    op_ok = [
        seq
        for seq, ev in enumerate(events, start=1)
        if ev.operation_id == "op-ok" and not isinstance(ev, ActionIntended)
    ]
    # The registration is unreadable; the rest of its operation cannot follow: all named.
    assert [seq for seq, _ in skipped] == op_ok
    assert "op-ok" not in ledger.ops
    others = [ev for ev in events if ev.operation_id != "op-ok" or isinstance(ev, ActionIntended)]
    # The fold records where each registration landed; apply alone does not know.
    ledger.ops = {
        k: msgspec.structs.replace(op, registered_seq=None) for k, op in ledger.ops.items()
    }
    _same(ledger, _fold(others))
    with pytest.raises(ReplayError):
        Ledger().fold(damaged)  # without a list to report into, it raises as before


def test_fold_never_skips_an_event_of_a_newer_bide() -> None:
    newer = encode_event(_history()[0]).replace(b'"schema":1', b'"schema":99')
    assert newer != encode_event(_history()[0])
    with pytest.raises(NewerSchemaError):
        Ledger().fold([(1, newer)], [])
