"""Several ``bide run`` nodes on one sharded PostgreSQL log, against the simulator (issue 39).

A :class:`Cluster` is a workspace's nodes: each a ``bide run`` process with its own config,
state directory and node name (``[postgres] node``), all on the same DSN, so on a log made by
``bide log init --shards N`` they divide its shards among themselves (and on a log made
before shards, one is active and the others stand by: the same harness drives both). Nodes
are started, killed (SIGKILL), paused (SIGSTOP) and resumed, and stopped gracefully (SIGTERM);
who holds which shard is read from the database (each shard's ``bide_lease`` row), never from
a node's say-so. Agents reach a node through its local API on ``STATE/api.sock``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import psycopg
from psycopg import sql

from tests.e2e.harness import (
    BIDE,
    Daemon,
    LeaseTimes,
    Workspace,
    config_text,
    postgres_table,
    until,
)
from tests.e2e.pgnodes import Node
from tests.e2e.pgnodes import start as start_node
from tests.e2e.shardchecks import epoch_spans, shard_dsns
from tests.pgcluster import Cluster as PgCluster
from tests.pgcluster import private_cluster

#: The API's per-user registration rate, raised so one test agent can register thousands.
API = (
    "allow_self_approval = true\nregistrations_per_second = 5000\n"
    "registrations_burst = 10000\nmax_live_per_principal = 100000\n"
)


#: A node keeps about 24 connections for 16 shards (a lease pool, a follow pool, one LISTEN,
#: the relay's and the quota exchange's; 42 before the runtime shared them), and the shared
#: server's 100 serve every other test running beside these.
MAX_CONNECTIONS = 400


@contextmanager
def roomy_cluster(max_connections: int = MAX_CONNECTIONS) -> Iterator[PgCluster]:
    """A private PostgreSQL cluster (:func:`tests.pgcluster.private_cluster`) that allows
    ``max_connections``: the shared server's 100 are shared by every other test running
    beside this one."""
    with private_cluster() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
        server.ctl("-m", "fast", "stop")
        server.start()
        yield server


def schema_on(server: PgCluster, schema: str) -> str:
    """A DSN on ``server`` whose search path is ``schema`` (created)."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return psycopg.conninfo.make_conninfo(server.dsn, options=f"-csearch_path={schema}")


@contextmanager
def roomy_server(max_connections: int = MAX_CONNECTIONS) -> Iterator[str]:
    """A DSN on a :func:`roomy_cluster`, in a schema of its own."""
    with roomy_cluster(max_connections) as server:
        yield schema_on(server, "bide_proof")


def init_shards(dsn: str, count: int, writer_role: str | None = None) -> None:
    """``bide log init --dsn DSN --shards COUNT`` (as the log's owner)."""
    args = [*BIDE, "log", "init", "--dsn", dsn, "--shards", str(count)]
    if writer_role:
        args += ["--writer-role", writer_role]
    out = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@dataclass(frozen=True)
class Move:
    """One shard's holder changed: from ``before`` (epoch ``old``) to ``after`` (``new``);
    ``released``/``taken``: its old term's last record and new term's first, committed."""

    shard: int
    before: str
    after: str
    old: int
    new: int
    released: float
    taken: float


@dataclass
class Cluster:
    """The nodes of one workspace on one log (``dsn``: the nodes' DSN, the catalog's schema)."""

    ws: Workspace
    dsn: str
    lease: LeaseTimes
    nodes: dict[str, Node] = field(default_factory=dict)
    extra_postgres: str = ""

    @property
    def shard_dsns(self) -> list[str]:
        return shard_dsns(self.dsn)[1]

    def config(self, name: str) -> Node:
        """A node's config and state directory (made, not started)."""
        state = self.ws.root / f"state-{name}"
        path = self.ws.root / f"node-{name}.toml"
        postgres = postgres_table(self.dsn, self.lease, node=name) + self.extra_postgres
        path.write_text(config_text(state_dir=state.name, postgres=postgres, api=API))
        node = Node(name, path, state)
        self.nodes[name] = node
        return node

    def start(self, name: str) -> Daemon:
        node = self.nodes.get(name) or self.config(name)
        return start_node(self.ws, node)

    def daemon(self, name: str) -> Daemon:
        d = self.nodes[name].daemon
        assert d is not None, f"node {name} was never started"
        return d

    def kill(self, name: str) -> float:
        """SIGKILL; returns when (POSIX seconds) it was sent."""
        at = time.time()
        self.daemon(name).kill()
        return at

    def pause(self, name: str) -> float:
        at = time.time()
        self.daemon(name).proc.send_signal(signal.SIGSTOP)
        return at

    def resume(self, name: str) -> float:
        at = time.time()
        self.daemon(name).proc.send_signal(signal.SIGCONT)
        return at

    def leave(self, name: str, timeout: float = 60.0) -> float:
        """SIGTERM and wait for a clean exit; returns when the signal was sent."""
        at = time.time()
        code = self.daemon(name).stop(timeout)
        assert code == 0, f"node {name} exited {code}:\n{self.daemon(name).output()}"
        return at

    def alive(self) -> list[str]:
        return [
            n
            for n, node in self.nodes.items()
            if node.daemon is not None and node.daemon.proc.poll() is None
        ]

    def stop_all(self) -> None:
        for name in self.alive():
            self.leave(name)

    def holders(self) -> dict[int, tuple[str, int]]:
        """Each shard's current holder (its node name, '' when none holds an unexpired lease)
        and epoch, from the database's lease rows."""
        held: dict[int, tuple[str, int]] = {}
        for k, shard_dsn in enumerate(self.shard_dsns):
            with psycopg.connect(shard_dsn) as conn:
                row = conn.execute(
                    "SELECT holder, epoch, expires_at > now() FROM bide_lease WHERE id = 1"
                ).fetchone()
            assert row is not None
            holder = str(row[0]).split("/")[0] if row[2] else ""
            held[k] = (holder, int(row[1]))
        return held

    def held_by(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for k, (holder, _) in self.holders().items():
            out.setdefault(holder, set()).add(k)
        return out

    def wait_balanced(self, names: Sequence[str], timeout: float = 30.0) -> dict[str, set[int]]:
        """Until every shard is held by one of ``names`` and each holds its fair share (the
        count divided among them, give or take one)."""
        count = len(self.shard_dsns)
        low, high = count // len(names), -(-count // len(names))
        got: dict[str, set[int]] = {}

        def balanced() -> bool:
            for name in names:
                d = self.daemon(name)
                if d.proc.poll() is not None:
                    raise AssertionError(f"node {name} exited:\n{d.output()}")
            got.clear()
            got.update(self.held_by())
            if set(got) - set(names):
                return False
            return all(low <= len(got.get(n, ())) <= high for n in names)

        until(balanced, timeout, f"the shards divided among {', '.join(names)}")
        return dict(got)

    def moves(self, before: dict[int, tuple[str, int]], timeout: float = 30.0) -> list[Move]:
        """The shards whose holder changed since ``before`` (a :meth:`holders` reading), each
        with when its old term's last record and its new term's first were committed (waited
        for: a lease is taken before its holder's replay and takeover record)."""
        changed = {k: got for k, got in self.holders().items() if got[1] != before[k][1]}
        spans: dict[int, dict[int, tuple[float, float]]] = {}

        def recorded() -> bool:
            for k in changed:
                spans[k] = epoch_spans(self.shard_dsns[k])
            return all(epoch in spans[k] for k, (_, epoch) in changed.items())

        until(recorded, timeout, "each moved shard's first record under its new holder")
        out: list[Move] = []
        for k, (holder, epoch) in sorted(changed.items()):
            was, old = before[k]
            released = spans[k][old][1] if old in spans[k] else float("nan")
            out.append(Move(k, was, holder, old, epoch, released, spans[k][epoch][0]))
        return out

    def register(self, name: str, ops: Sequence[tuple[str, str]], workers: int = 8) -> list[str]:
        """Register ``(operation, job)`` pairs through node ``name``'s API, ``workers`` at a
        time; the operations acknowledged (201), in order. Anything else fails the test."""

        def one(client: httpx.Client, op: str, job: str) -> str:
            body = {"provider": "sim", "job_id": job, "operation_id": op}
            got = client.post("/v1/operations", json=body)
            assert got.status_code == 201, f"{op} through {name}: {got.status_code} {got.text}"
            return op

        with self.api(name) as client, ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda pair: one(client, *pair), ops))

    @contextmanager
    def api(self, name: str) -> Iterator[httpx.Client]:
        """The node's local API, as an agent on this host reaches it."""
        transport = httpx.HTTPTransport(uds=str(self.nodes[name].state / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://bide", timeout=90.0) as client:
            yield client

    def wait_api(self, name: str, timeout: float = 30.0) -> None:
        sock = self.nodes[name].state / "api.sock"
        until(sock.exists, timeout, f"node {name}'s API socket")
