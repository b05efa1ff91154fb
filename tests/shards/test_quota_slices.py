"""The pure division of a provider's quota among nodes (:func:`daemon.shards.quota.slices`):
every node computes its own slice from the same rows, and the slices together fit the quota
in every 1 s window at the provider, whatever the demands."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from daemon.shards.quota import NOTHING, Slice, slices

NODES = [f"n{i}" for i in range(8)]

quotas = st.one_of(
    st.floats(min_value=0.01, max_value=2000, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1, max_value=500).map(float),
)
demands = st.dictionaries(
    st.sampled_from(NODES),
    st.one_of(st.just(0.0), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
    max_size=8,
)


def all_slices(
    quota: float, burst: int, in_flight: int, demand: dict[str, float]
) -> dict[str, Slice]:
    return {n: slices(quota, burst, in_flight, demand, n) for n in demand}


@given(quotas, st.integers(1, 50), st.integers(1, 64), demands)
def test_the_slices_of_all_nodes_fit_the_quota(
    quota: float, burst: int, in_flight: int, demand: dict[str, float]
) -> None:
    got = all_slices(quota, burst, in_flight, demand)
    served = [s for s in got.values() if s.rate > 0]
    assert math.fsum(s.rate for s in got.values()) <= quota * (1 + 1e-12)
    assert sum(s.in_flight for s in got.values()) <= in_flight
    # The 1 s window bound: each node's burst beyond one plus its whole-second rate.
    assert sum(s.burst - 1 for s in served) <= burst - 1
    assert sum(math.ceil(s.rate - 1e-9) for s in served) <= math.ceil(quota - 1e-9)
    # A node given a rate can send (a slot in flight), and one given none has nothing.
    for s in got.values():
        assert (s.rate > 0) == (s.in_flight > 0) == (s.burst > 0)


@given(quotas, st.integers(1, 50), st.integers(1, 64), demands)
def test_every_node_with_demand_is_served_when_the_quota_allows(
    quota: float, burst: int, in_flight: int, demand: dict[str, float]
) -> None:
    got = all_slices(quota, burst, in_flight, demand)
    wanting = [n for n, d in demand.items() if d > 0]
    for n, d in demand.items():
        if d == 0:
            assert got[n] == NOTHING  # idle nodes get nothing: every unit goes to use
    if len(wanting) <= min(in_flight, max(1, math.floor(quota))):
        assert all(got[n].rate > 0 and got[n].in_flight >= 1 for n in wanting)
    if wanting and quota >= 1:  # nothing left on the table when someone wants it
        assert math.fsum(s.rate for s in got.values()) >= quota * (1 - 1e-12)


@given(quotas, st.integers(1, 50), st.integers(1, 64), demands)
def test_a_node_absent_from_the_rows_gets_nothing(
    quota: float, burst: int, in_flight: int, demand: dict[str, float]
) -> None:
    assert slices(quota, burst, in_flight, demand, "not-a-node") == NOTHING


def test_shares_follow_demand() -> None:
    demand = {"a": 300.0, "b": 100.0}
    a, b = (slices(40.0, 9, 8, demand, n) for n in "ab")
    assert (a.rate, b.rate) == (30.0, 10.0)
    assert (a.in_flight, b.in_flight) == (6, 2)
    assert (a.burst - 1, b.burst - 1) == (6, 2)


def test_the_fraction_goes_to_the_first_node_and_whole_rates_to_the_rest() -> None:
    demand = {"a": 1.0, "b": 1.0, "c": 1.0}
    got = [slices(10.5, 1, 8, demand, n) for n in "abc"]
    assert [s.rate for s in got] == [4.5, 3.0, 3.0]
    assert all(s.burst == 1 for s in got)


def test_more_nodes_than_whole_requests_per_second_serves_the_busiest() -> None:
    demand = {"a": 5.0, "b": 50.0, "c": 1.0}
    got = {n: slices(2.0, 1, 8, demand, n) for n in demand}
    assert got["b"] == Slice(1.0, 1, 6)
    assert got["a"] == Slice(1.0, 1, 2)
    assert got["c"] == NOTHING
    below_one = {n: slices(0.5, 1, 8, demand, n) for n in demand}
    assert below_one["b"].rate == 0.5
    assert below_one["a"] == below_one["c"] == NOTHING


def test_one_node_alone_gets_the_whole_quota() -> None:
    assert slices(12.5, 4, 6, {"a": 3.0}, "a") == Slice(12.5, 4, 6)
