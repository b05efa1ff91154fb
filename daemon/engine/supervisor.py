"""The engine's supervisor: composition and lifecycle, nothing else.

One job: build the engine's parts and run them in one task group, from start to a clean stop
(S9, S11, S13, S30-S33). What each part does is in its module; the map is
``daemon/ARCHITECTURE.md``.

* Start: open the chain (its lock refuses a second daemon; replayed from the state snapshot
  when it still matches the log, plus the events after it), record an unknown outcome for
  each intent whose outcome never made it to the log (the request counted, S11/S13), recover
  the actions in flight, then schedule one wake-up per live operation and scan the spool.
* Run: the poller's timer loop, the wall-clock watch, the spool and profile watches, the
  metrics listener, the API (an edge attached by :mod:`daemon.supervisor`), the systemd
  status and watchdog.
* SIGTERM/SIGINT: stop starting requests, give those in flight ``drain_seconds`` to finish,
  record the rest as unknown outcomes, write a final snapshot and checkpoint, exit 0. SIGHUP
  or a change in the profiles directory reloads profiles; an invalid profile keeps the last
  good one.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import random
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import watchfiles

from daemon import logfmt, systemd
from daemon.actions import ActionPorts, ActionRunner
from daemon.config import Config
from daemon.engine.chain import RETIRE_BATCH, Chain, RequestGate
from daemon.engine.followers import LiveCounts, Observed, Stories, Waiters
from daemon.engine.intake import Intake
from daemon.engine.pacing import SharedPacing
from daemon.engine.poller import Poller
from daemon.engine.spooling import SpoolDoor
from daemon.errors import ConfigError
from daemon.faults import FaultInjection
from daemon.history import Histories
from daemon.metrics import Metrics, Scrape, serve_metrics, spool_backlog
from daemon.spool import Spool, SpoolPermissionError
from daemon.witness.publisher import HeadPublisher
from eventlog.epochs import EpochSigning
from eventlog.heads import HeadStore
from eventlog.keys import KeyRing, Signer
from eventlog.position import LogPosition
from eventlog.store import LineStore
from replay.retention import Tombstone
from replay.state import Operation

DRAIN_SECONDS = 5.0
#: Jitter only has to decorrelate daemons and operations, not resist prediction: a PRNG seeded
#: from the OS once, instead of a getrandom(2) system call for every draw.
_JITTER = random.Random(os.urandom(32))


class Supervisor:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        signer: Signer | None,
        *,
        signing: EpochSigning | None = None,
        heads: HeadStore | None = None,
        publisher: HeadPublisher | None = None,
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = _JITTER.random,
        drain_seconds: float | None = None,
        store: LineStore | None = None,
        lease: RequestGate | None = None,
        pacing: SharedPacing | None = None,
        edges: bool = True,
    ) -> None:
        # Signs the log: forward-secure epoch keys (eventlog.epochs), or format 2's one key.
        signs: EpochSigning | Signer
        if signing is not None:
            signs = signing
        elif signer is not None:
            signs = signer
        else:
            raise ValueError("the supervisor needs a signing key or epoch signing")
        self.config = config
        self.clock = clock
        #: False for one shard of a sharded node (daemon.shards.runtime): no spool watch or
        #: scan, API, metrics listener, signal handlers, profile watch, systemd notify or
        #: status loop of its own; the node owns those. Timers, retention and the chain run.
        self.edges = edges
        self.publisher = publisher  # sends every signed head to the configured witnesses
        self.drain_seconds = config.daemon.drain_seconds if drain_seconds is None else drain_seconds
        self.metrics = Metrics()
        if heads is not None:  # the age of the last signed checkpoint, for the metrics
            heads.add_listener(self.metrics.checkpoint_signed)
            if (latest := heads.latest()) is not None:
                self.metrics.checkpoint_signed(latest)
        self.faults = FaultInjection.from_environment()
        self.spool = Spool(config.spool_dir)
        self.metrics_url: str | None = None
        self.api_socket: str | None = None
        self._main_scope: anyio.CancelScope | None = None
        self.polls: anyio.abc.TaskGroup | None = None

        # The chain, and the projections that follow it (in this order for each event).
        self.chain = chain = Chain(
            config,
            keyring,
            signs,
            metrics=self.metrics,
            clock=clock,
            draw=draw,
            heads=heads,
            store=store,
            lease=lease,
        )
        chain.status_line = lambda alarm: self.status_line(alarm=alarm)
        self.stopping = chain.stopping
        self.live = LiveCounts()
        self.histories = Histories(config.api.closed_stories, config.api.story_events_kept)
        self.waiters = Waiters()
        chain.follow(self.live)
        chain.follow(Stories(self.histories, lambda: chain.ledger))
        chain.follow(self.waiters)
        chain.follow(Observed(config, self.metrics, lambda: chain.ledger))

        # ``pacing``: the quotas shared by every engine of a sharded node (None: its own).
        self.poller = poller = Poller(
            config, chain, self.waiters, self.metrics, faults=self.faults, pacing=pacing
        )
        self.runner = ActionRunner(
            ActionPorts(
                record=chain.record,
                clock=lambda: self.clock(),
                spawn=self._spawn,
                schedule=poller.schedule,
                provider_turn=poller.provider_turn,
                profile=poller.profiles.get,
                client=poller.clients.get,
                operation=lambda op_id: chain.ops.get(op_id),
                operations=lambda: chain.ops.values(),
                retired=chain.retired,
                spool=self.spool,
                state_dir=config.state_dir,
                outbox_dir=config.outbox_dir,
                faults=self.faults,
                count_internal_error=self._count_internal_error,
                lease_room=chain.lease_room,
                send_gate=chain.send_gate,
                fetch_limits=config.fetch,
            )
        )
        self.intake = Intake(
            config, chain, self.waiters, poller, self.runner, lambda: poller.profiles
        )
        self.spool_door = SpoolDoor(
            config,
            self.spool,
            self.intake,
            self.metrics,
            faults=self.faults,
            busy=poller.busy,
            clock=clock,
        )

    # -- what the API and the demo read --------------------------------------------------------

    @property
    def ops(self) -> dict[str, Operation]:
        return self.chain.ops

    @property
    def keyring(self) -> KeyRing:
        return self.chain.keyring

    @property
    def lease(self) -> RequestGate | None:
        return self.chain.lease

    @property
    def position(self) -> LogPosition | None:
        """The log's head (None before it is open, or while it is empty)."""
        return self.chain.position

    @property
    def live_by_owner(self) -> collections.Counter[int | None]:
        return self.live.by_owner

    def retired(self, op_id: str) -> Tombstone | None:
        return self.chain.retired(op_id)

    async def next_event_of(self, op_id: str) -> None:
        await self.waiters.next_event_of(op_id)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        await self.waiters.wait_until(predicate)

    def load_profiles(self) -> None:
        self.poller.load_profiles()

    def _spawn(self, task: Callable[[str], Coroutine[Any, Any, None]], arg: str) -> None:
        assert self.polls is not None
        self.polls.start_soon(task, arg)

    def spawn_task(self, task: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``task`` in the daemon's task group (it outlives the request that started it)."""
        assert self.polls is not None
        self.polls.start_soon(task)

    def _count_internal_error(self) -> None:
        self.metrics.internal_errors += 1

    # -- status --------------------------------------------------------------------------------

    def render_metrics(self) -> str:
        publisher = self.publisher
        scrape = Scrape(
            now=self.clock(),
            active=self.lease is None or self.lease.health()[2] > 0,
            checkpoint_interval=self.config.log.checkpoint_interval_seconds,
            spool_waiting={
                "incoming": spool_backlog(self.spool.incoming),
                "decisions": spool_backlog(self.spool.decisions),
            },
            witness_targets=len(publisher.targets) if publisher is not None else 0,
            witness_failing=publisher.failing if publisher is not None else 0,
        )
        text = self.metrics.render(self.ops, self.config.log_dir, self.chain.flushes, scrape)
        if self.lease is not None:
            text = text.rstrip("\n") + "\n" + "\n".join(self.lease.metrics_lines()) + "\n"
        return text

    def status_line(self, *, alarm: bool = False) -> str:
        live = sum(1 for op in self.ops.values() if op.phase == "live")
        escalated = sum(1 for op in self.ops.values() if op.phase == "escalated")
        failing = alarm or self.metrics.log_alarm
        alarm_text = "; ALARM: LOG APPEND FAILING" if failing else ""
        return (
            f"{live} live, {escalated} escalated, {self.metrics.requests_sent} requests "
            f"sent{alarm_text}"
        )

    async def _retire_ended(self) -> None:
        """Every ``[retention] check_seconds``: record the retirements due (a full batch is
        followed at once by the next, so a backlog, after an upgrade, drains in minutes)."""
        every = self.config.retention.check_seconds
        while not self.stopping.is_set():
            retired = await self.chain.retire_due()  # waits while the log cannot take it
            if retired:
                logfmt.info("ended operations retired", count=retired, kept=len(self.ops))
            await anyio.sleep(0 if retired >= RETIRE_BATCH else every)

    # -- lifecycle -----------------------------------------------------------------------------

    async def serve_api(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The local API: an edge the engine does not know (:mod:`daemon.supervisor` attaches
        it); the bare engine serves none."""
        task_status.started()

    async def _watch_profiles(self) -> None:
        assert self.config.profiles_dir is not None
        async for _ in watchfiles.awatch(
            self.config.profiles_dir, stop_event=self.stopping, debounce=200, rust_timeout=1000
        ):
            self.load_profiles()

    async def _signals(
        self,
        scope: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            task_status.started()  # handlers are in place: "ready" may be announced
            async for signum in sigs:
                if signum == signal.SIGHUP:
                    logfmt.info("SIGHUP: reloading profiles")
                    self.load_profiles()
                    continue
                logfmt.info("stopping", signal=signal.Signals(signum).name)
                self.stopping.set()
                scope.cancel()
                return

    def request_stop(self) -> None:
        """Stop as on SIGTERM: no new requests, drain, final checkpoint."""
        self.stopping.set()
        if self._main_scope is not None:
            self._main_scope.cancel()

    async def _start_edges(self, tg: anyio.abc.TaskGroup) -> None:
        """The spool and profile watches, the metrics listener and the API."""
        cfg = self.config
        tg.start_soon(self.spool_door.watch, self.stopping)
        if cfg.profiles_dir is not None:
            tg.start_soon(self._watch_profiles)
        if cfg.metrics.listen:
            host, _, port = cfg.metrics.listen.rpartition(":")
            bound = await tg.start(serve_metrics, host, int(port), self.render_metrics)
            self.metrics_url = f"http://{host}:{bound}/metrics"
            logfmt.info("metrics listening", address=f"http://{host}:{bound}/metrics")
        if cfg.api.enabled:
            await tg.start(self.serve_api)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await self._run(task_status=task_status)
        finally:
            # However the engine ends (a stop, a fenced term), a shared pacing forgets it.
            self.poller.detach()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        cfg = self.config
        chain, poller = self.chain, self.poller
        try:
            self.spool.create(cfg.spool.agents_group, cfg.spool.approvers_group)
        except SpoolPermissionError as exc:
            raise ConfigError(str(exc)) from None
        cfg.outbox_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.load_profiles()
        started = time.monotonic()
        snapshot = await chain.load_snapshot()
        publishing = (
            self.publisher.running() if self.publisher is not None else contextlib.nullcontext()
        )
        async with publishing, chain.opened(snapshot) as undecided:
            log = chain.log
            self.runner.actions = chain.ledger.actions
            # What start-up built lives as long as the daemon: keep the collector from
            # re-scanning 100,000 operations on every full collection (they hold no cycles).
            gc.freeze()
            live = [op for op in self.ops.values() if op.phase == "live"]
            logfmt.info(
                "replayed",
                events=chain.ledger.events,
                operations=len(self.ops),
                live=len(live),
                from_snapshot=chain.from_snapshot,
                seconds=f"{time.monotonic() - started:.3f}",
                log_sync=log.sync_mode,
            )
            poller.seed_quotas(self.ops.values(), self.clock())
            async with anyio.create_task_group() as polls:
                self.polls = poller.polls = polls
                chain.spawn = self.spawn_task
                await chain.recover_in_flight(undecided)
                await self.runner.recover()
                live = [op for op in self.ops.values() if op.phase == "live"]
                for op in live:
                    poller.schedule(op.operation_id)
                if self.edges:
                    await self.spool_door.ingest_all()
                    self.spool_door.prune(force=True)
                with anyio.CancelScope() as main_scope:
                    self._main_scope = main_scope
                    async with anyio.create_task_group() as tg:
                        if self.edges:
                            # Before READY=1: a SIGTERM right after it must drain, not kill.
                            await tg.start(self._signals, main_scope)
                        tg.start_soon(poller.timer_loop)
                        tg.start_soon(poller.watch_wall_clock)
                        if self.edges:
                            await self._start_edges(tg)
                        logfmt.info("ready", live=len(live), log=cfg.log_dir)
                        if self.edges:
                            systemd.notify("READY=1", f"STATUS={self.status_line()}")
                            tg.start_soon(systemd.report_status, self.status_line)
                        tg.start_soon(self._retire_ended)
                        task_status.started()
                # Draining: no new requests; those in flight get a bounded time to finish.
                self.stopping.set()
                if self.edges:
                    systemd.notify("STOPPING=1", f"STATUS=stopping: {self.status_line()}")
                await poller.wait_idle(self.drain_seconds)
                polls.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await chain.recover_in_flight()
                for client in poller.clients.values():
                    await client.aclose()
        await chain.final_snapshot()
        logfmt.info("stopped", head=f"{log.head_seq}:{log.head_hash}")
