"""One provider quota for the whole installation: each node's slice, agreed through the catalog.

Theory of operation. A provider's ``requests_per_second``, ``burst`` and ``max_in_flight``
(its profile) hold across every node together. Every ``period`` each node writes its demand
on each provider into ``bide_quota`` (a row that expires ``ttl`` later, the lease: it dies
with the node), reads every node's unexpired rows, and computes its own slice with
:func:`slices`, a pure function every node evaluates on the same rows, so the slices of all
nodes fit the quota together. The node's engines keep within the slice through the process's
:class:`daemon.engine.pacing.SharedPacing`.

Rules:

* Demand is the node's live operations on the provider. An operation's poll rate is set by
  its contract (backoff, the provider's hints) and not known ahead; the live count is known,
  stable, and does not shrink when a node is held back (a demand counted in polls asked for
  would: a node given little asks little, and would be given less). Dividing by it gives
  every live operation the same share of the provider wherever its shard is held.
* An idle node (no live operation on the provider) gets nothing: every unit of the quota
  goes to nodes that use it, and an idle node that gets work has its share within two
  periods (one to be seen, one before a raise is safe).
* Lowering is at once, raising only once the higher slice has been computed in every
  exchange for ``raise_after`` seconds (the slice applied is the smallest computed over that
  time): by then every other node has read the rows that allow it and lowered its own.
  The default is ``ttl``, not one period: a node whose exchanges fail keeps its slice until
  its ttl (it cannot know better), and one whose exchange was merely slow reads the rows a
  period and its exchange's time later; waiting ``ttl`` covers both (measured: with a wait
  of one period, three nodes a quarter second apart overshot the quota for a moment when
  one node's exchange ran late). After its slices expired a node starts again from nothing:
  its rows may have expired too, and the others taken its share. One exception: a node
  that finds no other node with demand on the provider takes its slice at once (a node
  holding a slice has a living row with demand: it wrote one at the exchange that set the
  slice, and lowered to nothing at the one that wrote no demand); exchanges take turns
  (a lock on ``bide_quota``), so two nodes cannot both find themselves alone.
* The slice is in force until ``ttl`` after the exchange that set it began (on this node's
  monotonic clock, so no later than the database's ``expires_at`` of the row it wrote). If
  the database cannot be reached the node keeps it that long, then has nothing (it cannot
  know the others' slices), and says so; the other nodes raise theirs only a period after
  its rows expired. A node that leaves deletes its rows, so its share returns at once; a
  dead node's return when they expire.

What the sum promises, per provider, in every 1 s window at the provider: each node sends at
most ``burst_i - 1 + ceil(rate_i)`` (the GCRA bound of :class:`daemon.timers.RateQuota`);
rates are whole requests per second except one node's, which carries the quota's fraction,
so the sum is at most ``burst - 1 + ceil(requests_per_second)``, the bound one node keeps
alone; and in flight at most ``max_in_flight``.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from daemon import logfmt
from daemon.engine.pacing import Limits, SharedPacing
from daemon.metrics import _label

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings

#: The exchange's write and read: this node's demand, then every node's living rows.
_WRITE = """
INSERT INTO bide_quota (provider, node, demand, updated_at, expires_at)
VALUES (%s, %s, %s, now(), now() + make_interval(secs => %s))
ON CONFLICT (provider, node) DO UPDATE
    SET demand = EXCLUDED.demand, updated_at = now(), expires_at = EXCLUDED.expires_at
"""
_READ = "SELECT provider, node, demand FROM bide_quota WHERE expires_at > now()"
#: Exchanges take turns (the mode conflicts with itself, not with plain reads): each reads
#: the demand every exchange before it wrote.
_TURN = "LOCK TABLE bide_quota IN SHARE ROW EXCLUSIVE MODE"
#: Rows of nodes gone for a day (a renamed host) are deleted by whoever exchanges.
_PRUNE = "DELETE FROM bide_quota WHERE expires_at < now() - interval '1 day'"
_LEAVE = "DELETE FROM bide_quota WHERE node = %s"


@dataclass(frozen=True)
class Slice:
    """A node's slice of one provider's quota."""

    rate: float  # requests per second
    burst: int
    in_flight: int


NOTHING = Slice(0.0, 0, 0)


def slices(
    quota: float, burst: int, max_in_flight: int, demands: Mapping[str, float], me: str
) -> Slice:
    """Node ``me``'s slice of a provider's quota, given every live node's demand.

    The nodes with demand are ordered by demand (largest first), then by name; as many as
    there are whole requests per second and in-flight slots (at least one when the quota is
    below one per second) are served, each with one request per second and one slot, and
    the rest of the whole rates, the in-flight slots and the burst beyond one are shared in
    proportion to demand (largest remainders). The first served node carries the quota's
    fraction. A node not served, or with no demand, gets :data:`NOTHING`.
    """
    wanting = sorted((n for n, d in demands.items() if d > 0), key=lambda n: (-demands[n], n))
    units = math.floor(quota)
    seats = min(len(wanting), max_in_flight, max(1, units)) if quota > 0 else 0
    served = wanting[:seats]
    if me not in served:
        return NOTHING
    weights = [demands[n] for n in served]
    whole = _apportion(max(0, units - seats), weights)
    spare_slots = _apportion(max_in_flight - seats, weights)
    spare_burst = _apportion(max(0, burst - 1), weights)
    i = served.index(me)
    if units == 0:
        rate = quota  # below one request per second: one node, all of it
    elif i == 0:
        rate = quota - (units - 1 - whole[0])  # its whole share and the fraction
    else:
        rate = float(1 + whole[i])
    return Slice(rate, 1 + spare_burst[i], 1 + spare_slots[i])


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` whole units in proportion to ``weights`` (largest remainders; ties to the
    earlier weight), summing to exactly ``total``."""
    whole = math.fsum(weights)
    exact = [total * w / whole for w in weights]
    shares = [min(total, math.floor(x)) for x in exact]
    left = total - sum(shares)
    if left < 0:  # float noise pushed a floor over: take back from the largest
        for i in sorted(range(len(shares)), key=lambda i: -shares[i])[:-left]:
            shares[i] -= 1
        left = 0
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


def _smaller(a: Slice, b: Slice) -> Slice:
    return Slice(min(a.rate, b.rate), min(a.burst, b.burst), min(a.in_flight, b.in_flight))


class QuotaExchange:
    """This node's side of the exchange: run one in the node's task group.

    ``settings`` reach the catalog (the DSN's own schema); ``node`` is this node's name in
    ``bide_nodes``; ``shared`` is the process's pacing (made with ``sliced=True``)."""

    def __init__(
        self,
        settings: PgSettings,
        node: str,
        shared: SharedPacing,
        *,
        period: float,
        ttl: float,
        raise_after: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < period < ttl:
            raise ValueError("the exchange's period must be shorter than its ttl")
        self.raise_after = ttl if raise_after is None else raise_after
        self.settings = settings
        self.node = node
        self.shared = shared
        self.period = period
        self.ttl = ttl
        self.monotonic = monotonic
        # provider -> the slices computed over the last ``raise_after`` (and the one before)
        self.computed: dict[str, collections.deque[tuple[float, Slice]]] = {}
        self.applied: dict[str, Slice] = {}  # provider -> the slice in force
        self.until = -math.inf  # the applied slices end then (monotonic)
        self.exchanges = 0
        self.failures = 0
        self._conn: Any = None
        self._said_expired = False

    async def run(self) -> None:
        """Exchange every ``period`` until cancelled; then delete this node's rows, so its
        share returns to the others at once."""
        try:
            while True:
                await self.exchange()
                await anyio.sleep(self.period)
        finally:
            self._drop()  # before the rows go: the others raise a period after they did
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await self._leave()
            await self.aclose()

    def _drop(self) -> None:
        """This node uses no slice any more."""
        self.until = -math.inf
        for provider in self.applied:
            self.shared.set_slice(provider, Limits(0.0, 0, 0), -math.inf)

    async def exchange(self) -> bool:
        """One exchange: write the demand, read every node's, set this node's slices.
        Returns whether the database answered."""
        started = self.monotonic()
        profiles = dict(self.shared.profiles)
        live = self.shared.live()
        demand = {p: float(live.get(p, 0)) for p in {*profiles, *live}}
        try:
            with anyio.fail_after(max(1.0, self.ttl / 2)):
                rows = await self._trade(demand)
        except Exception as exc:  # the database did not answer: keep the slice until ttl
            await self.aclose()
            self._failed(exc)
            return False
        self.exchanges += 1
        self._said_expired = False
        demands: dict[str, dict[str, float]] = {}
        for provider, node, value in rows:
            demands.setdefault(provider, {})[node] = value
        # A raise needs the slice computed over ``raise_after`` while this node's rows lived:
        # after its slices expired (so might its rows: the others may have raised), none was.
        kept = started < self.until
        since = started - self.raise_after
        for provider, limits in profiles.items():
            now = slices(
                limits.rate, limits.burst, limits.in_flight, demands.get(provider, {}), self.node
            )
            history = self.computed.setdefault(provider, collections.deque())
            others = demands.get(provider, {})
            if not any(d > 0 for n, d in others.items() if n != self.node):
                history.clear()  # alone: nobody to wait for
                history.append((since, now))
            elif not kept:
                history.clear()  # expired: from nothing
            history.append((started, now))
            while len(history) > 1 and history[1][0] <= since:
                history.popleft()  # the oldest kept is the one in force ``raise_after`` ago
            applied = now if history[0][0] <= since else NOTHING
            for _, piece in history:
                applied = _smaller(applied, piece)
            self.applied[provider] = applied
        self.until = started + self.ttl
        for provider, piece in self.applied.items():
            self.shared.set_slice(
                provider, Limits(piece.rate, piece.burst, piece.in_flight), self.until
            )
        return True

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        if self.monotonic() < self.until:
            logfmt.warn(
                "quota exchange failed; keeping this node's slices until they expire",
                node=self.node,
                seconds_left=f"{self.until - self.monotonic():.1f}",
                error=reason,
            )
        elif not self._said_expired:
            self._said_expired = True
            logfmt.error(
                "quota slices expired without an exchange: sending nothing to any provider "
                "until the database answers",
                node=self.node,
                error=reason,
            )

    async def _connection(self) -> Any:
        if self._conn is None:
            import psycopg  # only where the log is in PostgreSQL

            from eventlog import pgstore

            self._conn = await psycopg.AsyncConnection.connect(
                self.settings.dsn, autocommit=True, **pgstore.connect_kwargs(self.settings)
            )
        return self._conn

    async def _trade(self, demand: Mapping[str, float]) -> list[tuple[str, str, float]]:
        conn = await self._connection()
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(_TURN)
            await cur.executemany(
                _WRITE, [(p, self.node, d, self.ttl) for p, d in sorted(demand.items())]
            )
            if self.exchanges % 100 == 0:
                await cur.execute(_PRUNE)
            await cur.execute(_READ)
            return [(str(p), str(n), float(d)) for p, n, d in await cur.fetchall()]

    async def _leave(self) -> None:
        try:
            conn = await self._connection()
            await conn.execute(_LEAVE, (self.node,))
        except Exception as exc:  # the rows expire with the ttl anyway
            logfmt.warn("quota rows not deleted on leaving; they expire", error=type(exc).__name__)

    async def aclose(self) -> None:
        """Close the connection to the catalog (:meth:`run` does on its way out)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def in_force(self, provider: str) -> Slice:
        """The slice of ``provider`` in force now (nothing once it expired)."""
        if self.monotonic() >= self.until:
            return NOTHING
        return self.applied.get(provider, NOTHING)

    def metrics_lines(self) -> list[str]:
        """The slices in force, in the Prometheus text format (for the node's metrics)."""
        providers = sorted(self.applied)
        out = [
            "# HELP bide_provider_quota_slice_rps This node's slice of the provider's "
            "requests per second (0 while it has none, or its slice expired).",
            "# TYPE bide_provider_quota_slice_rps gauge",
        ]
        out += [
            f'bide_provider_quota_slice_rps{{provider="{_label(p)}"}} {self.in_force(p).rate:g}'
            for p in providers
        ]
        out += [
            "# HELP bide_provider_quota_slice_in_flight This node's slice of the provider's "
            "requests in flight.",
            "# TYPE bide_provider_quota_slice_in_flight gauge",
        ]
        out += [
            f'bide_provider_quota_slice_in_flight{{provider="{_label(p)}"}} '
            f"{self.in_force(p).in_flight}"
            for p in providers
        ]
        return out
