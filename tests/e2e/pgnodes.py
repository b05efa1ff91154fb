"""Several ``bide run`` nodes on one PostgreSQL log, against the simulator (see
``test_pg_nodes.py``): node configs, starting and stopping nodes, and what the database says
about epochs."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from daemon.readers import LoadedLog, load_log
from eventlog import keys
from tests.e2e.harness import (
    BIDE,
    SHORT_LEASE,
    Daemon,
    LeaseTimes,
    Workspace,
    config_text,
    exported,
    postgres_table,
    until,
)

LEASE = SHORT_LEASE.seconds


@dataclass
class Node:
    name: str
    config: Path
    state: Path
    daemon: Daemon | None = None


def node_config(ws: Workspace, name: str, dsn: str, *, lease: LeaseTimes = SHORT_LEASE) -> Node:
    state = ws.root / f"state-{name}"
    path = ws.root / f"node-{name}.toml"
    path.write_text(
        config_text(state_dir=f"state-{name}", postgres=postgres_table(dsn, lease, node=name))
    )
    return Node(name, path, state)


def start(ws: Workspace, node: Node, env: dict[str, str] | None = None) -> Daemon:
    log_path = ws.root / f"{node.name}-{len(ws.daemons)}.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [*BIDE, "run", "--config", str(node.config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ws.root,
            env=None if env is None else {**os.environ, **env},
        )
    node.daemon = Daemon(proc, log_path)
    ws.daemons.append(node.daemon)
    return node.daemon


def active(daemon: Daemon) -> bool:
    if daemon.proc.poll() is not None:
        raise AssertionError(f"node exited {daemon.proc.returncode}:\n{daemon.output()}")
    return "msg=ready" in daemon.output()


def standby(daemon: Daemon) -> bool:
    if daemon.proc.poll() is not None:
        raise AssertionError(f"node exited {daemon.proc.returncode}:\n{daemon.output()}")
    return STANDBY in daemon.output()


STANDBY = 'msg="standby: following the log"'


def standbys(daemon: Daemon) -> int:
    """How many times the node went (back) to standby."""
    return daemon.output().count(STANDBY)


def wait_active(nodes: list[Node], timeout: float = 20.0) -> Node:
    """The one node whose latest daemon became active (fails if none does in time)."""
    found: list[Node] = []

    def one() -> bool:
        found[:] = [
            n
            for n in nodes
            if n.daemon is not None and n.daemon.proc.poll() is None and active(n.daemon)
        ]
        return bool(found)

    until(one, timeout, "a node to become active")
    return found[0]


def loaded(dsn: str, ws: Workspace, name: str) -> tuple[Path, LoadedLog]:
    out = exported(dsn, ws, name)
    return out, load_log(out, keys.load_keyring(ws.root / "keys"))


def epochs_of(dsn: str) -> dict[int, int]:
    """seq -> the epoch its record was committed under."""
    with psycopg.connect(dsn) as conn:
        return {int(s): int(e) for s, e in conn.execute("SELECT seq, epoch FROM bide_records")}


def epoch_starts(dsn: str) -> dict[int, float]:
    """epoch -> when its first record was committed (the database's clock, POSIX seconds)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT epoch, EXTRACT(EPOCH FROM min(committed_at))::float8 "
            "FROM bide_records GROUP BY epoch"
        ).fetchall()
    return {int(e): float(t) for e, t in rows}


def elapsed(since: float) -> float:
    return time.monotonic() - since
