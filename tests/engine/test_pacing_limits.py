"""Limits changed while running, and one pacing shared by several engines, with a clock the
test moves: a lowered rate spaces the next slot by its new interval, in-flight slots above a
lowered limit drain, a closed provider holds its polls and wakes them when it opens, and a
shared pacing is configured once however many engines load the profile."""

from __future__ import annotations

import anyio
import pytest

from daemon.engine.pacing import Deferred, Granted, Limits, Pacing, Queued, SharedPacing, Slots
from daemon.timers import QUOTA_GUARD, RateQuota
from tests.engine.test_pacing import Clock, defer, pacing


def test_a_lowered_rate_spaces_the_next_slot_by_its_new_interval() -> None:
    clock = Clock()
    quota = RateQuota(10, 1, clock)
    assert quota.reserve() == 0  # a slot now; the next at 0.105 s
    quota.retune(2, 1)
    assert quota.reserve() == pytest.approx((1 + QUOTA_GUARD) / 2)  # not 0.105: 0.525
    quota.retune(10, 1)  # raised: the slot given stands, the next is its new interval after
    assert quota.reserve() == pytest.approx((1 + QUOTA_GUARD) / 2 + (1 + QUOTA_GUARD) / 10)


def test_a_raised_burst_lets_more_go_at_once_a_lowered_one_fewer() -> None:
    clock = Clock()
    quota = RateQuota(10, 1, clock)
    quota.retune(10, 3)
    assert [quota.reserve() for _ in range(3)] == [0, 0, 0]
    clock.now += 10
    quota.retune(10, 1)
    assert quota.reserve() == 0
    assert quota.reserve() > 0


def test_in_flight_above_a_lowered_limit_drains_before_a_new_one_goes() -> None:
    async def main() -> None:
        slots = Slots(3)
        for _ in range(3):
            await slots.acquire()
        slots.set_limit(1)
        got: list[int] = []

        async def take(n: int) -> None:
            await slots.acquire()
            got.append(n)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, 1)
            tg.start_soon(take, 2)
            await anyio.wait_all_tasks_blocked()
            slots.release()
            slots.release()  # one still taken: at the new limit, nobody goes
            await anyio.wait_all_tasks_blocked()
            assert got == []
            slots.release()
            await anyio.wait_all_tasks_blocked()
            assert got == [1]  # first come, first served; the second waits for it
            assert slots.taken == 1
            slots.set_limit(2)  # raised: the next waiting taker goes at once
            await anyio.wait_all_tasks_blocked()
            assert got == [1, 2]
        assert slots.taken == 2

    anyio.run(main)


def test_a_closed_provider_holds_every_poll_and_wakes_them_in_turn_when_it_opens() -> None:
    pace, clock, woken = pacing(rate=10)
    defer_first = pace.admit("a1", "p", "alice")
    assert defer_first == Granted()
    defer(pace, "a2", "alice")  # holds a future slot
    pace.set_limits("p", Limits(0.0, 1, 0))
    assert not pace.is_open("p")
    assert pace.in_flight["p"].limit == 0
    assert pace.admit("a2", "p", "alice") == Queued()  # its slot, taken before, given back
    assert not pace.holds("a2")
    assert pace.admit("b1", "p", "bob") == Queued()
    assert pace.quotas["p"].rate == 10  # kept for when it opens
    pace.set_limits("p", Limits(5.0, 1, 2))
    assert pace.is_open("p")
    assert woken == ["a2"]  # the first in line; each slot used wakes the next
    clock.now += 1
    assert pace.admit("a2", "p", "alice") == Granted()
    assert woken == ["a2", "b1"]
    assert isinstance(pace.admit("b1", "p", "bob"), Deferred)


def test_waiting_for_a_closed_provider_ends_when_it_opens() -> None:
    pace, _, _ = pacing(rate=10)
    pace.set_limits("p", Limits(0.0, 1, 0))
    opened: list[bool] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                await pace.wait_open("p")
                opened.append(True)

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert opened == []
            pace.set_limits("p", Limits(1.0, 1, 1))
        assert opened == [True]

    anyio.run(main)


def test_engines_loading_the_same_profile_do_not_start_the_quota_afresh() -> None:
    clock = Clock()
    shared = SharedPacing(monotonic=clock)
    shared.configure("p", 10, 1, 4)
    assert shared.admit("a1", "p", "alice") == Granted()
    shared.configure("p", 10, 1, 4)  # the next engine loads the same profile
    assert isinstance(shared.admit("a2", "p", "alice"), Deferred)  # no fresh slot
    shared.configure("p", 5, 1, 2)  # the profile changed: in place
    assert shared.in_flight["p"].limit == 2
    assert shared.quotas["p"].rate == 5


def test_a_shared_pacing_asks_and_wakes_the_engine_whose_operation_it_is() -> None:
    clock = Clock()
    shared = SharedPacing(monotonic=clock)
    shared.configure("p", 4, 1, 4)
    mine = {"one": {"a1", "a2", "a3"}, "two": {"b1"}}
    woken: dict[str, list[str]] = {"one": [], "two": []}
    members = {
        name: shared.attach(ops.__contains__, woken[name].append, lambda: {"p": 1})
        for name, ops in mine.items()
    }
    assert shared.live() == {"p": 2}
    shared.admit("a1", "p", "alice")
    for op in ("a2", "a3"):
        defer(shared, op, "alice")
    defer(shared, "b1", "bob")  # with bob in, alice's share is 2 of the next 4
    assert shared.admit("a4", "p", "alice") == Queued()
    mine["one"].add("a4")
    assert shared.admit("a2", "p", "alice") == Granted()  # a slot used: the next in line
    assert woken["one"] == ["a4"]
    defer(shared, "a4", "alice")  # woken, it takes a future slot: alice holds 2 again
    assert shared.admit("a5", "p", "alice") == Queued()
    shared.detach(members["one"])  # engine one stops: a3's and a4's held slots go back
    assert not shared.holds("a3")
    assert not shared.holds("a4")
    assert not shared.queued("a5")  # and its polls leave the queues
    assert shared.live() == {"p": 1}
    # The shard comes back under a new engine: its poll asks afresh (not stuck as queued).
    shared.attach(mine["one"].__contains__, woken["one"].append, lambda: {"p": 1})
    mine["one"].add("a5")
    assert isinstance(shared.admit("a5", "p", "alice"), Deferred)


def test_a_sliced_pacing_is_closed_until_its_slice_and_after_it_expires() -> None:
    clock = Clock()
    shared = SharedPacing(sliced=True, monotonic=clock)
    shared.configure("p", 10, 4, 8)
    assert not shared.is_open("p")
    shared.set_slice("p", Limits(20.0, 2, 3), clock.now + 5)  # never above the profile
    assert shared.effective["p"] == Limits(10, 2, 3)
    assert shared.is_open("p")
    clock.now += 5
    assert not shared.is_open("p")
    assert shared.in_flight["p"].limit == 0
    assert shared.admit("x", "p", "alice") == Queued()


def test_an_unshared_pacing_configured_again_starts_afresh_as_before() -> None:
    pace = Pacing(monotonic=Clock())
    pace.configure("p", 10, 1, 4)
    first = pace.in_flight["p"]
    pace.configure("p", 10, 1, 4)
    assert pace.in_flight["p"] is not first
