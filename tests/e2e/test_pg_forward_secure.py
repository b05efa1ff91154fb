"""Forward-secure signing under HA, end to end: two real ``bide run`` nodes on one PostgreSQL
log with ``forward_secure`` on (the default), each enrolled with ``bide node enroll`` and the
root key then taken off the machine. SIGKILL the active node, the other takes over; then
back. ``bide verify --dsn`` with ``verify.pub`` alone finds the chain intact across both
takeovers and lists each with its node; every takeover record is signed by its node's own
enrolled key; no node keeps a used node key or an old epoch key on disk.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import partial
from pathlib import Path

from daemon.spool import Spool
from eventlog.envelope import Checkpoint, Genesis
from eventlog.epochs import EPOCHS_DIR
from eventlog.nodekeys import LINKS_FILE, NODE_DIR
from tests.e2e.harness import (
    BIDE,
    Workspace,
    drop_registration,
    exported,
    init_log,
    until,
    workspace,
    write_status_profile,
)
from tests.e2e.pgnodes import LEASE, Node, node_config, standby, start, wait_active
from tests.eventlog._logtools import read_lines

CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.3
min_hint_seconds = 0.05
default_deadline_seconds = 120
default_max_status_requests = 400
"""
JOBS: dict[str, str | list[object]] = {f"long-{i}": "running" for i in range(3)}


def _bide(ws: Workspace, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BIDE, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ws.root,
    )


def _forward_secure_node(ws: Workspace, name: str, dsn: str) -> Node:
    """A node config with the daemon's default, ``forward_secure = true``."""
    node = node_config(ws, name, dsn)
    node.config.write_text(node.config.read_text().replace("forward_secure = false\n", ""))
    return node


def _enroll(ws: Workspace, node: Node) -> None:
    """``bide node enroll`` where the root key is, then the files copied to the node."""
    out = ws.root / f"enrolled-{node.name}"
    done = _bide(ws, "node", "enroll", "--name", node.name, "--keys-dir", "keys", "--out", out)
    assert done.returncode == 0, done.stderr
    seed = json.loads((out / "node-key-00000001.key").read_text())["seed"]
    assert seed not in done.stdout + done.stderr  # never printed
    target = node.state / NODE_DIR
    target.mkdir(mode=0o700, parents=True)
    for path in out.iterdir():
        shutil.copy2(path, target / path.name)
    shutil.rmtree(out)


def _polled(ws: Workspace, more: int = 2) -> None:
    seen = len(ws.sim.requests(kind="status"))
    ws.sim.wait_for_requests(seen + more, kind="status", timeout=LEASE + 15)


def test_two_enrolled_nodes_take_over_from_each_other_and_the_chain_verifies(
    pg_dsn: str, tmp_path: Path
) -> None:
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        init_log(pg_dsn)
        a, b = (_forward_secure_node(ws, name, pg_dsn) for name in ("node-a", "node-b"))

        # Not enrolled: refused at --check and at start, naming the command that fixes it.
        check = _bide(ws, "run", "--check", "--config", a.config)
        assert check.returncode != 0
        assert "bide node enroll" in check.stdout + check.stderr
        refused = _bide(ws, "run", "--config", a.config)
        assert refused.returncode != 0
        assert "bide node enroll --name node-a" in refused.stderr

        for n in (a, b):
            _enroll(ws, n)
        # The root key goes offline: nodes never need it, not even to create the log.
        root = ws.root / "keys" / "signing.key"
        offline = ws.root / "offline-signing.key"
        root.rename(offline)
        check = _bide(ws, "run", "--check", "--config", a.config)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "node       node-a: enrolled, at node key 1" in check.stdout

        start(ws, a)
        wait_active([a])
        start(ws, b)
        assert b.daemon is not None
        until(partial(standby, b.daemon), 20, "node b to stand by")
        spool = Spool(a.state / "spool")
        until(lambda: spool.incoming.is_dir(), 10, "the spool")
        for job in JOBS:
            drop_registration(ws, f"op-{job}", job, spool=spool)
        _polled(ws, 2 * len(JOBS))

        # a -> b -> a, each by SIGKILL of the active node.
        holders = [a]
        for killed, taker in ((a, b), (b, a)):
            assert killed.daemon is not None
            killed.daemon.kill()
            wait_active([taker], timeout=LEASE + 15)
            _polled(ws)
            holders.append(taker)
            restarted = start(ws, killed)
            until(partial(standby, restarted), 20, f"{killed.name} to stand by again")
        for n in (b, a):
            assert n.daemon is not None
            assert n.daemon.stop() == 0

        verified = _bide(
            ws, "verify", "--dsn", pg_dsn, "--json", "--verify-key", ws.root / "keys" / "verify.pub"
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        report = json.loads(verified.stdout)
        assert report["verdict"] == "intact"
        assert [t["holder"].split("/")[0] for t in report["takeovers"]] == [n.name for n in holders]

        replayed = _bide(ws, "replay", "--check", "--config", a.config)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr

        # Every takeover is signed by its holder's own enrolled key (and the genesis by
        # node a's, the root key being offline): the certificate names the holder.
        lines = read_lines(exported(pg_dsn, ws, "fs"))
        genesis = lines[0].record
        assert isinstance(genesis, Genesis)
        assert genesis.cert is not None
        assert genesis.cert.node == "node-a"
        takeovers = [
            ln.record for ln in lines if isinstance(ln.record, Checkpoint) and ln.record.holder
        ]
        signed_by = [cp.cert.node if cp.cert else None for cp in takeovers]
        assert signed_by[0] in (None, "node-a")  # a's first term: the genesis's epoch key
        assert signed_by[1:] == ["node-b", "node-a"]

        # No old key on disk: one node key per node (the next, unused one), no epoch key
        # of the log on either node once its term ended.
        for n in (a, b):
            node_keys = sorted(p.name for p in (n.state / NODE_DIR).glob("node-key-*.key"))
            links = (n.state / NODE_DIR / LINKS_FILE).read_text().splitlines()
            assert node_keys == [f"node-key-{len(links) + 1:08d}.key"]
            assert len(links) >= 1
            epochs_dir = n.state / EPOCHS_DIR
            assert not epochs_dir.exists() or list(epochs_dir.iterdir()) == []
        offline.rename(root)


def test_a_format_2_log_goes_on_with_its_one_key_under_the_new_default(
    pg_dsn: str, tmp_path: Path
) -> None:
    """A log made in PostgreSQL before enrolment existed (format 2, ``forward_secure =
    false``) keeps working when the config drops that line: no enrolment asked, the one
    signing key signs the next node's takeover, and the chain verifies."""
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        init_log(pg_dsn)
        old = node_config(ws, "old", pg_dsn)  # the harness's format-2 node
        start(ws, old)
        wait_active([old])
        assert old.daemon is not None
        assert old.daemon.stop() == 0
        new = _forward_secure_node(ws, "new", pg_dsn)
        check = _bide(ws, "run", "--check", "--config", new.config)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "enroll" not in check.stdout + check.stderr
        start(ws, new)
        wait_active([new])
        assert new.daemon is not None
        assert new.daemon.stop() == 0
        verified = _bide(
            ws, "verify", "--dsn", pg_dsn, "--json", "--verify-key", ws.root / "keys" / "verify.pub"
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        report = json.loads(verified.stdout)
        assert report["format"] == 2
        assert [t["holder"].split("/")[0] for t in report["takeovers"]] == ["old", "new"]
        assert not (new.state / NODE_DIR).exists()
