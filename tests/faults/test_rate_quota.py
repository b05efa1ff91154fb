"""GCRA in isolation (issue 14): whatever the order and timing of reservations, the granted
send times never put more than ``ceil(rate * L)`` (plus ``burst - 1``) into a window of L."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from daemon.timers import RateQuota


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def granted(rate: float, burst: int, gaps: list[float]) -> list[float]:
    clock = Clock()
    quota = RateQuota(rate, burst, monotonic=clock)
    times = []
    for gap in gaps:
        clock.now += gap
        times.append(clock.now + quota.reserve())
    return sorted(times)


def most_in(times: list[float], length: float) -> int:
    return max((sum(1 for u in times if t <= u < t + length) for t in times), default=0)


@given(
    rate=st.sampled_from([0.5, 1.0, 3.0, 8.0, 50.0]),
    burst=st.integers(1, 10),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60),
)
def test_no_window_holds_more_than_the_quota(rate: float, burst: int, gaps: list[float]) -> None:
    times = granted(rate, burst, gaps)
    for length in (1.0, 2.0, 10.0):
        assert most_in(times, length) <= burst - 1 + math.ceil(rate * length)


def test_fifty_at_once_are_spread_at_the_rate_not_sent_in_a_wave() -> None:
    times = granted(8.0, 1, [0.0] * 50)
    assert most_in(times, 1.0) == 8
    assert times[-1] - times[0] >= 49 / 8.0


def test_burst_lets_b_go_at_once_then_the_rate() -> None:
    times = granted(8.0, 5, [0.0] * 20)
    assert times[:5] == [times[0]] * 5
    assert most_in(times, 1.0) <= 4 + 8


def test_a_slot_given_back_is_reused() -> None:
    clock = Clock()
    quota = RateQuota(1.0, 1, monotonic=clock)
    assert quota.reserve() == 0.0
    assert quota.reserve() > 0.9
    quota.release()
    assert 0.9 < quota.reserve() < 1.1  # the released slot, not one further out


@given(
    rate=st.sampled_from([1.0, 3.0, 8.0, 50.0]),
    burst=st.integers(1, 10),
    before=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=30),
    after=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=30),
    pause=st.floats(0.0, 1.5),
)
def test_a_new_quota_seeded_with_what_the_last_one_sent_keeps_every_window(
    rate: float, burst: int, before: list[float], after: list[float], pause: float
) -> None:
    """A restart or a takeover: the new process's quota counts the requests the log shows in
    the last seconds, so the provider's windows hold across the change of hands."""
    clock = Clock()
    old = RateQuota(rate, burst, monotonic=clock)
    sent = []
    for gap in before:
        clock.now += gap
        sent.append(clock.now + old.reserve())
    clock.now = max(clock.now, max(sent)) + pause
    new = RateQuota(rate, burst, monotonic=clock)
    new.seed([t for t in sent if clock.now - t < 2.0])
    for gap in after:
        clock.now += gap
        sent.append(clock.now + new.reserve())
    times = sorted(sent)
    for length in (1.0, 2.0):
        assert most_in(times, length) <= burst - 1 + math.ceil(rate * length)


def test_a_fresh_quota_without_the_seed_opens_a_second_burst() -> None:
    """What the seed prevents: the old process's burst and the new one's in one window."""
    clock = Clock()
    old = RateQuota(8.0, 5, monotonic=clock)
    sent = [clock.now + old.reserve() for _ in range(12)]
    clock.now = max(sent) + 0.01
    fresh = RateQuota(8.0, 5, monotonic=clock)
    sent += [clock.now + fresh.reserve() for _ in range(5)]
    assert most_in(sorted(sent), 1.0) > 4 + 8
