"""One active node per database log: the lease, kept by the node's own clock.

The lease row (``eventlog.pgstore``) holds the holder, an epoch that only grows (by one per
takeover), and an expiry on the database's clock. The node changes it only through the
database's checked functions (``bide_take_lease``, ``bide_renew_lease``,
``bide_release_lease``): its role has no UPDATE on the row. This module is the node's side:

    * :meth:`Lease.acquire` is the standby loop: it copies the records committed since its
      last look into the local segment files (so a takeover replays only the tail) and tries
      to take the lease (taking it raises the epoch) whenever a round is committed or the
      lease handed over (``LISTEN``/``NOTIFY``), and at least every ``poll`` seconds.
    * :meth:`Lease.keep` renews every ``renew_seconds``. A renewal that succeeds extends the
      lease to (when the renewal was *sent*, by :func:`now`, CLOCK_BOOTTIME) + ``lease_seconds``:
      never later than the database's expiry. A renewal the database refuses (another epoch)
      raises :class:`~eventlog.errors.FencedError`; one that cannot reach it extends nothing,
      and once the lease has run out by the local clock ``keep`` raises too.
    * :meth:`Lease.allows` is the gate before every provider request: at least the request's
      timeout plus ``margin`` must remain. A node that cannot renew (database unreachable,
      process paused) stops sending before another node can take over.
    * :meth:`Lease.release` hands the lease over at once on a graceful stop.

The lease's statements, the standby's reads and its wait for news go through the store's
:class:`~eventlog.logstore.Following` side (:class:`eventlog.pglink.PgLink`: psycopg's async
pool, so a renewal that hangs is cancelled cleanly by its deadline). Appends do not use it:
the log writer's thread owns its own connection (``eventlog.pgstore.PgStore``), as it owns
the local files and their fsync.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio

from daemon import logfmt
from eventlog.errors import DamagedLogError, FencedError, StoreError
from eventlog.logstore import Following, Term
from eventlog.store import (
    append_segments,
    cut_after,
    local_head,
    write_segments,
)


def now() -> float:
    """The node's clock for its lease: CLOCK_BOOTTIME where there is one, which (unlike
    CLOCK_MONOTONIC) keeps counting while the host or VM is suspended, so a node that wakes
    from a suspend finds its lease run out instead of acting on it."""
    return time.clock_gettime(_CLOCK)


_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_T = TypeVar("_T")

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings

#: Lines read per statement while following.
FOLLOW_BATCH = 10_000
#: The least time between two follows: a burst of commits is copied once, not per NOTIFY.
FOLLOW_SPACING = 0.02


@dataclass
class LeaseStats:
    renewals: int = 0
    renewal_failures: int = 0
    takeovers: int = 0
    fenced: int = 0  # terms this node ended fenced (an append or a renewal refused)
    fenced_appends: int = 0  # write rounds the database refused under another epoch
    round_trip: float = 0.0  # seconds, the last lease statement's


def render(stats: LeaseStats, epoch: int, remaining: float) -> list[str]:
    """Prometheus lines for the lease."""
    out: list[str] = []
    for name, kind, help_, value in (
        ("bide_lease_renewals_total", "counter", "Lease renewals that succeeded.", stats.renewals),
        (
            "bide_lease_renewal_failures_total",
            "counter",
            "Lease renewals that could not reach the database.",
            stats.renewal_failures,
        ),
        (
            "bide_lease_takeovers_total",
            "counter",
            "Times this process took the lease.",
            stats.takeovers,
        ),
        (
            "bide_lease_fenced_total",
            "counter",
            "Terms this process ended fenced (an append or renewal refused: another epoch).",
            stats.fenced,
        ),
        (
            "bide_store_fenced_appends_total",
            "counter",
            "Write rounds the database refused because another node's epoch was in force.",
            stats.fenced_appends,
        ),
        ("bide_lease_epoch", "gauge", "The lease epoch this node acts under.", epoch),
        (
            "bide_lease_remaining_seconds",
            "gauge",
            "Lease time left by this node's own clock (CLOCK_BOOTTIME).",
            round(max(remaining, 0.0), 3),
        ),
        (
            "bide_db_round_trip_seconds",
            "gauge",
            "The last lease statement's round trip.",
            round(stats.round_trip, 6),
        ),
    ):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return out


@dataclass
class Lease:
    settings: PgSettings
    log_dir: Path
    lease_seconds: float = 10.0
    renew_seconds: float = 3.0
    margin: float = 1.0
    node: str = ""
    poll: float = 0.5
    #: The store's following side; the default is the database's (``settings``).
    following: InitVar[Following | None] = None
    holder: str = field(init=False)
    epoch: int = field(init=False, default=0)
    _term: Term | None = field(init=False, default=None)
    valid_until: float = field(init=False, default=float("-inf"))
    stats: LeaseStats = field(init=False, default_factory=LeaseStats)
    link: Following = field(init=False)
    _known: tuple[int, str] | None = field(init=False, default=None)  # the local copy's head
    _renewed: anyio.Event | None = field(init=False, default=None)
    _lost: anyio.Event | None = field(init=False, default=None)  # set by :meth:`fenced`
    _lost_why: str = field(init=False, default="")
    #: Called after each look at the database while standby (a standby's reads follow the
    #: copy it keeps: daemon.standby).
    followed: Callable[[], None] = field(init=False, default_factory=lambda: _nothing)

    def __post_init__(self, following: Following | None) -> None:
        # The holder is written into the signed takeover record and printed by verify: one
        # short line of plain characters, whatever the config or the host name holds.
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.node or socket.gethostname())[:64]
        # Unique per process: a restarted node is a new holder and must wait out the old lease.
        self.holder = f"{name}/{os.getpid()}/{secrets.token_hex(3)}"
        if following is None:
            from eventlog.pglink import PgLink  # psycopg only where the log is in PostgreSQL

            following = PgLink(self.settings)
        self.link = following

    # -- the node's clock ------------------------------------------------------------------

    def remaining(self) -> float:
        return self.valid_until - now()

    def allows(self, request_seconds: float) -> bool:
        """Whether a request that may take ``request_seconds`` can leave: the lease outlives
        it by ``margin`` (never less than the margin itself: a negative time asked about is
        a request whose own time ran out, not a lease with room to spare)."""
        return self.remaining() >= max(0.0, request_seconds) + self.margin

    @property
    def longest_request(self) -> float:
        """The longest request timeout that never waits on more than a renewal's round trip:
        just before a renewal only ``lease_seconds - renew_seconds`` is left, and the margin
        comes off that."""
        return self.lease_seconds - self.renew_seconds - self.margin

    def health(self) -> tuple[str, int, float]:
        """(holder, epoch, seconds left by this node's clock) for the API's health answer."""
        return self.holder, self.epoch, max(self.remaining(), 0.0)

    def metrics_lines(self) -> list[str]:
        return render(self.stats, self.epoch, self.remaining())

    async def wait_allows(self, request_seconds: float) -> None:
        """Wait until a request of ``request_seconds`` fits in the lease (a renewal lands);
        a lease that is lost instead ends the node's task group (:meth:`keep` raises)."""
        while not self.allows(request_seconds):
            if self._renewed is None:
                self._renewed = anyio.Event()
            await self._renewed.wait()

    def _extended(self, until: float) -> None:
        self.valid_until = until
        if self._renewed is not None:
            self._renewed.set()
            self._renewed = None

    @property
    def active(self) -> bool:
        return self.remaining() > 0

    @property
    def term(self) -> Term:
        """The term taken by the last :meth:`acquire` (its epoch and the database's secret
        for it), for the store that appends under it."""
        if self._term is None:
            raise StoreError("no lease term has been taken yet")
        return self._term

    # -- the store's following side ------------------------------------------------------

    async def open(self) -> None:
        """Open the node's link to the store (it connects in the background and keeps
        reconnecting while the database is away)."""
        await self.link.open()

    async def aclose(self) -> None:
        await self.link.aclose()

    async def _timed(self, call: Awaitable[_T]) -> _T:
        """One lease statement, its round trip kept for the metrics."""
        started = time.monotonic()
        got = await call
        self.stats.round_trip = time.monotonic() - started
        return got

    # -- following the log -----------------------------------------------------------------

    async def follow(self) -> int:
        """Copy the records committed since the local copy's head (all of them into an empty
        copy); a copy that is not a prefix of the database's, or that is damaged (a torn
        line, a file cut short), is moved aside and rebuilt: the database is the truth.
        Returns how many records were copied."""
        try:
            return await self._follow()
        except (DamagedLogError, OSError) as exc:
            self._move_aside(f"the local copy of the log cannot be extended ({exc})")
            return await self._follow()

    async def _follow(self) -> int:
        head = self._known
        if head is None and self.log_dir.is_dir():
            head = await anyio.to_thread.run_sync(local_head, self.log_dir)
            if head is not None:
                await self._check_prefix(head)
                head = self._known
            elif any(self.log_dir.glob("seg-*")):
                self._move_aside("the local copy of the log holds no complete record")
        count = 0
        while True:
            lines = await self.link.lines_after(-1 if head is None else head[0], FOLLOW_BATCH)
            if lines:
                write = write_segments if head is None else append_segments
                count += await anyio.to_thread.run_sync(write, lines, self.log_dir)
                head = (lines[-1].seq, lines[-1].hash)
            self._known = head
            if len(lines) < FOLLOW_BATCH:
                return count

    async def _check_prefix(self, head: tuple[int, str]) -> None:
        """Keep a local copy read from disk only if the database holds its last record;
        otherwise move it aside, to be rebuilt. Sets what is known of the copy."""
        got = await self.link.lines_after(head[0] - 1, 1)
        if got and got[0].seq == head[0] and got[0].hash == head[1]:
            self._known = head
            return
        stored = await self.link.head()
        if stored is not None and stored[0] < head[0]:
            # A writer killed between its local fsync and its commit: the copy is the
            # database's plus records never acknowledged. Cut those, keep the rest.
            kept = await anyio.to_thread.run_sync(cut_after, self.log_dir, *stored)
            if kept is not None:
                logfmt.warn(
                    "records this node's copy held but the database never committed "
                    "(never acknowledged) were cut",
                    kept_in=kept,
                    head=stored[0],
                )
                self._known = stored
                return
        self._move_aside(f"the local copy of the log (head {head[0]}) is not the database's")

    def _move_aside(self, why: str) -> None:
        """Rename the local copy to ``log.stale-NS`` (kept for a look, not read again); the
        next follow rebuilds it from the database."""
        aside = self.log_dir.with_name(f"{self.log_dir.name}.stale-{time.time_ns()}")
        if self.log_dir.exists():
            self.log_dir.rename(aside)
        logfmt.warn(why + "; moved aside and rebuilt from the database", moved_to=aside)
        self._known = None
        # Each is a whole copy of a log the database holds: keep the latest two to look at.
        for old in sorted(self.log_dir.parent.glob(f"{self.log_dir.name}.stale-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def forget_head(self) -> None:
        """The local copy changed under us (this node wrote it as the active node)."""
        self._known = None

    # -- the loops --------------------------------------------------------------------------

    async def acquire(self) -> int:
        """Follow the log as a standby until the lease is ours; returns the new epoch (the
        local copy then holds every record committed before it). Wakes on every committed
        round and on a handover (``NOTIFY``), and at least every ``poll`` seconds."""
        async with self.link.news(_cannot_listen) as news:
            while True:
                try:
                    await self.follow()
                    self.followed()
                    sent = now()
                    term = await self._timed(self.link.take_lease(self.holder, self.lease_seconds))
                    if term is not None:
                        epoch = term.epoch
                        self.epoch, self._term = epoch, term
                        self._extended(sent + self.lease_seconds)
                        self.stats.takeovers += 1
                        if await self._caught_up():
                            logfmt.info("took the log's lease", node=self.holder, epoch=epoch)
                            return epoch
                except (StoreError, DamagedLogError, OSError) as exc:
                    logfmt.warn("standby cannot follow the log; retrying", error=exc)
                    await anyio.sleep(self.poll)
                    continue
                await news(self.poll)
                await anyio.sleep(FOLLOW_SPACING)  # a burst of commits: one follow, not many

    async def _caught_up(self) -> bool:
        """Copy what came before the take, retrying while the lease lasts (a failure here
        must not waste the epoch just taken); False once it ran out."""
        while self.remaining() > self.margin:
            try:
                await self.follow()
                return True
            except StoreError as exc:
                logfmt.warn(
                    "cannot copy the log's tail after taking the lease; retrying", error=exc
                )
                await anyio.sleep(min(self.poll, max(0.0, self.remaining())))
        self.valid_until = float("-inf")
        return False

    def _current(self) -> Term:
        """The term in force for renewals and the release (none taken yet: a term no store
        knows, refused like any stale one)."""
        return self._term if self._term is not None else Term(self.epoch, "")

    def fenced(self, why: str) -> None:
        """An append was refused under another epoch: :meth:`keep` ends the term at once
        instead of at its next renewal, and no request is allowed from now on."""
        self.valid_until = float("-inf")
        self._lost_why = why
        if self._lost is not None:
            self._lost.set()

    async def keep(self) -> None:
        """Renew until cancelled; raises :class:`FencedError` once the lease is lost, has
        run out by the local clock, or an append was fenced (:meth:`fenced`)."""
        self._lost, self._lost_why = anyio.Event(), ""
        while True:
            with anyio.move_on_after(self.renew_seconds):
                await self._lost.wait()
            if self._lost_why:
                raise FencedError(self._lost_why)
            sent = now()
            try:
                with anyio.fail_after(max(0.1, self.remaining())):
                    renewed = await self._timed(
                        self.link.renew_lease(self.holder, self._current(), self.lease_seconds)
                    )
            except (StoreError, TimeoutError) as exc:
                self.stats.renewal_failures += 1
                if self.remaining() <= 0:
                    raise FencedError(
                        f"the lease ran out by this node's clock (epoch "
                        f"{self.epoch}) while the database could not be "
                        f"reached; back to standby"
                    ) from None
                logfmt.warn(
                    "lease renewal failed; requests stop once too little is left",
                    error=str(exc) or "timed out",
                    remaining=f"{self.remaining():.1f}s",
                )
                continue
            if not renewed:
                self.valid_until = float("-inf")
                raise FencedError(
                    f"the lease is no longer this node's (epoch {self.epoch}); back to standby"
                )
            self._extended(sent + self.lease_seconds)
            self.stats.renewals += 1

    async def release(self) -> None:
        """Hand the lease over now (graceful stop), waking the standbys; a failure only means
        the next node waits out the lease."""
        self.valid_until = float("-inf")
        try:
            with anyio.fail_after(max(1.0, self.settings.connect_timeout)):
                await self._timed(self.link.release_lease(self.holder, self._current()))
        except (StoreError, TimeoutError) as exc:
            logfmt.warn(
                "could not hand the lease over; the next node waits for it to expire",
                error=str(exc) or "timed out",
            )


def _nothing() -> None:
    pass


def _cannot_listen(why: str) -> None:
    logfmt.warn("cannot listen for new records; following by polling", error=why)
