"""One active node per database log: the lease, kept by the node's own monotonic clock.

The lease row (``eventlog.pgstore``) holds the holder, an epoch that only grows, and an expiry
on the database's clock. This module is the node's side:

    * :meth:`Lease.acquire` is the standby loop: every ``poll`` seconds it copies the records
      committed since its last look into the local segment files (so a takeover replays only
      the tail) and tries to take the lease; taking it raises the epoch.
    * :meth:`Lease.keep` renews every ``renew_seconds``. A renewal that succeeds extends the
      lease to (when the renewal was *sent*, by ``time.monotonic()``) + ``lease_seconds``:
      never later than the database's expiry. A renewal the database refuses (another epoch)
      raises :class:`~eventlog.errors.FencedError`; one that cannot reach it extends nothing,
      and once the lease has run out by the local clock ``keep`` raises too.
    * :meth:`Lease.allows` is the gate before every provider request: at least the request's
      timeout plus ``margin`` must remain. A node that cannot renew (database unreachable,
      process paused) stops sending before another node can take over.
    * :meth:`Lease.release` hands the lease over at once on a graceful stop.

The database calls run in worker threads on connections of their own (never the writer's).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from daemon import logfmt
from eventlog import pgstore
from eventlog.errors import DamagedLogError, FencedError, StoreError
from eventlog.store import append_segments, local_head, write_segments


@dataclass
class LeaseStats:
    renewals: int = 0
    renewal_failures: int = 0
    takeovers: int = 0
    fenced: int = 0  # times this node was fenced (an append or a renewal refused)
    round_trip: float = 0.0  # seconds, the last lease statement's


def render(stats: LeaseStats, epoch: int, remaining: float) -> list[str]:
    """Prometheus lines for the lease."""
    out: list[str] = []
    for name, kind, help_, value in (
        ("bide_lease_renewals_total", "counter", "Lease renewals that succeeded.",
         stats.renewals),
        ("bide_lease_renewal_failures_total", "counter",
         "Lease renewals that could not reach the database.", stats.renewal_failures),
        ("bide_lease_takeovers_total", "counter", "Times this process took the lease.",
         stats.takeovers),
        ("bide_lease_fenced_total", "counter",
         "Times this process was fenced (an append or renewal refused: another epoch).",
         stats.fenced),
        ("bide_lease_epoch", "gauge", "The lease epoch this node acts under.", epoch),
        ("bide_lease_remaining_seconds", "gauge",
         "Lease time left by this node's monotonic clock.", round(max(remaining, 0.0), 3)),
        ("bide_db_round_trip_seconds", "gauge", "The last lease statement's round trip.",
         round(stats.round_trip, 6)),
    ):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return out


@dataclass
class Lease:
    settings: pgstore.PgSettings
    log_dir: Path
    lease_seconds: float = 10.0
    renew_seconds: float = 3.0
    margin: float = 1.0
    node: str = ""
    poll: float = 0.5
    holder: str = field(init=False)
    epoch: int = field(init=False, default=0)
    valid_until: float = field(init=False, default=float("-inf"))
    stats: LeaseStats = field(init=False, default_factory=LeaseStats)
    _conn: Any = field(init=False, default=None)
    _known: tuple[int, str] | None = field(init=False, default=None)  # the local copy's head
    _renewed: anyio.Event | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        name = self.node or socket.gethostname()
        # Unique per process: a restarted node is a new holder and must wait out the old lease.
        self.holder = f"{name}/{os.getpid()}/{secrets.token_hex(3)}"
        self.poll = min(self.poll, self.renew_seconds)

    # -- the node's clock ------------------------------------------------------------------

    def remaining(self) -> float:
        return self.valid_until - time.monotonic()

    def allows(self, request_seconds: float) -> bool:
        return self.remaining() >= request_seconds + self.margin

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

    # -- database calls (worker threads) -----------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = pgstore.connect(self.settings)
        return self._conn

    def _call(self, what: str, *args: Any) -> Any:
        started = time.monotonic()
        try:
            conn = self._connection()
            fn = getattr(pgstore, what)
            result = fn(conn, *args)
        except pgstore.DatabaseError as exc:
            self.close()
            raise StoreError(f"the lease statement failed: {pgstore.reason(exc)}") from None
        self.stats.round_trip = time.monotonic() - started
        return result

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def follow(self) -> int:
        """Copy the records committed since the local copy's head (all of them into an empty
        copy); a copy that is not a prefix of the database's is moved aside and rebuilt.
        Returns how many records were copied."""
        try:
            return self._follow()
        except pgstore.DatabaseError as exc:
            self.close()
            raise StoreError(f"reading the log from PostgreSQL failed: "
                             f"{pgstore.reason(exc)}") from None

    def _follow(self) -> int:
        conn = self._connection()
        head = self._known
        if head is None and self.log_dir.is_dir():
            head = local_head(self.log_dir)
        if head is not None:
            got = pgstore.lines_after(conn, head[0] - 1, 1)
            if not got or got[0].seq != head[0] or got[0].hash != head[1]:
                aside = self.log_dir.with_name(f"{self.log_dir.name}.stale-{time.time_ns()}")
                self.log_dir.rename(aside)
                logfmt.warn("the local copy of the log is not the database's; moved aside and "
                            "rebuilt", moved_to=aside, local_head=head[0])
                head = None
        if head is None:
            if self.log_dir.is_dir() and any(self.log_dir.glob("seg-*")):
                raise DamagedLogError(f"{self.log_dir}: segment files with no complete record")
            copied = list(pgstore.iter_all(conn))
            write_segments(copied, self.log_dir)
            self._known = (copied[-1].seq, copied[-1].hash) if copied else None
            return len(copied)
        count = 0
        while True:
            lines = pgstore.lines_after(conn, head[0], 10_000)
            count += append_segments(lines, self.log_dir)
            if lines:
                head = (lines[-1].seq, lines[-1].hash)
            self._known = head
            if len(lines) < 10_000:
                return count

    def forget_head(self) -> None:
        """The local copy changed under us (this node wrote it as the active node)."""
        self._known = None

    # -- the loops --------------------------------------------------------------------------

    async def acquire(self) -> int:
        """Follow the log as a standby until the lease is ours; returns the new epoch (the
        local copy then holds every record committed before it)."""
        while True:
            try:
                await anyio.to_thread.run_sync(self.follow)
                sent = time.monotonic()
                epoch = await anyio.to_thread.run_sync(
                    self._call, "take_lease", self.holder, self.lease_seconds)
                if epoch is not None:
                    self.epoch = int(epoch)
                    self._extended(sent + self.lease_seconds)
                    self.stats.takeovers += 1
                    await anyio.to_thread.run_sync(self.follow)  # what came before the take
                    logfmt.info("took the log's lease", node=self.holder, epoch=self.epoch)
                    return self.epoch
            except StoreError as exc:
                logfmt.warn("standby cannot reach the database; retrying", error=exc)
            await anyio.sleep(self.poll)

    async def keep(self) -> None:
        """Renew until cancelled; raises :class:`FencedError` once the lease is lost or has
        run out by the local clock."""
        while True:
            await anyio.sleep(self.renew_seconds)
            sent = time.monotonic()
            try:
                with anyio.fail_after(max(0.1, self.remaining())):
                    ok = await anyio.to_thread.run_sync(
                        self._call, "renew_lease", self.holder, self.epoch,
                        self.lease_seconds, abandon_on_cancel=True)
            except (StoreError, TimeoutError) as exc:
                self.stats.renewal_failures += 1
                self._conn = None  # a thread abandoned on it may still hold it
                if self.remaining() <= 0:
                    raise FencedError(f"the lease ran out by this node's clock (epoch "
                                      f"{self.epoch}) while the database could not be "
                                      f"reached; back to standby") from None
                logfmt.warn("lease renewal failed; requests stop once too little is left",
                            error=exc, remaining=f"{self.remaining():.1f}s")
                continue
            if not ok:
                self.valid_until = float("-inf")
                raise FencedError(f"the lease is no longer this node's (epoch {self.epoch}); "
                                  f"back to standby")
            self._extended(sent + self.lease_seconds)
            self.stats.renewals += 1

    def release(self) -> None:
        """Hand the lease over now (graceful stop); a failure only means the next node waits
        out the lease."""
        self.valid_until = float("-inf")
        try:
            self._call("release_lease", self.holder, self.epoch)
        except StoreError as exc:
            logfmt.warn("could not hand the lease over; the next node waits for it to expire",
                        error=exc)
        self.close()
