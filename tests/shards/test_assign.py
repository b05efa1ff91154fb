"""The division of shards among nodes (daemon.shards.assign): every node runs the same pure
plan on the same facts, and rounds of it converge to one owner per shard, even loads, and
few moves."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from daemon.shards.assign import Plan, plan, targets

NAMES = st.lists(
    st.text(alphabet="abcdefgh", min_size=1, max_size=3), min_size=1, max_size=6, unique=True
)


def round_of(
    count: int, nodes: dict[str, bool], holders: dict[int, str], order: list[str]
) -> dict[int, str]:
    """One round: every node plans on the same snapshot; releases land, then the takes in
    ``order`` (the database gives a free lease to the first who asks)."""
    plans = {me: plan(count, nodes, holders, me) for me in nodes}
    after = dict(holders)
    for me, p in plans.items():
        for k in p.release:
            assert after.get(k) == me
            del after[k]
    for me in order:
        for k in sorted(plans[me].take):
            if k not in after:
                after[k] = me
    return after


def settle(
    count: int, nodes: dict[str, bool], holders: dict[int, str], order: list[str]
) -> tuple[dict[int, str], int]:
    """Rounds until nothing changes; returns the division and how many shards changed hands
    (a shard released and taken back by the same node counts too)."""
    moves = 0
    for _ in range(4 * count + 8):
        after = round_of(count, nodes, holders, order)
        if after == holders:
            return after, moves
        moves += sum(1 for k, who in after.items() if holders.get(k) not in (None, who))
        moves += sum(1 for k in holders if k not in after)
        holders = after
    raise AssertionError(f"no fixed point: {holders}")


def assert_balanced(count: int, nodes: dict[str, bool], holders: dict[int, str]) -> None:
    assert sorted(holders) == list(range(count))  # every shard, exactly one owner
    share = targets(count, nodes)
    loads = {name: 0 for name in share}
    for who in holders.values():
        loads[who] += 1
    assert loads == share
    assert max(loads.values()) - min(loads.values()) <= 1


def test_fair_share_by_name() -> None:
    assert targets(8, {"b": False, "a": False, "c": False}) == {"a": 3, "b": 3, "c": 2}
    assert targets(2, {"a": False, "b": False, "c": False}) == {"a": 1, "b": 1, "c": 0}
    assert targets(4, {"a": True, "b": False}) == {"b": 4}
    assert targets(4, {"a": True}) == {}


def test_a_lone_node_takes_every_free_shard() -> None:
    assert plan(4, {"a": False}, {}, "a") == Plan(frozenset({0, 1, 2, 3}), frozenset(), 4)


def test_a_node_at_its_share_does_nothing() -> None:
    holders = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert plan(4, {"a": False, "b": False}, holders, "a") == Plan(frozenset(), frozenset(), 2)


def test_a_joiner_gets_shards_by_handover() -> None:
    nodes = {"a": False, "b": False, "c": False}
    holders = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b", 7: "b"}
    # targets a=3, b=3, c=2: a and b each hand one over, c takes nothing yet (none free).
    assert plan(8, nodes, holders, "a") == Plan(frozenset(), frozenset({3}), 3)
    assert plan(8, nodes, holders, "b") == Plan(frozenset(), frozenset({7}), 3)
    assert plan(8, nodes, holders, "c") == Plan(frozenset(), frozenset(), 2)
    after = {k: v for k, v in holders.items() if k not in (3, 7)}
    assert plan(8, nodes, after, "c") == Plan(frozenset({3, 7}), frozenset(), 2)


def test_a_dead_nodes_shards_are_taken_without_moving_others() -> None:
    # c died: its heartbeat expired, and so did its leases (shards 6, 7 are nobody's).
    nodes = {"a": False, "b": False}
    holders = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}
    assert plan(8, nodes, holders, "a").take == frozenset({6}) or plan(
        8, nodes, holders, "a"
    ).take == frozenset({7})
    assert plan(8, nodes, holders, "a").release == frozenset()
    assert plan(8, nodes, holders, "b").release == frozenset()


def test_a_dead_nodes_unexpired_lease_is_not_taken() -> None:
    nodes = {"a": False}
    holders = {0: "a", 1: "ghost"}
    assert plan(2, nodes, holders, "a") == Plan(frozenset(), frozenset(), 2)


def test_a_leaving_node_releases_everything() -> None:
    nodes = {"a": True, "b": False}
    holders = {0: "a", 1: "a", 2: "b"}
    assert plan(3, nodes, holders, "a") == Plan(frozenset(), frozenset({0, 1}), 0)
    assert plan(3, {"b": False}, holders, "a").release == frozenset({0, 1})  # not live


@given(
    count=st.integers(1, 40),
    names=NAMES,
    seed=st.dictionaries(st.integers(0, 39), st.sampled_from(["a", "b", "x", "gone"])),
    data=st.data(),
)
def test_rounds_converge_to_one_owner_and_even_loads(
    count: int, names: list[str], seed: dict[int, str], data: st.DataObject
) -> None:
    nodes = {name: False for name in names}
    # Whatever the start (shards held by nodes now dead have run out: absent), the rounds
    # end with every shard held once and loads within one.
    holders = {k: who for k, who in seed.items() if k < count and who in nodes}
    order = data.draw(st.permutations(names))
    settled, _ = settle(count, nodes, holders, list(order))
    assert_balanced(count, nodes, settled)


@given(count=st.integers(1, 64), n=st.integers(1, 5), joiner=st.sampled_from(["0", "m", "z"]))
def test_a_join_moves_at_most_its_share(count: int, n: int, joiner: str) -> None:
    names = [f"n{i}" for i in range(n)]
    nodes = {name: False for name in names}
    holders, _ = settle(count, nodes, {}, names)
    nodes[joiner] = False
    settled, moves = settle(count, nodes, holders, [*names, joiner])
    assert_balanced(count, nodes, settled)
    assert moves <= math.ceil(count / (n + 1))
    changed = sum(1 for k in range(count) if settled[k] != holders[k])
    assert changed <= math.ceil(count / (n + 1))


@given(count=st.integers(1, 64), n=st.integers(2, 5), data=st.data())
def test_a_graceful_leave_moves_only_the_leavers_shards(
    count: int, n: int, data: st.DataObject
) -> None:
    names = [f"n{i}" for i in range(n)]
    nodes = {name: False for name in names}
    holders, _ = settle(count, nodes, {}, names)
    leaver = data.draw(st.sampled_from(names))
    nodes[leaver] = True
    after = round_of(count, nodes, holders, names)
    assert leaver not in after.values()
    del nodes[leaver]
    settled, _ = settle(count, nodes, after, [x for x in names if x != leaver])
    assert_balanced(count, nodes, settled)
    assert all(settled[k] == who for k, who in holders.items() if who != leaver)


@given(
    count=st.integers(1, 40),
    names=NAMES,
    holders=st.dictionaries(st.integers(0, 39), st.sampled_from(["a", "b", "c", "ghost"])),
    me=st.sampled_from(["a", "b", "c"]),
)
def test_no_release_when_nobody_can_take(
    count: int, names: list[str], holders: dict[int, str], me: str
) -> None:
    nodes = {name: False for name in [*names, me]}
    holders = {k: v for k, v in holders.items() if k < count}
    share = targets(count, nodes)
    free = count - len(holders)
    lacking = sum(
        max(0, t - sum(1 for v in holders.values() if v == name)) for name, t in share.items()
    )
    p = plan(count, nodes, holders, me)
    assert len(p.release) <= max(0, lacking - free)
    assert p.release <= {k for k, v in holders.items() if v == me}
    assert not (p.take and p.release)
    assert all(k not in holders for k in p.take)
