"""Pacing on its own: a provider's quota shared fairly between registrants, with a clock the
test moves, so fairness, giving slots back and bursts are checked in milliseconds, without
root and without a daemon (before, only end to end: tests/e2e/test_fairness.py)."""

from __future__ import annotations

import pytest

from daemon.engine.pacing import FAIR_HORIZON, Deferred, Granted, Pacing, Queued
from daemon.timers import QUOTA_GUARD


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pacing(
    rate: float, burst: int = 1, ended: set[str] | None = None
) -> tuple[Pacing, Clock, list[str]]:
    """A pacing of one provider ``p``; returns it, its clock, and the polls it woke."""
    clock, woken = Clock(), list[str]()
    gone = ended if ended is not None else set()
    pace = Pacing(monotonic=clock, is_live=lambda op: op not in gone, wake=woken.append)
    pace.configure("p", rate, burst)
    return pace, clock, woken


def defer(pace: Pacing, op: str, who: str) -> float:
    """A poll asks, is deferred, and holds its future slot (as the poller does once the
    ``local_quota`` delay is recorded); the seconds until its slot."""
    admission = pace.admit(op, "p", who)
    assert isinstance(admission, Deferred), (op, admission)
    pace.hold(op, "p", who)
    return admission.wait


def test_the_first_request_goes_now_and_the_next_one_waits_an_interval() -> None:
    pace, _, _ = pacing(rate=10)
    assert pace.admit("a1", "p", "alice") == Granted()
    wait = defer(pace, "a2", "alice")
    assert wait == pytest.approx((1 + QUOTA_GUARD) / 10)
    assert pace.holds("a2")


def test_a_held_slot_is_used_when_its_poll_comes_back() -> None:
    pace, _, _ = pacing(rate=10)
    pace.admit("a1", "p", "alice")
    defer(pace, "a2", "alice")
    assert pace.admit("a2", "p", "alice") == Granted()  # no second reservation
    assert not pace.holds("a2")


def test_one_registrant_cannot_hold_more_than_its_share() -> None:
    pace, _, _ = pacing(rate=4)
    pace.admit("a0", "p", "alice")
    share = pace.share("p", "alice")
    assert share == 4 * FAIR_HORIZON
    for n in range(1, share + 1):
        defer(pace, f"a{n}", "alice")
    assert pace.admit("a99", "p", "alice") == Queued()
    assert pace.queued("a99")


def test_a_newcomer_gets_a_slot_ahead_of_the_heavy_registrants_queue() -> None:
    """200 operations of one agent do not take every slot ahead of another's few: alice
    holds her share and queues the rest; bob still gets a future slot at once."""
    pace, _, _ = pacing(rate=4)
    pace.admit("a0", "p", "alice")
    for n in range(1, 5):
        defer(pace, f"a{n}", "alice")
    for n in range(5, 200):
        assert pace.admit(f"a{n}", "p", "alice") == Queued()
    assert pace.share("p", "bob") == 2  # the next second, split between the two
    defer(pace, "b1", "bob")
    defer(pace, "b2", "bob")
    assert pace.admit("b3", "p", "bob") == Queued()


def test_each_slot_used_wakes_the_next_queued_poll_registrant_by_registrant() -> None:
    pace, _, woken = pacing(rate=2)
    pace.admit("a0", "p", "alice")
    defer(pace, "a1", "alice")
    defer(pace, "b1", "bob")  # the share is 1 each now that both hold slots
    for op, who in (("a2", "alice"), ("a3", "alice"), ("b2", "bob"), ("b3", "bob")):
        assert pace.admit(op, "p", who) == Queued()
    for used in ("a1", "b1"):  # each held slot used wakes one queued poll
        assert pace.admit(used, "p", "alice" if used[0] == "a" else "bob") == Granted()
    assert woken == ["a2", "b2"]
    # A woken poll is let through to the quota even past its registrant's share.
    assert isinstance(pace.admit("a2", "p", "alice"), Deferred)
    assert woken == ["a2", "b2"]


def test_giving_a_held_slot_back_returns_it_to_the_quota_and_wakes_the_next() -> None:
    pace, _, woken = pacing(rate=1)
    pace.admit("a0", "p", "alice")
    defer(pace, "a1", "alice")
    assert pace.admit("a2", "p", "alice") == Queued()
    before = pace.quotas["p"]._tat
    assert pace.give_back("a1", "p") is True  # a1 ended before its slot came
    assert pace.quotas["p"]._tat == pytest.approx(before - pace.quotas["p"].interval)
    assert not pace.holds("a1")
    assert woken == ["a2"]
    # The next poll gets the slot a1 gave back: the one right after a0's, not a later one.
    assert defer(pace, "a2", "alice") == pytest.approx(pace.quotas["p"].interval)


def test_giving_back_without_a_held_slot_changes_nothing() -> None:
    pace, _, woken = pacing(rate=1)
    pace.admit("a0", "p", "alice")
    before = pace.quotas["p"]._tat
    assert pace.give_back("a0", "p") is False  # a0 used its slot: nothing to give back
    assert pace.give_back("never", "p") is False
    assert pace.quotas["p"]._tat == before
    assert woken == []


def test_a_deferral_never_held_is_released() -> None:
    """The operation ended while its delay was recorded: the reserved slot goes back and
    nothing is counted against its registrant."""
    pace, _, _ = pacing(rate=1)
    pace.admit("a0", "p", "alice")
    admission = pace.admit("a1", "p", "alice")
    assert isinstance(admission, Deferred)
    pace.release("p")
    assert not pace.holds("a1")
    assert pace.share("p", "alice") == 1
    assert isinstance(pace.admit("a2", "p", "alice"), Deferred)  # not queued: holds none


def test_ended_polls_in_the_queue_are_skipped() -> None:
    ended: set[str] = set()
    pace, _, woken = pacing(rate=1, ended=ended)
    pace.admit("a0", "p", "alice")
    defer(pace, "a1", "alice")
    assert pace.admit("a2", "p", "alice") == Queued()
    assert pace.admit("a3", "p", "alice") == Queued()
    ended.add("a2")
    pace.give_back("a1", "p")
    assert woken == ["a3"]
    assert not pace.queued("a2")


def test_a_burst_goes_at_once_after_a_quiet_spell_then_the_rate_holds() -> None:
    pace, clock, _ = pacing(rate=1, burst=3)
    assert [pace.admit(f"a{n}", "p", f"r{n}") for n in range(3)] == [Granted()] * 3
    assert isinstance(pace.admit("a3", "p", "r3"), Deferred)
    pace.release("p")
    clock.now += 1 + QUOTA_GUARD  # one interval later: one more slot, not a new burst
    assert pace.admit("a4", "p", "r4") == Granted()
    assert isinstance(pace.admit("a5", "p", "r5"), Deferred)


def test_submits_and_fetches_take_slots_of_the_same_quota() -> None:
    pace, _clock, _ = pacing(rate=2)
    assert pace.quota_wait("p") == 0.0
    assert pace.quota_wait("p") == pytest.approx((1 + QUOTA_GUARD) / 2)
    assert isinstance(pace.admit("a1", "p", "alice"), Deferred)  # a poll comes after them
    assert pace.spacing_wait("p") == 0.0
    assert pace.spacing_wait("p") == pytest.approx((1 + QUOTA_GUARD) / 2)
    assert pace.quota_wait("unknown") == 0.0
    assert pace.spacing_wait("unknown") == 0.0
