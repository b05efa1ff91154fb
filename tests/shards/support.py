"""Two nodes of a sharded log, in the test process, as stand-ins for A's ``ShardNode``.

Each shard is a real engine :class:`daemon.supervisor.Supervisor` on its own file store
(a real log in a temporary directory; its poller never runs, so no provider is asked);
the node that holds a shard answers it with that engine's API, the other node with
:class:`daemon.standby.StandbyReads` over the holder's log files (the copy a standby reads,
read as it grows). The catalog (``bide_intake``) is in a real PostgreSQL schema, and each
node has its own :class:`daemon.shards.relay.Relay` over it.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg

from daemon.api.peer import Peer
from daemon.api.server import Handler, Request, Response
from daemon.config import ApiConfig, Config, ConfigFile, PathsConfig
from daemon.engine.intake import Authority
from daemon.shards.relay import Relay
from daemon.shards.router import ShardRouter
from daemon.standby import StandbyReads
from daemon.supervisor import Supervisor
from eventlog import keys
from eventlog.keys import KeyRing
from eventlog.pgstore import PgSettings
from eventlog.shards import Layout, init_catalog

PROFILE = """\
[status]
url = "http://127.0.0.1:9/jobs/{job_id}"
timeout_seconds = 2

[credential]
file = "sim.token"

[contract]
state_pointer = "/status"
job_id_pointer = "/id"

[contract.states]
pending = ["queued", "running"]
success = ["succeeded"]
failure = ["failed"]
"""

ME = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())


def request(
    method: str, path: str, body: object = None, query: dict[str, str] | None = None
) -> Request:
    raw = b"" if body is None else msgspec.json.encode(body)
    return Request(method, path, path, dict(query or {}), {}, raw, ME)


def answer(response: Response) -> dict[str, Any]:
    value = msgspec.json.decode(response.body)
    assert isinstance(value, dict), response.body
    return value


def intake_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT id, shard, kind, op_id, request, rid, taken_at, answered_at, status, answer"
            " FROM bide_intake ORDER BY id"
        ).fetchall()


async def execute(dsn: str, statement: str, params: tuple[object, ...] = ()) -> None:
    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement, params)

    await anyio.to_thread.run_sync(run)


async def until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll real state until ``predicate()`` holds, or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await anyio.to_thread.run_sync(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await anyio.sleep(0.02)


def catalog(dsn: str, count: int) -> Layout:
    """The catalog of a ``count``-shard log in the DSN's schema (the shards' own schemas are
    not needed here: each shard's log is a file store)."""
    with psycopg.connect(dsn) as conn:
        layout = init_catalog(conn, count)
        conn.commit()
    return layout


def shard_ids(layout: Layout, shard: int, n: int, prefix: str = "op") -> list[str]:
    """``n`` operation ids that live in ``shard``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        candidate = f"{prefix}-{i}"
        if layout.shard_of(candidate) == shard:
            out.append(candidate)
        i += 1
    return out


def node_config(root: Path, api: ApiConfig | None = None) -> Config:
    return Config(
        root / "bide.toml",
        ConfigFile(
            paths=PathsConfig(
                state_dir="state",
                keys_dir="../keys",
                profiles_dir="../profiles",
                credentials_dir="../creds",
            ),
            api=api or ApiConfig(),
        ),
    )


def prepare(tmp: Path) -> KeyRing:
    """The keys every node shares (the log's data key) and the provider's profile."""
    keys.generate(tmp / "keys")
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "sim.toml").write_text(PROFILE)
    (tmp / "creds").mkdir()
    (tmp / "creds" / "sim.token").write_text("t0ken\n")
    os.chmod(tmp / "creds" / "sim.token", 0o600)
    return keys.load_keyring(tmp / "keys")


@dataclass
class Node:
    """One node: the shards it holds (engines), the others' standby reads, its relay."""

    name: str
    layout: Layout
    relay: Relay
    engines: dict[int, Supervisor] = field(default_factory=dict)
    handlers: dict[int, Handler] = field(default_factory=dict)
    standbys: dict[int, StandbyReads] = field(default_factory=dict)

    def held(self) -> set[int]:
        return set(self.engines)

    def handler(self, shard: int) -> Handler:
        return self.handlers[shard]

    async def folded(self, shard: int, seq: int) -> None:
        reads = self.standbys.get(shard)
        if shard in self.engines or reads is None:
            return
        # What the lease's follow does on a node (here the copy is the holder's own log):
        # read what it gained, then the copy's own wait.
        await reads.refresh()
        await reads.folded(seq)

    async def caught_up(self, shard: int) -> None:
        reads = self.standbys.get(shard)
        if shard in self.engines or reads is None:
            return
        await reads.refresh()  # the copy is the holder's own log: read to its head

    @property
    def router(self) -> ShardRouter:
        return ShardRouter(self.layout, self, self.relay)


def engine(tmp: Path, shard: int, api: ApiConfig | None = None) -> Supervisor:
    root = tmp / f"shard-{shard}"
    root.mkdir(exist_ok=True)
    cfg = node_config(root, api)
    sup = Supervisor(cfg, keys.load_keyring(tmp / "keys"), keys.load_signer(tmp / "keys"))
    sup.load_profiles()
    return sup


@asynccontextmanager
async def two_nodes(
    tmp: Path,
    dsn: str,
    layout: Layout,
    *,
    serve: bool = True,
    answer_within: float = 10.0,
    api: ApiConfig | None = None,
) -> AsyncIterator[tuple[Node, Node]]:
    """Node ``a`` holds the even shards, ``b`` the odd ones; each answers the other's
    shards from its standby reads of the holder's log. With ``serve``, each holder serves
    its shards' relayed requests."""
    keyring = keys.load_keyring(tmp / "keys")
    settings = PgSettings(dsn)
    nodes = {
        name: Node(
            name,
            layout,
            Relay(
                settings,
                layout,
                name,
                keyring,
                authority=Authority(node_config(tmp)),
                timeout=answer_within,
            ),
        )
        for name in ("a", "b")
    }
    engines = {k: engine(tmp, k, api) for k in range(layout.count)}
    for k, sup in engines.items():
        holder, other = (nodes["a"], nodes["b"]) if k % 2 == 0 else (nodes["b"], nodes["a"])
        holder.engines[k] = sup
        holder.handlers[k] = sup.api_handler()[0]
        reads = StandbyReads(sup.config, _builder(tmp, sup.config), holder.name)
        other.standbys[k] = reads
        other.handlers[k] = reads.handle
    async with anyio.create_task_group() as tg, _opened(list(engines.values())):
        for node in nodes.values():
            await tg.start(node.relay.run)
            for reads in node.standbys.values():
                await reads.refresh()
        if serve:
            for node in nodes.values():
                for k in node.engines:
                    tg.start_soon(node.relay.serve, k, node.handlers[k])
        yield nodes["a"], nodes["b"]
        tg.cancel_scope.cancel()


def _builder(tmp: Path, cfg: Config) -> Callable[[], Supervisor]:
    def build() -> Supervisor:
        sup = Supervisor(cfg, keys.load_keyring(tmp / "keys"), keys.load_signer(tmp / "keys"))
        sup.load_profiles()
        return sup

    return build


@asynccontextmanager
async def _opened(engines: list[Supervisor]) -> AsyncIterator[None]:
    if not engines:
        yield
        return
    async with engines[0].chain.opened(None), _opened(engines[1:]):
        yield
