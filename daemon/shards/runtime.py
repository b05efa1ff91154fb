"""``bide run`` on a sharded log: one process holding some of the shards, following all.

Theory of operation. A :class:`ShardNode` is one process with one API door, one metrics
listener, the signals and systemd's notify; the engine parts that repeat per shard run
inside it:

    membership  the node's heartbeat row in ``bide_nodes`` (:mod:`daemon.shards.membership`)
    per shard   a term loop as :mod:`daemon.node` runs for an unsharded log, on the shard's
                settings (its schema) with its local copy in ``STATE/shards/NNN/log``:
                standby     follow the shard into the local copy; its reads answer the API
                            (:class:`daemon.standby.StandbyReads`); take the lease only when
                            the plan says so (the shard is free or its lease ran out, and
                            this node is below its fair share)
                active      an engine supervisor built without edges (``edges=False``) under
                            the shard's lease and epoch; every fencing rule holds per shard
                handover    the plan says release: drain as on SIGTERM (final snapshot), hand
                            the lease over at once, back to standby; the taker wakes on the
                            handover's NOTIFY
                fenced      an append or renewal refused: that shard's term ends, its lease
                            is left to run out, the node carries on with its other shards
    planner     every ``renew_seconds`` reads the live nodes and runs
                :func:`daemon.shards.assign.plan` on them and the lease holders of the last
                scan (:mod:`daemon.shards.links`, read after every notification); a
                standby's take asks it again (so a shard handed over is taken within a
                notification, not a tick)
    SIGTERM     no more takes; the node's row is marked leaving (the others count the
                shards as theirs to take), then every active shard drains and releases its
                lease, and the row goes

Connections per node: two pools of at most 3 and one ``LISTEN`` for every shard's lease
and following (:mod:`daemon.shards.links`), one for the catalog, and one writer per shard
held (the log writer's thread owns its connection, as on an unsharded node).

Plug points for the rest of issue 39: ``router(node) -> Handler`` makes the door's handler
(the default, :func:`shard_router`, sends ``/v1/health`` a node summary and every other
request to the shard its operation id names); ``term_tasks`` are started as ``task(k,
handler)`` in each active term's task group; ``supervisor_kwargs`` go to ``build`` for every
shard (a shared ``pacing``, say).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import msgspec
import watchfiles

from daemon import logfmt, systemd
from daemon.api.door import ApiDoor
from daemon.api.server import Handler, Request, Response, error
from daemon.config import Config
from daemon.engine.pacing import SharedPacing
from daemon.errors import ConfigError
from daemon.lease import FOLLOW_SPACING, Lease, now
from daemon.metrics import BUILD_INFO, node_active, read_process, render_process, serve_metrics
from daemon.shards import assign, metricspage
from daemon.shards.links import NodeLinks
from daemon.shards.membership import Membership, View
from daemon.shards.quota import QuotaExchange
from daemon.shards.spool import NodeSpool
from daemon.signing import enrolled_node, node_chain, term_ended
from daemon.spool import Spool, SpoolPermissionError
from daemon.standby import StandbyReads
from daemon.supervisor import RequestGate, Supervisor
from eventlog import pgstore
from eventlog.errors import DamagedLogError, DivergedError, FencedError, LogIOError, StoreError
from eventlog.keys import keys_directory
from eventlog.logstore import Term
from eventlog.store import LineStore
from replay.events import LogEvent, StatusRequestIntended
from replay.ledger import Ledger
from replay.state import Operation

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout


class ShardBuild(Protocol):
    """``daemon.commands.run.build_supervisor``: the supervisor of one shard's term (or of
    its standby reads)."""

    def __call__(
        self,
        cfg: Config,
        *,
        store: LineStore | None = None,
        lease: RequestGate | None = None,
        ask_witnesses: bool = True,
        edges: bool = True,
        **extra: Any,
    ) -> Supervisor: ...


Router = Callable[["ShardNode"], Handler]
#: A node joins (is counted in the fair share) once its copies caught up, or after this many
#: lease lengths at most.
JOIN_WAIT_LEASES = 10
#: A spool file for a shard held elsewhere waits this many lease lengths for this node to
#: take the shard, then is rejected with the way to send it (:mod:`daemon.shards.spool`).
SPOOL_GRACE_LEASES = 2
#: How old the live nodes may be when a standby finds its shard free and not in its plan.
NODES_FRESH = 0.05
TermTask = Callable[[int, Handler], Coroutine[Any, Any, None]]


def node_name(cfg: Config) -> str:
    """The node's name in ``bide_nodes`` and its leases' holder: ``[postgres] node`` or the
    host name, as :class:`daemon.lease.Lease` cleans it."""
    assert cfg.postgres is not None
    return re.sub(r"[^A-Za-z0-9._-]", "_", cfg.postgres.node or socket.gethostname())[:64]


class ShardConfig(Config):
    """One shard's config: the node's, its state (local copy of the log, snapshot, outbox)
    in ``STATE/shards/NNN``, its spool the node's (one spool per node, each file handed to
    its shard: :mod:`daemon.shards.spool`)."""

    def __init__(self, node: Config, shard: int) -> None:
        self.__dict__.update(node.__dict__)
        self.state_dir = node.state_dir / "shards" / f"{shard:03d}"
        self._node_spool = node.spool_dir

    @property
    def spool_dir(self) -> Path:
        return self._node_spool


def shard_config(cfg: Config, shard: int) -> Config:
    """The config one shard's engine runs with (:class:`ShardConfig`)."""
    return ShardConfig(cfg, shard)


@dataclass
class ShardLease(Lease):
    """A shard's lease, taken only when the node's plan says so: ``claim()`` before each try
    (True: try now), ``settle(took)`` after it."""

    claim: Callable[[], Awaitable[bool]] = field(default=lambda: _yes())
    settle: Callable[[bool], None] = field(default=lambda took: None)

    async def acquire(self) -> int:
        """:meth:`Lease.acquire`, asking the plan before each try."""
        async with self.link.news(_cannot_listen) as news:
            while True:
                try:
                    await self.follow()
                    self.followed()
                    if await self.claim():
                        epoch = await self._try_take()
                        if epoch is not None:
                            return epoch
                except (StoreError, DamagedLogError, OSError) as exc:
                    logfmt.warn("standby cannot follow the shard; retrying", error=exc)
                    await anyio.sleep(self.poll)
                    continue
                await news(self.poll)
                await anyio.sleep(FOLLOW_SPACING)

    async def _try_take(self) -> int | None:
        """One try at the lease. The take is shielded and a term taken then cancelled (the
        node stopping meanwhile) is handed back at once: a cancelled try never leaves a
        lease held for nobody until it runs out."""
        took = False
        try:
            sent = now()
            term: Term | None = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.lease_seconds):
                term = await self._timed(self.link.take_lease(self.holder, self.lease_seconds))
            if term is None:
                return None
            self.epoch, self._term = term.epoch, term
            self._extended(sent + self.lease_seconds)
            self.stats.takeovers += 1
            try:
                took = await self._caught_up()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.release()
                raise
            return term.epoch if took else None
        finally:
            self.settle(took)


class _FirstPoll:
    """Logs a shard's first poll after it was taken (its first status request's intent): the
    end of a shard move as the provider sees it."""

    def __init__(self, shard: int, taken: float) -> None:
        self.shard = shard
        self.taken = taken
        self.armed = False  # set once the term is up: replayed events are not new polls

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        pass

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        if self.armed and isinstance(ev, StatusRequestIntended):
            self.armed = False
            logfmt.info(
                "shard first poll",
                shard=self.shard,
                after_take_seconds=f"{time.monotonic() - self.taken:.3f}",
            )

    def batch_done(self) -> None:
        pass


def _described(exc: BaseException) -> str:
    """An error for the log: each error an exception group holds, by type and message."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_described(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


async def _yes() -> bool:
    return True


def _cannot_listen(why: str) -> None:
    logfmt.warn("cannot listen for new records; following by polling", error=why)


async def _unavailable(request: Request) -> Response:
    return error(
        503,
        "shard_starting",
        "this node is still opening that shard; ask again in a moment",
        headers=[("Retry-After", "1")],
    )


class _Health(msgspec.Struct, frozen=True):
    status: str
    role: str
    node: str
    shards: int
    held: list[int]
    live_nodes: list[str]


def shard_router(node: ShardNode) -> Handler:
    """The default door: ``/v1/health`` answers for the node; a request naming an operation
    (``/v1/operations/{id}...``, or a registration's ``operation_id``) goes to that shard's
    handler; anything else is refused (503) until a router that merges over shards is
    plugged in (issue 39, E)."""

    async def handle(request: Request) -> Response:
        path = request.path
        if path == "/v1/health" and request.method == "GET":
            view = node.view
            body = _Health(
                status="ok",
                role="shards",
                node=node.name,
                shards=node.layout.count,
                held=sorted(node.held()),
                live_nodes=sorted(view.nodes) if view is not None else [],
            )
            return Response(200, msgspec.json.encode(body))
        op_id = _operation_of(request)
        if op_id is None:
            return error(
                503,
                "not_routed",
                "this sharded node answers only requests that name an operation",
                headers=[("Retry-After", "5")],
            )
        return await node.handler(node.layout.shard_of(op_id))(request)

    return handle


def _operation_of(request: Request) -> str | None:
    prefix = "/v1/operations/"
    if request.path.startswith(prefix):
        return request.path[len(prefix) :].split("/", 1)[0] or None
    if request.path == "/v1/operations" and request.method == "POST":
        try:
            body = msgspec.json.decode(request.body)
        except msgspec.DecodeError:
            return None
        got = body.get("operation_id") if isinstance(body, dict) else None
        return got if isinstance(got, str) and got else None
    return None


class ShardNode:
    """One process holding its fair share of a sharded log (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        build: ShardBuild,
        *,
        layout: Layout,
        settings: PgSettings,
        router: Router | None = None,
        term_tasks: Iterable[TermTask] = (),
        supervisor_kwargs: Mapping[str, Any] | None = None,
        node_tasks: Iterable[Callable[[], Coroutine[Any, Any, None]]] = (),
        metrics_sources: Iterable[Callable[[], list[str]]] = (),
    ) -> None:
        assert cfg.postgres is not None
        self.config = cfg
        self.build = build
        self.layout = layout
        self.settings = settings
        self.name = node_name(cfg)
        #: Every shard's lease is held under this one string: a restarted node (another
        #: pid) is another holder, and waits out the leases its previous process held.
        self.holder = f"{self.name}/{os.getpid()}/{secrets.token_hex(3)}"
        self.router = router or shard_router
        self.term_tasks = tuple(term_tasks)
        self.supervisor_kwargs = dict(supervisor_kwargs or {})
        #: Run in the node's task group for its life (the quota exchange); cancelled once
        #: every shard is handed over.
        self.node_tasks = tuple(node_tasks)
        #: More lines for the node's ``/metrics`` (the quota slices).
        self.metrics_sources = tuple(metrics_sources)
        pg = cfg.postgres
        self.membership = Membership(
            settings,
            layout,
            self.name,
            lease_seconds=pg.lease_seconds,
            renew_seconds=pg.renew_seconds,
        )
        self.links = NodeLinks(settings, layout, poll=pg.standby_poll_seconds)
        self.spool = NodeSpool(
            Spool(cfg.spool_dir),
            layout.shard_of,
            self.supervisors,
            grace=SPOOL_GRACE_LEASES * pg.lease_seconds,
            holder_of=self._holder_of,
        )
        self.view: View | None = None
        self._view_at = float("-inf")
        #: How often a claim reads the live nodes again (the holders are the links' scan).
        self._nodes_every = pg.renew_seconds
        self._plan_lock = anyio.Lock()
        self._claimed: set[int] = set()  # takes in flight (a claim granted, not yet settled)
        self._handlers: dict[int, Handler] = {}
        self._reads: dict[int, StandbyReads] = {}  # each followed shard's copy, read
        self._active: dict[int, Supervisor] = {}
        self._release: dict[int, anyio.Event] = {}
        self._copied: set[int] = set()  # shards whose copy has caught up once
        self._copies_ready = anyio.Event()  # every shard's has
        self._stopping = anyio.Event()  # take nothing more
        self._leave = anyio.Event()  # hand everything over (once marked leaving)

    # -- what the others plug into ---------------------------------------------------------

    def handler(self, shard: int) -> Handler:
        """The API's answers for ``shard``: the active supervisor's while this node holds
        it, the shard's standby reads otherwise (503 while neither is up)."""
        return self._handlers.get(shard, _unavailable)

    def held(self) -> set[int]:
        """The shards this node is active on now."""
        return set(self._active)

    async def folded(self, shard: int, seq: int) -> None:
        """Return once this node's answers for ``shard`` show record ``seq``: at once while
        it holds the shard (its engine replayed the log before answering), else once its
        copy has folded ``seq`` (or stopped being read: the node took the shard or stops)."""
        reads = self._reads.get(shard)
        if shard in self._active or reads is None:
            return
        await reads.folded(seq)

    async def caught_up(self, shard: int) -> None:
        """Return once this node's answers for ``shard`` show the shard's head in the
        database as of the links' last scan (at once while it holds the shard)."""
        await self.folded(shard, self.links.head_seen(shard))

    def _holder_of(self, shard: int) -> str | None:
        """The node holding ``shard``'s unexpired lease, as of the links' last scan."""
        holder = (self.links.holders or {}).get(shard)
        return self._owner(holder) if holder else None

    def supervisors(self) -> dict[int, Supervisor]:
        """Each active shard's engine supervisor."""
        return dict(self._active)

    # -- the plan ------------------------------------------------------------------------------

    def _owner(self, holder: str) -> str:
        """The node a lease's holder string names; a previous process of this node is not
        this node (its leases run out before they are ours)."""
        if holder == self.holder:
            return self.name
        name = holder.split("/", 1)[0]
        return holder if name == self.name else name

    async def _refresh(self) -> View | None:
        """The facts to plan on: the live nodes (read now) and the lease holders as of the
        links' last scan (fresh after every notification: a shard handed over is seen free
        as soon as its standby is woken). None before the first scan."""
        nodes = await self.membership.nodes()
        self._view_at = time.monotonic()
        holders = self.links.holders
        self.view = None if holders is None else View(nodes=nodes, holders=dict(holders))
        return self.view

    def _plan(self, view: View) -> assign.Plan:
        nodes = dict(view.nodes)
        if self._stopping.is_set():
            nodes[self.name] = True
        holders = {k: self._owner(h) for k, h in view.holders.items()}
        for k in self._active:
            holders[k] = self.name
        for k in self._claimed:
            holders.setdefault(k, self.name)
        return assign.plan(self.layout.count, nodes, holders, self.name)

    async def _claim(self, shard: int) -> bool:
        """May this node try to take ``shard`` now? Asked by the shard's standby before each
        try, on the holders of the links' last scan and the live nodes read at most
        ``renew_seconds`` ago; a yes is counted as held until settled, so two shards'
        standbys never both take the last place in the share."""
        if self._stopping.is_set():
            return False
        async with self._plan_lock:
            try:
                view = self.view
                if view is None or time.monotonic() - self._view_at > self._nodes_every:
                    view = await self._refresh()
                elif self.links.holders is not None:
                    view = View(nodes=view.nodes, holders=dict(self.links.holders))
            except StoreError as exc:
                logfmt.warn("cannot read the node catalog; taking nothing", error=exc)
                return False
            if view is None or self.name not in view.nodes:
                return False  # no scan yet, or not (yet) counted by the others
            take = self._plan(view).take
            if (
                shard not in take
                and shard not in view.holders
                and time.monotonic() - self._view_at > NODES_FRESH
            ):
                # Free but not ours by the nodes last read: a node leaving (its row marked
                # a moment ago) hands shards over; read the nodes again before waiting on.
                try:
                    view = await self._refresh()
                except StoreError:
                    return False
                if view is None or self.name not in view.nodes:
                    return False
                take = self._plan(view).take
            if shard in take:
                self._claimed.add(shard)
                return True
            return False

    def _settle(self, shard: int, took: bool) -> None:
        self._claimed.discard(shard)
        if took:
            self.view = None  # the next claim reads the facts again

    async def _planner(self) -> None:
        """Every ``renew_seconds``: hand over what the plan says to (the takes are the
        standbys', through :meth:`_claim`)."""
        assert self.config.postgres is not None
        every = self.config.postgres.renew_seconds
        while True:
            try:
                async with self._plan_lock:
                    view = await self._refresh()
                    # Stopping: the node hands everything over itself, once marked leaving.
                    counted = (
                        view is not None and self.name in view.nodes and not self._stopping.is_set()
                    )
                    release = self._plan(view).release if view is not None and counted else set()
                for k in sorted(release):
                    event = self._release.get(k)
                    if event is not None and not event.is_set():
                        logfmt.info("shard handover", shard=k, node=self.name)
                        event.set()
            except StoreError as exc:
                logfmt.warn("cannot read the node catalog; holding what is held", error=exc)
            await anyio.sleep(every)

    # -- one shard ------------------------------------------------------------------------

    async def _shard(self, shard: int) -> None:
        """Standby, active, and back, for one shard, until the node stops."""
        pg = self.config.postgres
        assert pg is not None
        scfg = shard_config(self.config, shard)
        scfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lease = ShardLease(
            self.layout.settings(self.settings, shard),
            scfg.log_dir,
            lease_seconds=pg.lease_seconds,
            renew_seconds=pg.renew_seconds,
            margin=pg.request_margin_seconds,
            node=self.name,
            poll=pg.standby_poll_seconds,
            following=self.links.link(shard),
            claim=partial(self._claim, shard),
            settle=partial(self._settle, shard),
        )
        lease.holder = self.holder
        await lease.open()
        try:
            log_store = pgstore.PgLogStore(lease.settings)
            while not self._stopping.is_set():
                reads = StandbyReads(
                    scfg,
                    lambda: self.build(
                        scfg,
                        ask_witnesses=False,
                        log_settings=lease.settings,
                        node_config=self.config,
                    ),
                    self.name,
                )
                self._handlers[shard] = reads.handle
                self._reads[shard] = reads
                try:
                    epoch = await self._standby(shard, lease, reads)
                finally:
                    if self._reads.get(shard) is reads:
                        del self._reads[shard]
                    reads.end()
                if epoch is None:
                    return
                try:
                    await self._term(shard, scfg, lease, log_store, epoch)
                except Exception as exc:  # the barrier: one shard's failure never ends the node
                    # Requests may still be at the provider: the lease runs out, not handed over.
                    lease.valid_until = float("-inf")
                    logfmt.error(
                        "shard term failed; back to standby for this shard (its lease runs out)",
                        shard=shard,
                        epoch=epoch,
                        node=self.name,
                        error=_described(exc),
                    )
                    await anyio.sleep(pg.standby_poll_seconds)
        finally:
            self._handlers.pop(shard, None)
            with anyio.CancelScope(shield=True):
                await lease.aclose()

    async def _standby(self, shard: int, lease: ShardLease, reads: StandbyReads) -> int | None:
        """The shard's epoch once taken; None once the node stops first."""
        got: list[int] = []

        def followed() -> None:
            reads.poke()
            self._copy_caught_up(shard)

        async with anyio.create_task_group() as tg:

            async def take() -> None:
                got.append(await lease.acquire())
                tg.cancel_scope.cancel()

            async def stop() -> None:
                await self._stopping.wait()
                tg.cancel_scope.cancel()

            lease.followed = followed
            tg.start_soon(reads.run)
            tg.start_soon(take)
            tg.start_soon(stop)
        lease.followed = lambda: None
        if got and self._stopping.is_set():
            await lease.release()  # taken as the node began to stop: nothing sent under it
            return None
        return got[0] if got else None

    async def _term(
        self,
        shard: int,
        scfg: Config,
        lease: ShardLease,
        log_store: pgstore.PgLogStore,
        epoch: int,
    ) -> None:
        """One active term on ``shard``: until a handover, the node's stop, or fencing."""
        taken = time.monotonic()
        self._handlers[shard] = _unavailable
        store = log_store.writer(lease.term)
        supervisor = self.build(
            scfg,
            store=store,
            lease=lease,
            ask_witnesses=False,
            edges=False,
            log_settings=lease.settings,
            node_config=self.config,
            **self.supervisor_kwargs,
        )
        first_poll = _FirstPoll(shard, taken)
        supervisor.chain.follow(first_poll)
        release = self._release[shard] = anyio.Event()
        fenced: list[BaseException] = []
        failed: list[BaseException] = []
        try:
            async with anyio.create_task_group() as tg:

                async def body(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                    await supervisor.run(task_status=task_status)
                    tg.cancel_scope.cancel()

                async def handover() -> None:
                    """Drain as on SIGTERM once the plan hands the shard over or the node
                    stops (a cancelled term never gets here)."""
                    async with anyio.create_task_group() as either:

                        async def on(event: anyio.Event) -> None:
                            await event.wait()
                            either.cancel_scope.cancel()

                        either.start_soon(on, release)
                        either.start_soon(on, self._leave)
                    supervisor.request_stop()

                tg.start_soon(lease.keep)
                await tg.start(body)
                handle, _count = supervisor.api_handler()
                self._active[shard] = supervisor
                self._handlers[shard] = handle
                first_poll.armed = True
                logfmt.info(
                    "shard taken",
                    shard=shard,
                    epoch=epoch,
                    node=self.name,
                    ready_seconds=f"{time.monotonic() - taken:.3f}",
                )
                for task in self.term_tasks:
                    tg.start_soon(task, shard, handle)
                tg.start_soon(handover)
        except* FencedError as group:
            fenced.extend(group.exceptions)
        except* LogIOError as group:
            failed.extend(group.exceptions)
        finally:
            self._active.pop(shard, None)
            self._release.pop(shard, None)
            self._handlers[shard] = _unavailable
            lease.stats.fenced_appends += store.fenced
            store.close()
            lease.forget_head()
            if enrolled_node(self.config):
                term_ended(scfg.state_dir)  # the shard's epoch keys go with its term
        held = f"{time.monotonic() - taken:.3f}"
        if fenced or failed:
            # Requests cancelled a moment ago may still be at the provider: the lease runs
            # out rather than being handed over (as daemon.node does for the whole log).
            lease.valid_until = float("-inf")
            if fenced and not any(isinstance(e, DivergedError) for e in fenced):
                lease.stats.fenced += 1
            logfmt.warn(
                "shard fenced" if fenced else "shard failed",
                shard=shard,
                epoch=epoch,
                node=self.name,
                error=(fenced or failed)[0],
                held_seconds=held,
            )
            return
        with anyio.CancelScope(shield=True):
            await lease.release()
        logfmt.info(
            "shard released",
            shard=shard,
            epoch=epoch,
            node=self.name,
            why="stopping" if self._stopping.is_set() else "handover",
            held_seconds=held,
        )

    # -- the node's edges -----------------------------------------------------------------

    def render_metrics(self) -> str:
        pages = {k: sup.render_metrics() for k, sup in self.supervisors().items()}
        node = [
            *BUILD_INFO,
            *render_process(read_process()),
            *node_active(True),
            "# HELP bide_node_shards_held The shards this node is active on.",
            "# TYPE bide_node_shards_held gauge",
            f"bide_node_shards_held {len(pages)}",
            "# HELP bide_node_shards The log's shard count.",
            "# TYPE bide_node_shards gauge",
            f"bide_node_shards {self.layout.count}",
        ]
        for source in self.metrics_sources:
            node += source()
        return metricspage.merge(pages, node)

    def status_line(self) -> str:
        held = self.held()
        sups = self.supervisors().values()
        live = sum(1 for sup in sups for op in sup.ops.values() if op.phase == "live")
        return f"{len(held)} of {self.layout.count} shards held, {live} live"

    def reload_profiles(self) -> None:
        for sup in self.supervisors().values():
            sup.load_profiles()

    async def _signals(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            task_status.started()
            async for signum in sigs:
                if signum == signal.SIGHUP:
                    logfmt.info("SIGHUP: reloading profiles")
                    self.reload_profiles()
                    continue
                logfmt.info("stopping", signal=signal.Signals(signum).name, node=self.name)
                self.request_stop()
                return

    def request_stop(self) -> None:
        """Leave gracefully: hand every shard over (drained, snapshot) and leave."""
        self._stopping.set()
        self.membership.leaving = True

    async def _watch_profiles(self) -> None:
        assert self.config.profiles_dir is not None
        async for _ in watchfiles.awatch(
            self.config.profiles_dir, stop_event=self._stopping, debounce=200, rust_timeout=1000
        ):
            self.reload_profiles()

    def _copy_caught_up(self, shard: int) -> None:
        if shard not in self._copied:
            self._copied.add(shard)
            if len(self._copied) == self.layout.count:
                self._copies_ready.set()

    async def _join(self) -> None:
        """Be counted in the fair share once every shard's copy has caught up with the
        database, then beat until cancelled. A shard handed to a node still copying its log
        waits for the copy (seconds on a large log, the shard polled by nobody); handed to a
        node whose copy is current it waits for a replay of the tail. A node that finds no
        other node counted joins at once: there is nobody to wait for, and each shard is
        taken as its own copy catches up. Joining waits at most ``JOIN_WAIT_LEASES`` lease
        lengths (a shard that cannot be copied must not keep the node out); meanwhile the
        row, marked joining, is kept alive (it holds the node's name)."""
        pg = self.config.postgres
        assert pg is not None
        started = time.monotonic()
        with anyio.move_on_after(JOIN_WAIT_LEASES * pg.lease_seconds) as waited:
            while not self._copies_ready.is_set():
                try:
                    await self.membership.beat(0)
                    nodes = await self.membership.nodes()
                except StoreError as exc:
                    logfmt.warn("node heartbeat failed; retrying", error=exc)
                else:
                    if all(out for n, out in nodes.items() if n != self.name):
                        break  # nobody else counted: nobody to wait for
                with anyio.move_on_after(self.membership.renew_seconds):
                    await self._copies_ready.wait()
        copied = len(self._copied)
        if waited.cancelled_caught:
            logfmt.warn(
                "joining before every shard's copy caught up",
                copied=copied,
                shards=self.layout.count,
            )
        self.membership.joining = False
        while True:
            try:
                await self.membership.beat(len(self._active))
                break
            except StoreError as exc:
                logfmt.warn("node heartbeat failed; retrying", error=exc)
                await anyio.sleep(self.membership.renew_seconds)
        self.view = None  # the next claim reads the nodes again: this node is counted now
        self.links.wake_all()
        logfmt.info(
            "node joined",
            node=self.name,
            shards=self.layout.count,
            copied=copied,
            copy_seconds=f"{time.monotonic() - started:.3f}",
        )
        await self.membership.keep(lambda: len(self._active))

    async def _named(self) -> bool:
        """:meth:`_wait_for_name`, or False on SIGTERM/SIGINT first (nothing held yet)."""
        named: list[bool] = []
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:

                async def stop() -> None:
                    async for signum in signals:
                        logfmt.info("stopping before joining", signal=signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return

                tg.start_soon(stop)
                await self._wait_for_name()
                named.append(True)
                tg.cancel_scope.cancel()
        return bool(named)

    async def _wait_for_name(self) -> None:
        """Join only under a name no live row holds: a node restarted after a crash waits out
        its previous process's heartbeat (its leases run out meanwhile anyway), and a second
        process given the same name waits instead of taking a second share."""
        warned = False
        while True:
            try:
                live = await self.membership.nodes()
            except StoreError as exc:
                logfmt.warn("cannot read the node catalog; retrying", error=exc)
                await anyio.sleep(self.membership.renew_seconds)
                continue
            if self.name not in live:
                return
            if not warned:
                logfmt.warn(
                    "a node of this name is live (this node's previous process, killed, or "
                    "another process given the same [postgres] node); waiting for its "
                    "heartbeat to run out",
                    node=self.name,
                )
                warned = True
            await anyio.sleep(self.membership.renew_seconds)

    async def run(self) -> None:
        """The node, until SIGTERM/SIGINT and every shard handed over."""
        cfg = self.config
        pg = cfg.postgres
        assert pg is not None
        if not await self._named():
            self.membership.close()
            return
        # The name claimed at once; counted by the others once the copies caught up (_join).
        self.membership.joining = True
        await self.membership.beat(0)
        logfmt.info("node starting: copying the shards", node=self.name, shards=self.layout.count)
        try:
            self.spool.spool.create(cfg.spool.agents_group, cfg.spool.approvers_group)
        except SpoolPermissionError as exc:
            self.membership.close()
            raise ConfigError(str(exc)) from None
        await self.links.open()
        try:
            async with anyio.create_task_group() as edges:
                await edges.start(self._signals)
                if cfg.api.enabled:
                    door = ApiDoor(cfg)
                    door.answer_with(self.router(self))
                    await edges.start(door.serve)
                if cfg.metrics.listen:
                    host, _, port = cfg.metrics.listen.rpartition(":")
                    bound = await edges.start(serve_metrics, host, int(port), self.render_metrics)
                    logfmt.info("metrics listening", address=f"http://{host}:{bound}/metrics")
                if cfg.profiles_dir is not None:
                    edges.start_soon(self._watch_profiles)
                edges.start_soon(self.spool.watch, self._stopping)
                edges.start_soon(self.links.news)
                for task in self.node_tasks:
                    edges.start_soon(task)
                edges.start_soon(self._join)
                edges.start_soon(self._planner)
                edges.start_soon(systemd.report_status, self.status_line)
                async with anyio.create_task_group() as shards:
                    for k in range(self.layout.count):
                        shards.start_soon(self._shard, k)
                    systemd.notify("READY=1", f"STATUS={self.status_line()}")
                    await self._stopping.wait()
                    systemd.notify("STOPPING=1", f"STATUS=stopping: {self.status_line()}")
                    # Marked leaving before the first handover, so the others count the
                    # shards as theirs to take the moment each is released.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(pg.lease_seconds):
                        try:
                            await self.membership.beat(len(self._active))
                        except StoreError as exc:
                            logfmt.warn("could not mark this node leaving", error=exc)
                    self._leave.set()
                # Every shard drained and handed over: leave.
                await self.membership.leave()
                logfmt.info("node left", node=self.name)
                edges.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.links.aclose()
            self.membership.close()


def run_shard_node(
    cfg: Config,
    build: ShardBuild,
    layout: Layout,
    *,
    router: Router | None = None,
    term_tasks: Iterable[TermTask] = (),
    supervisor_kwargs: Mapping[str, Any] | None = None,
) -> int:
    """``bide run`` on a sharded layout."""
    from daemon.node import _check_profiles_fit, require_enrolled
    from daemon.pgconfig import config_settings
    from daemon.shards.doors import node_doors
    from eventlog.lock import WriterLock

    settings = config_settings(cfg)
    assert settings is not None
    assert cfg.postgres is not None
    require_enrolled(cfg)
    pg = cfg.postgres
    _check_profiles_fit(cfg, pg.lease_seconds - pg.renew_seconds - pg.request_margin_seconds)
    for k in range(layout.count):  # every shard's schema one this version knows
        with pgstore.PgLogStore(layout.settings(settings, k)) as log_store:
            log_store.require()
    cfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    node_lock = WriterLock(cfg.state_dir)
    node_lock.acquire()
    if enrolled_node(cfg):
        # What a crash left: a node key never certified, the epoch keys of the terms it ended.
        node_chain(cfg, keys_directory(cfg.keys_dir)).reconcile()
        for k in range(layout.count):
            term_ended(shard_config(cfg, k).state_dir)
    # One pacing for every shard's engine, kept within this node's slice of each provider's
    # quota, agreed with the other nodes through the catalog (daemon.shards.quota).
    shared = SharedPacing(sliced=True)
    exchange = QuotaExchange(
        settings, node_name(cfg), shared, period=pg.renew_seconds, ttl=pg.lease_seconds
    )
    # The node's doors (daemon.shards.doors): the router on its socket, and the relay that
    # carries a write for a shard held elsewhere to its holder through the catalog.
    doors = node_doors(cfg, settings, layout, node_name(cfg))
    try:
        node = ShardNode(
            cfg,
            build,
            layout=layout,
            settings=settings,
            router=router or doors.router,
            term_tasks=[doors.relay.serve, *term_tasks],
            supervisor_kwargs={"pacing": shared, **(supervisor_kwargs or {})},
            node_tasks=[exchange.run, doors.relay.run],
            metrics_sources=[exchange.metrics_lines],
        )
        anyio.run(node.run)
    finally:
        node_lock.release()
    return 0


__all__ = [
    "Router",
    "ShardBuild",
    "ShardLease",
    "ShardNode",
    "TermTask",
    "node_name",
    "run_shard_node",
    "shard_config",
    "shard_router",
]
