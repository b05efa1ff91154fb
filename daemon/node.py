"""``bide run`` with the log in PostgreSQL: a standby until the lease is ours, then the
supervisor under that epoch, and back to standby if another node fences us.

    standby:  follow the log into the local segment files; try the lease every poll; answer
              the local API's reads from that copy, refuse its writes (daemon.standby); serve
              ``/metrics`` (``bide_node_active 0``, the lease's series, the process's) so a
              healthy standby is seen as one, not as a daemon down
    active:   open the writer on the local copy (every round committed to the database under
              our epoch), write a signed checkpoint (the takeover in the chain), replay,
              recover the previous holder's requests in flight, poll; renew the lease
    fenced:   an append refused or a renewal refused (or the lease ran out by our clock):
              the task group ends at once (no request after it), back to standby
    SIGTERM:  drain and close as always, then hand the lease over at once

Signing (``daemon.signing``): with ``[log] forward_secure`` (the default) the node must be
enrolled (``bide node enroll``): each term starts with a takeover checkpoint signed by the
node's own key chain, certifying the log's next epoch key made here; at every term's end (and
at start, after a crash) the node destroys its epoch keys of the log. With ``forward_secure =
false``, or a log made in format 2, every node signs with the one ``signing.key``, as before.
"""

from __future__ import annotations

import signal
from typing import Protocol

import anyio

from daemon import logfmt
from daemon.api.door import ApiDoor
from daemon.config import Config
from daemon.errors import ConfigError
from daemon.lease import Lease
from daemon.metrics import serve_metrics, standby_page
from daemon.pgconfig import config_settings
from daemon.profile import load_profiles, too_long_for_lease
from daemon.signing import database_log_format, enrolled_node, node_chain, term_ended
from daemon.standby import StandbyReads
from daemon.supervisor import RequestGate, Supervisor
from eventlog import pgstore
from eventlog.envelope import FORMAT_SINGLE_KEY
from eventlog.errors import DivergedError, EventLogError, FencedError, LogIOError
from eventlog.keys import keys_directory
from eventlog.lock import WriterLock
from eventlog.store import LineStore


class Build(Protocol):
    def __call__(
        self,
        cfg: Config,
        *,
        store: LineStore | None = None,
        lease: RequestGate | None = None,
        ask_witnesses: bool = True,
    ) -> Supervisor: ...


def run_node(cfg: Config, build: Build) -> int:
    """``build`` makes the supervisor of one term (``daemon.commands.run``'s, so both paths
    start the same daemon)."""
    settings = config_settings(cfg)
    assert settings is not None
    assert cfg.postgres is not None
    require_enrolled(cfg)
    pg = cfg.postgres
    lease = Lease(
        settings,
        cfg.log_dir,
        lease_seconds=pg.lease_seconds,
        renew_seconds=pg.renew_seconds,
        margin=pg.request_margin_seconds,
        node=pg.node,
        poll=pg.standby_poll_seconds,
    )
    _check_profiles_fit(cfg, lease.longest_request)
    with pgstore.PgLogStore(settings) as log_store:
        log_store.require()
    # One node per state directory, standby or active: a second would write the same local
    # copy of the log while the first follows or appends to it.
    cfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    node_lock = WriterLock(cfg.state_dir)
    node_lock.acquire()
    if enrolled_node(cfg) and database_log_format(cfg) != FORMAT_SINGLE_KEY:
        # What a crash left: the epoch keys of the term it ended, a node key never certified.
        node_chain(cfg, keys_directory(cfg.keys_dir)).reconcile()
        term_ended(cfg.state_dir)
    try:
        anyio.run(_node, cfg, lease, build)
    finally:
        node_lock.release()
    return 0


def require_enrolled(cfg: Config) -> None:
    """Refuse, naming ``bide node enroll``, a forward-secure node that is not enrolled (its
    certificate missing, for another node or root, or its current node key gone)."""
    if not enrolled_node(cfg) or database_log_format(cfg) == FORMAT_SINGLE_KEY:
        return  # a format-2 log goes on with its one key
    try:
        node_chain(cfg, keys_directory(cfg.keys_dir))
    except EventLogError as exc:
        raise ConfigError(
            f"{cfg.path}: [log] forward_secure is on (the default) and the log is in "
            f"PostgreSQL, so this node signs its takeovers with its own enrolled key: {exc}. "
            f"(Or set [log] forward_secure = false to sign with one signing.key on every node.)"
        ) from None


def check_profiles_fit(cfg: Config) -> None:
    """Before anything connects: every profile's requests fit in the configured lease (the
    longest a request may take is :attr:`daemon.lease.Lease.longest_request`'s figure)."""
    pg = cfg.postgres
    assert pg is not None
    _check_profiles_fit(cfg, pg.lease_seconds - pg.renew_seconds - pg.request_margin_seconds)


def _check_profiles_fit(cfg: Config, longest: float) -> None:
    """Refuse to start where a profile's requests could never be sent under the lease (the
    supervisor also refuses such a profile on a reload, keeping the last good one)."""
    if cfg.profiles_dir is None or not cfg.profiles_dir.is_dir():
        return  # the supervisor names the missing directory
    good, _ = load_profiles(cfg.profiles_dir)
    problems = too_long_for_lease(good, longest)
    if problems:
        raise ConfigError(
            "; ".join(
                f"{cfg.profiles_dir / name}.toml: {message}"
                for name, message in sorted(problems.items())
            )
        )


async def _node(cfg: Config, lease: Lease, build: Build) -> None:
    await lease.open()
    try:
        async with anyio.create_task_group() as tg:
            door: ApiDoor | None = None
            if cfg.api.enabled:
                # One socket for the node's life: the standby's reads answer on it, then the
                # active node's API, then the standby's again.
                door = ApiDoor(cfg)
                await tg.start(door.serve)
            await _terms(cfg, lease, build, door)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await lease.aclose()


async def _terms(cfg: Config, lease: Lease, build: Build, door: ApiDoor | None) -> None:
    """Standby, active, and back, until a graceful stop."""
    log_store = pgstore.PgLogStore(lease.settings)
    while True:
        reads = None
        if door is not None:
            reads = StandbyReads(
                cfg, lambda: build(cfg, ask_witnesses=False), lease.holder.split("/", 1)[0]
            )
            door.answer_with(reads.handle, reads.count)
        epoch = await _standby(lease, reads, cfg.metrics.listen)
        if epoch is None:
            return  # SIGTERM while standby: nothing held
        if door is not None:
            door.between(f"this node took the log (epoch {epoch}) and is starting")
        store = log_store.writer(lease.term)
        # Witnesses are not asked here: a takeover must not wait on them (heads.jsonl is).
        supervisor = build(cfg, store=store, lease=lease, ask_witnesses=False)
        supervisor.door = door
        fenced: list[BaseException] = []
        failed: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lease.keep)
                await supervisor.run()
                tg.cancel_scope.cancel()
        except* FencedError as group:
            fenced.extend(group.exceptions)
        except* LogIOError as group:  # the database failed under the term (its start, say)
            failed.extend(group.exceptions)
        finally:
            lease.stats.fenced_appends += store.fenced
            store.close()
            lease.forget_head()
            if enrolled_node(cfg):
                term_ended(cfg.state_dir)
        if fenced or failed:
            # Requests cancelled a moment ago may still be at the provider: the lease is not
            # handed over but left to run out, so no other node starts before they end.
            lease.valid_until = float("-inf")
            if any(isinstance(e, DivergedError) for e in fenced):
                logfmt.warn(
                    "this node's copy of the log diverged from the database; back to "
                    "standby to re-sync it (the lease runs out first)",
                    error=fenced[0],
                    epoch=epoch,
                )
            elif fenced:
                lease.stats.fenced += 1
                logfmt.warn(
                    "fenced: another node holds the log; sending nothing more, back to standby",
                    error=fenced[0],
                    epoch=epoch,
                )
            else:
                logfmt.error(
                    "the log's database failed under this node's term; sending "
                    "nothing more, back to standby (the lease runs out first)",
                    error=failed[0],
                    epoch=epoch,
                )
            continue
        await lease.release()
        logfmt.info("lease handed over", node=lease.holder, epoch=epoch)
        return


async def _standby(
    lease: Lease, reads: StandbyReads | None, metrics_listen: str = ""
) -> int | None:
    """The lease's epoch once taken; None on SIGTERM/SIGINT first. Meanwhile ``reads``
    answers the API from the copy the lease keeps. The metrics listener closes before the
    supervisor opens its own on the same address."""
    got: list[int] = []
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # Said once SIGTERM is handled: a stop asked from here on drains, never kills.
        logfmt.info("standby: following the log", node=lease.holder)
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                got.append(await lease.acquire())
                tg.cancel_scope.cancel()

            if reads is not None:
                lease.followed = reads.poke
                tg.start_soon(reads.run)
            if metrics_listen:
                host, _, port = metrics_listen.rpartition(":")
                bound = await tg.start(
                    serve_metrics, host, int(port), lambda: standby_page(lease.metrics_lines())
                )
                logfmt.info("metrics listening", address=f"http://{host}:{bound}/metrics")
            tg.start_soon(take)
            async for _ in signals:
                tg.cancel_scope.cancel()
                break
    lease.followed = lambda: None
    return got[0] if got else None
