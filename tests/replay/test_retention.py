"""Retention: ended operations leave the ledger and its snapshot, a tombstone answers for
them, and what the ledger holds does not grow with operations that ended long ago."""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import check, story
from replay.decide import register
from replay.events import (
    ActionIntended,
    LogEvent,
    OperationRegistered,
    OperationRetired,
    OperationSucceeded,
    OperationWithdrawn,
)
from replay.ledger import Ledger
from replay.retention import RetentionPolicy, Tombstones, due
from replay.state import Operation, evolve
from tests.replay.helpers import T0, Daemon, body, contract, registration

DAY = 86400.0
POLICY = RetentionPolicy(ended_after=7 * DAY, max_ended=50, max_tombstones=1000, batch=1000)


def _registered(op_id: str, at: float, *, digest: str = "", uid: int | None = 1000) -> LogEvent:
    reg = register(registration(operation_id=op_id, provider_job_id=f"job-{op_id}"), _C, at)
    event = reg[0]
    assert isinstance(event, OperationRegistered)
    return msgspec.structs.replace(event, request_digest=digest, registered_by_uid=uid)


_C = contract()


def _ended(op_id: str, at: float, *, closed: bool = False) -> LogEvent:
    if closed:
        return OperationWithdrawn(operation_id=op_id, at=at, by="alice", by_uid=1000)
    return OperationSucceeded(
        operation_id=op_id, at=at, request_number=1, state="succeeded", results={"url": "u"}
    )


def _churn(ledger: Ledger, first: int, count: int, at: float, policy: RetentionPolicy) -> None:
    """``count`` operations registered and ended one second apart, retirement due after each
    (as the daemon records it: decided by ``due``, then folded)."""
    for n in range(first, first + count):
        now = at + (n - first)
        ledger.apply(_registered(f"op-{n}", now, digest=f"d{n}"))
        ledger.apply(_ended(f"op-{n}", now + 0.5, closed=n % 7 == 0))
        for ev in due(ledger.ended, ledger.ops, ledger.actions, now + 0.5, policy):
            ledger.apply(ev)


def _same(a: Ledger, b: Ledger) -> None:
    assert a.ops == b.ops
    assert a.actions == b.actions
    assert a.undecided == b.undecided
    assert a.events == b.events
    assert a.ended == b.ended
    assert a.tombstones == b.tombstones


# -- the rule -------------------------------------------------------------------------------


def test_ended_operations_past_the_age_retire_oldest_first_and_live_ones_never() -> None:
    ledger = Ledger()
    for n, op_id in enumerate(["a", "b", "live", "esc"]):
        ledger.apply(_registered(op_id, T0 + n))
    ledger.apply(_ended("b", T0 + 10))
    ledger.apply(_ended("a", T0 + 20, closed=True))
    esc = Daemon.start(operation_id="esc", now=T0 + 3)
    ledger.ops["esc"] = msgspec.structs.replace(esc.op, phase="escalated")
    assert list(ledger.ended) == ["b", "a"]  # in the order they ended
    assert due(ledger.ended, ledger.ops, ledger.actions, T0 + 7 * DAY, POLICY) == []
    retire = due(ledger.ended, ledger.ops, ledger.actions, T0 + 10 + 7 * DAY, POLICY)
    assert [(e.operation_id, e.why, e.ended_at) for e in retire] == [("b", "age", T0 + 10)]
    later = due(ledger.ended, ledger.ops, ledger.actions, T0 + 400 * DAY, POLICY)
    assert [e.operation_id for e in later] == ["b", "a"]


def test_beyond_the_count_the_oldest_ended_retire_whatever_their_age() -> None:
    ledger = Ledger()
    for n in range(5):
        ledger.apply(_registered(f"op-{n}", T0 + n))
        ledger.apply(_ended(f"op-{n}", T0 + n))
    policy = RetentionPolicy(ended_after=7 * DAY, max_ended=2, max_tombstones=10, batch=2)
    retire = due(ledger.ended, ledger.ops, ledger.actions, T0 + 10, policy)
    assert [(e.operation_id, e.why) for e in retire] == [("op-0", "count"), ("op-1", "count")]
    for ev in retire:
        ledger.apply(ev)
    assert [e.operation_id for e in due(ledger.ended, ledger.ops, ledger.actions, T0, policy)] == [
        "op-2"
    ]


def test_an_operation_with_an_action_still_running_waits() -> None:
    ledger = Ledger()
    ledger.apply(_registered("op", T0))
    ledger.apply(_ended("op", T0 + 1))
    ledger.apply(
        ActionIntended(
            operation_id="op",
            at=T0 + 2,
            action_id="op.fetch.1",
            kind="fetch",
            provider="acme",
            method="GET",
            url="https://r.example/1",
            timeout_seconds=5,
            max_bytes=10,
        )
    )
    assert due(ledger.ended, ledger.ops, ledger.actions, T0 + 30 * DAY, POLICY) == []


# -- folding a retirement ---------------------------------------------------------------------


def test_a_retired_operation_leaves_the_ledger_and_its_tombstone_answers_retries() -> None:
    ledger = Ledger()
    ledger.apply(_registered("op", T0, digest="digest-1", uid=1001))
    ledger.apply(_ended("op", T0 + 5))
    (retired,) = due(ledger.ended, ledger.ops, ledger.actions, T0 + 8 * DAY, POLICY)
    assert ledger.apply(retired) is None
    assert "op" not in ledger.ops
    assert "op" not in ledger.ended
    stone = ledger.tombstones.get("op")
    assert stone is not None
    assert (stone.owner_uid, stone.outcome) == (1001, "succeeded")
    assert stone.same_request("digest-1", "", "")
    assert not stone.same_request("digest-2", "", "")
    assert stone.same_request("", "acme", "job-op")  # the spool's retry: by provider and job
    assert not stone.same_request("", "acme", "job-other")
    assert ledger.tombstones.get("other") is None


def test_retiring_an_operation_that_has_not_ended_is_refused() -> None:
    ledger = Ledger()
    ledger.apply(_registered("op", T0))
    from replay.errors import ReplayOrderError

    retire = OperationRetired(operation_id="op", at=T0, ended_at=T0, why="age", tombstones_kept=10)
    with pytest.raises(ReplayOrderError, match="live"):
        ledger.apply(retire)
    assert "op" in ledger.ops


def test_the_story_tells_the_retirement_and_check_accepts_it() -> None:
    ok = Daemon.start(operation_id="op-ok")
    ok.poll_and_respond(content=body("succeeded", result={"url": "https://r.example/1"}))
    retired = OperationRetired(
        operation_id="op-ok", at=T0 + 9 * DAY, ended_at=T0 + 60, why="age", tombstones_kept=10
    )
    events = [*ok.log, retired]
    assert "retired from the daemon's memory" in story(events)
    assert check(events) == []
    early = OperationRetired(
        operation_id="op-ok", at=T0 + 1, ended_at=T0, why="count", tombstones_kept=10
    )
    assert check([ok.log[0], early])  # retiring a live operation is reported


# -- snapshots --------------------------------------------------------------------------------


def _retiring_log() -> list[LogEvent]:
    ledger, log = Ledger(), []
    policy = RetentionPolicy(ended_after=DAY, max_ended=4, max_tombstones=6, batch=10)
    at = T0
    for n in range(14):
        log.append(_registered(f"op-{n}", at, digest=f"d{n}"))
        log.append(_ended(f"op-{n}", at + 1, closed=n % 3 == 0))
        for ev in log[-2:]:
            ledger.apply(ev)
        retire = due(ledger.ended, ledger.ops, ledger.actions, at + 1, policy)
        for ev in retire:
            ledger.apply(ev)
        log += retire
        at += 3600.0
    return log


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=len(_retiring_log())))
def test_a_snapshot_at_any_point_then_the_tail_equals_the_full_fold(cut: int) -> None:
    events = _retiring_log()
    head = Ledger()
    for ev in events[:cut]:
        head.apply(ev)
    resumed = Ledger.load(head.dump())
    for ev in events[cut:]:
        resumed.apply(ev)
    full = Ledger()
    for ev in events:
        full.apply(ev)
    _same(resumed, full)
    assert 3 <= len(full.tombstones) <= 6  # the oldest beyond max_tombstones forgotten
    assert full.tombstones.get("op-0") is None
    assert full.tombstones.get("op-9") is not None


def test_a_copy_keeps_its_tombstones_while_the_ledger_goes_on() -> None:
    events = _retiring_log()
    ledger = Ledger()
    for ev in events[:20]:
        ledger.apply(ev)
    copy = ledger.copy()
    for ev in events[20:]:
        ledger.apply(ev)
    again = Ledger()
    for ev in events[:20]:
        again.apply(ev)
    _same(copy, again)


# -- the tombstone table ----------------------------------------------------------------------


def _op(op_id: str, uid: int | None) -> Operation:
    return evolve(None, _registered(op_id, T0, digest=f"d-{op_id}", uid=uid))  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.lists(st.integers(0, 300), max_size=400))
def test_the_table_keeps_the_most_recent_within_the_bound(keep: int, adds: list[int]) -> None:
    """Whatever the order: never more than the bound, always the most recent half of it,
    and each kept tombstone reads back as written."""
    table = Tombstones()
    recent: list[str] = []  # distinct ids, the latest retirement last
    for n in adds:
        op_id = f"op-{n}"
        table.add(_op(op_id, n if n % 5 else None), keep)
        if op_id in recent:
            recent.remove(op_id)
        recent.append(op_id)
        assert len(table) <= keep
        for kept in recent[-((keep + 1) // 2) :]:
            assert table.get(kept) is not None, (kept, keep)
    for n in range(301):
        stone = table.get(f"op-{n}")
        if stone is not None:
            assert stone.owner_uid == (n if n % 5 else None)
            assert stone.same_request(f"d-op-{n}", "", "")
            assert stone.same_request("", "acme", f"job-op-{n}")
    assert Tombstones.load(table.dump()) == table
    assert table.copy() == table


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 120)), max_size=300))
def test_a_lowered_bound_holds_at_once(adds: list[tuple[int, int]]) -> None:
    table = Tombstones()
    for n, keep in adds:
        table.add(_op(f"op-{n}", 1), keep)
        assert len(table) <= keep


def test_a_retired_id_is_told_apart_from_another() -> None:
    table = Tombstones()
    for n in range(5000):
        table.add(_op(f"op-{n}", 1000 + n % 7), 1_000_000)
    assert len(table) == 5000
    assert all(table.get(f"op-{n}") is not None for n in range(5000))
    assert not any(table.get(f"other-{n}") is not None for n in range(5000))


# -- memory does not grow with ended operations ----------------------------------------------


def test_memory_does_not_grow_with_operations_that_ended_long_ago() -> None:
    """A fixed number live, thousands ended and retired: what the ledger holds (traced
    allocations, and the snapshot's size) after 6,000 ended operations stays within a small
    margin of what it holds after 1,000; without retirement it would grow ~six-fold."""
    policy = RetentionPolicy(ended_after=DAY, max_ended=200, max_tombstones=100_000, batch=500)
    ledger = Ledger()
    for n in range(50):  # live throughout
        ledger.apply(_registered(f"live-{n}", T0))
    tracemalloc.start()
    try:
        _churn(ledger, 0, 1000, T0, policy)
        small, _ = tracemalloc.get_traced_memory()
        small_snapshot = len(ledger.dump())
        _churn(ledger, 1000, 5000, T0 + 1000, policy)
        large, _ = tracemalloc.get_traced_memory()
        large_snapshot = len(ledger.dump())
    finally:
        tracemalloc.stop()
    assert len(ledger.ops) == 250
    assert len(ledger.tombstones) == 5800
    per_retired = (large - small) / 5000
    assert per_retired < 120, f"{per_retired:.0f} bytes kept per retired operation"
    assert (large_snapshot - small_snapshot) / 5000 < 40, (small_snapshot, large_snapshot)


def test_an_action_started_after_the_decision_outlives_the_retirement() -> None:
    """A fetch recorded between the retirement's decision and its record: the retirement
    folds, the fetch stays, and its outcome still folds (no crash of the fold)."""
    ledger = Ledger()
    ledger.apply(_registered("op", T0))
    ledger.apply(_ended("op", T0 + 1))
    (retire,) = due(ledger.ended, ledger.ops, ledger.actions, T0 + 30 * DAY, POLICY)
    ledger.apply(
        ActionIntended(
            operation_id="op",
            at=T0 + 30 * DAY,
            action_id="op.fetch.1",
            kind="fetch",
            provider="acme",
            method="GET",
            url="https://r.example/1",
            timeout_seconds=5,
            max_bytes=10,
        )
    )
    ledger.apply(retire)
    assert "op" not in ledger.ops
    assert ledger.actions["op.fetch.1"].phase == "in_flight"
