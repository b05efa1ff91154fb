"""Which shards a node should take and which it should hand over: pure, no I/O, no clock.

Theory of operation. Every node reads the same facts from the database (the live nodes and
whether each is leaving, who holds each shard's lease now) and runs :func:`plan` for itself;
because the rule is deterministic every node reaches the same division, and nobody has to
coordinate beyond the leases themselves (the database still decides who takes a shard: two
nodes that both try, on stale facts, cannot both get it).

Rules:

* The fair share: the live nodes that are not leaving, sorted by name; with N shards and n
  such nodes each gets ``N // n`` and the first ``N % n`` one more.
* Take: shards nobody holds (free, or their holder's lease ran out), only while I am below
  my share, and only up to it. Nodes below their share pick free shards starting at
  different places (their rank), so they rarely race for the same lease.
* Release (a graceful handover, drained and snapshot first): shards above my share, only as
  many as the nodes below their share cannot fill from the free shards, split among the
  nodes above their share in name order: nothing is released into the void, and a dead
  node's shards (free once its leases run out) are taken without moving anyone else's. A
  leaving node (or one not among the live nodes) releases everything and takes nothing.

A shard whose lease is held by a node that is not live (its heartbeat expired, or a
previous incarnation of a restarted node) stays that holder's until the lease runs out: the
fencing rules hold per shard, so only an expired lease may be taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """What one node should do now: shards to try to take, shards to hand over, and its
    fair share (for the logs and metrics)."""

    take: frozenset[int]
    release: frozenset[int]
    target: int


def targets(count: int, nodes: Mapping[str, bool]) -> dict[str, int]:
    """Each live, non-leaving node's fair share of ``count`` shards (``nodes``: name ->
    leaving)."""
    staying = sorted(name for name, leaving in nodes.items() if not leaving)
    if not staying:
        return {}
    base, extra = divmod(count, len(staying))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(staying)}


def plan(
    count: int,
    nodes: Mapping[str, bool],
    holders: Mapping[int, str],
    me: str,
) -> Plan:
    """My plan for ``count`` shards.

    Args:
        count: the log's shard count.
        nodes: the live nodes (heartbeat not expired), name -> leaving.
        holders: shard -> the node whose unexpired lease holds it (absent: nobody holds
            it, or its lease ran out).
        me: this node's name.
    """
    mine = sorted(k for k, who in holders.items() if who == me and 0 <= k < count)
    share = targets(count, nodes)
    if me not in share:  # leaving, or not (yet, still) among the live nodes
        return Plan(frozenset(), frozenset(mine), 0)
    target = share[me]
    free = [k for k in range(count) if k not in holders]
    held: dict[str, int] = {}
    for k, who in holders.items():
        if 0 <= k < count:
            held[who] = held.get(who, 0) + 1
    if len(mine) < target:
        rank = sorted(share).index(me)
        start = (rank * count) // max(1, len(share))
        ordered = sorted(free, key=lambda k: (k - start) % count)
        return Plan(frozenset(ordered[: target - len(mine)]), frozenset(), target)
    excess = len(mine) - target
    if excess == 0:
        return Plan(frozenset(), frozenset(), target)
    deficit = sum(max(0, t - held.get(name, 0)) for name, t in share.items())
    # The free shards fill the others first; only what they still lack is released, by the
    # nodes above their share in name order (every node computes the same split), so no
    # more is handed over than can be taken.
    room = max(0, deficit - len(free))
    for name in sorted(share):
        over = max(0, held.get(name, 0) - share[name])
        if name == me:
            give = min(over, room)
            return Plan(frozenset(), frozenset(mine[len(mine) - give :]), target)
        room -= min(over, room)
    raise AssertionError("unreachable: me is in share")
