"""Two daemons on one PostgreSQL log against the simulator: SIGKILL the active node again and
again, SIGSTOP one past its lease; each run checked from the simulator's request log.

For every run: every request the provider saw has an earlier durable intent, within budget
(``assert_provider_invariants``, non-strict: an intent may die with its node before its
request leaves); no request made under an epoch arrives after the next epoch's first record
(no job polled by two nodes at once); the database's chain verifies with ``verify.pub`` alone
(``bide verify --dsn``) and ``bide replay --check`` re-derives every decision.
"""

from __future__ import annotations

import json
import secrets
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest

from daemon.spool import Spool
from eventlog.store import local_head
from replay.events import (
    RequestOutcomeUnknown,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
)
from tests.e2e.harness import (
    BIDE,
    LeaseTimes,
    Workspace,
    assert_provider_invariants,
    drop_registration,
    init_log,
    until,
    verify_dsn,
    workspace,
    write_status_profile,
)
from tests.e2e.pgnodes import (
    LEASE,
    Node,
    active,
    epoch_starts,
    epochs_of,
    loaded,
    node_config,
    standby,
    standbys,
    start,
    wait_active,
)
from tests.e2e.tcpproxy import proxy_to
from tests.pgcluster import private_cluster
from tests.pgsupport import role

CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.3
rate_limited_delay_seconds = 1.0
min_hint_seconds = 0.05
not_found_grace_seconds = 5
default_deadline_seconds = 120
default_max_status_requests = 400
default_max_transport_failures = 50
default_max_rate_limited = 10
"""
JOBS: dict[str, str | list[object]] = {f"long-{i}": "running" for i in range(6)}


@pytest.fixture
def node_dsn(pg_dsn: str) -> Iterator[str]:
    """The nodes' DSN as the deploy guide sets them up: a role of their own, granted by the
    owner's ``bide log init --writer-role`` (SELECT and the checked functions, nothing more),
    so every run below is also fenced by the database itself."""
    name = f"bidep_node_{secrets.token_hex(4)}"
    with contextmanager(role)(pg_dsn, name) as dsn:
        out = subprocess.run(
            [*BIDE, "log", "init", "--dsn", pg_dsn, "--writer-role", name],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        yield dsn


def _register(ws: Workspace, node: Node) -> None:
    spool = Spool(node.state / "spool")
    until(lambda: spool.incoming.is_dir(), 10, "the spool")
    for job in JOBS:
        drop_registration(ws, f"op-{job}", job, spool=spool)


def _check_run(ws: Workspace, dsn: str, name: str) -> dict[int, int]:
    """The invariants of the docstring; returns requests per epoch."""
    per_epoch: dict[int, int] = {}
    for _, epoch in _requests_by_epoch(ws, dsn, name):
        per_epoch[epoch] = per_epoch.get(epoch, 0) + 1
    return per_epoch


def _requests_by_epoch(ws: Workspace, dsn: str, name: str) -> list[tuple[float, int]]:
    """The invariants of the docstring; (arrival, epoch of its intent) of every request."""
    export, log = loaded(dsn, ws, name)
    out = subprocess.run(
        [*BIDE, "verify", str(export), "--verify-key", str(ws.root / "keys" / "verify.pub")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = verify_dsn(ws.root, dsn, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    epochs, starts = epochs_of(dsn), epoch_starts(dsn)
    # Every term began with a signed takeover record naming its epoch, committed under it.
    takeovers = json.loads(out.stdout)["takeovers"]
    assert [t["lease_epoch"] for t in takeovers] == sorted(set(epochs.values()) - {0})
    for t in takeovers:
        assert epochs[t["seq"]] == t["lease_epoch"]
        assert t["holder"].split("/")[0] in "abcdefgh"
    arrivals: list[tuple[float, int]] = []
    for job in JOBS:
        op = f"op-{job}"
        received = ws.sim.requests(kind="status", job_id=job)
        assert_provider_invariants(log, received, op, strict=False)
        intents = [
            (seq, ev)
            for seq, ev in log.events
            if isinstance(ev, StatusRequestIntended) and ev.operation_id == op
        ]
        for record in received:
            seq, _ = [(s, i) for s, i in intents if i.at <= record.wall][-1]
            epoch = epochs[seq]
            arrivals.append((record.wall, epoch))
            later = starts.get(epoch + 1)
            assert later is None or record.wall < later, (
                f"{op}: a request made under epoch {epoch} arrived "
                f"{record.wall - later:.3f}s after epoch {epoch + 1} began"
            )
    return arrivals


def _replay_check(ws: Workspace, node: Node) -> None:
    out = subprocess.run(
        [*BIDE, "replay", "--check", "--config", str(node.config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ws.root,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("count", "kills"),
    [
        pytest.param(2, 3, id="2-nodes-3-kills"),
        pytest.param(3, 10, id="3-nodes-10-kills", marks=pytest.mark.slow),
    ],
)
def test_sigkill_the_active_node_a_standby_takes_over(
    pg_dsn: str, node_dsn: str, tmp_path: Path, count: int, kills: int
) -> None:
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        nodes = [node_config(ws, "abcdefgh"[i], node_dsn) for i in range(count)]
        start(ws, nodes[0])
        first = wait_active(nodes[:1])
        for n in nodes[1:]:
            until(partial(standby, start(ws, n)), 20, f"node {n.name} to stand by")
        _register(ws, first)
        until(lambda: len(ws.sim.requests(kind="status")) >= 2 * len(JOBS), 20, "polls")
        takeovers: list[float] = []
        current = first
        for _ in range(kills):
            seen = len(ws.sim.requests(kind="status"))
            ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
            assert current.daemon is not None
            current.daemon.kill()
            killed_at = time.monotonic()
            others = [n for n in nodes if n is not current]
            nxt = wait_active(others, timeout=LEASE + 15)
            after = len(ws.sim.requests(kind="status"))
            ws.sim.wait_for_requests(after + 1, kind="status", timeout=10)
            takeovers.append(time.monotonic() - killed_at)
            restarted = start(ws, current)  # the killed node comes back, as a standby
            until(partial(standby, restarted), 20, "the restarted node to stand by")
            current = nxt
        status = subprocess.run(
            [*BIDE, "status", "--node", "--json", "--config", str(current.config)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["active_node"].startswith(f"{current.name}/")
        assert info["lease_remaining_seconds"] > 0
        transport = httpx.HTTPTransport(uds=str(current.state / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://bide") as api:
            health = api.get("/v1/health").json()
        assert health["log_store"] == "postgresql"
        assert health["lease"]["epoch"] == info["epoch"]
        assert health["lease"]["remaining_seconds"] > 0
        for n in nodes:  # the standbys first: they hold nothing and stop at once
            if n is not current and n.daemon is not None:
                assert n.daemon.stop() == 0
        assert current.daemon is not None
        assert current.daemon.stop() == 0
        per_epoch = _check_run(ws, pg_dsn, "kills")
        _replay_check(ws, current)
        print(
            f"\ntakeover after SIGKILL (kill -> first request by the new node), lease "
            f"{LEASE}s: median {statistics.median(takeovers):.2f}s, max "
            f"{max(takeovers):.2f}s over {len(takeovers)}; requests per epoch {per_epoch}"
        )
        assert len(per_epoch) >= kills  # every takeover polled
        for t in takeovers:
            assert t < LEASE + 5


def _a_active_b_standing_by_jobs_polled(ws: Workspace, a: Node, b: Node) -> None:
    """Node a active, node b its standby, every job registered and polled twice."""
    start(ws, a)
    wait_active([a])
    start(ws, b)
    assert b.daemon is not None
    until(partial(standby, b.daemon), 20, "node b to stand by")
    _register(ws, a)
    until(lambda: len(ws.sim.requests(kind="status")) >= 2 * len(JOBS), 20, "polls")


def test_a_paused_node_sends_nothing_after_resuming_and_rejoins_as_standby(
    pg_dsn: str, node_dsn: str, tmp_path: Path
) -> None:
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        a, b = node_config(ws, "a", node_dsn), node_config(ws, "b", node_dsn)
        _a_active_b_standing_by_jobs_polled(ws, a, b)
        assert a.daemon is not None
        assert b.daemon is not None
        a.daemon.proc.send_signal(signal.SIGSTOP)
        wait_active([b], timeout=LEASE + 15)
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
        epochs = epochs_of(pg_dsn)
        b_epoch = max(epochs.values())
        resumed = time.time()
        a.daemon.proc.send_signal(signal.SIGCONT)
        daemon_a = a.daemon
        until(lambda: "fenced" in daemon_a.output(), 15, "the resumed node to find itself fenced")
        until(lambda: standbys(daemon_a) >= 2, 15, "the resumed node to stand by again")
        assert a.daemon.stop() == 0  # a standby stops at once, holding nothing
        assert b.daemon.stop() == 0
        per_epoch = _check_run(ws, pg_dsn, "pause")
        # From the request log: nothing under node a's epoch arrived after it resumed.
        export, log = loaded(pg_dsn, ws, "pause-2")
        del export
        by_seq = epochs_of(pg_dsn)
        for job in JOBS:
            op = f"op-{job}"
            intents = [
                (s, e)
                for s, e in log.events
                if isinstance(e, StatusRequestIntended) and e.operation_id == op
            ]
            for record in ws.sim.requests(kind="status", job_id=job):
                if record.wall >= resumed:
                    seq = [s for s, i in intents if i.at <= record.wall][-1]
                    assert by_seq[seq] >= b_epoch, f"{op}: node a sent after resuming"
        assert per_epoch.get(b_epoch, 0) > 0
        _replay_check(ws, b)


def test_a_graceful_stop_hands_over_at_once_and_standbys_follow_each_commit(
    pg_dsn: str, node_dsn: str, tmp_path: Path
) -> None:
    """With a 20 s lease and a 30 s standby poll, only NOTIFY can make the standby's copy
    keep up and let it take over within seconds of a SIGTERM."""
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        long = LeaseTimes(seconds=20.0, renew=0.5, margin=0.2)
        a, b = (node_config(ws, name, node_dsn, lease=long) for name in "ab")
        for n in (a, b):
            n.config.write_text(
                n.config.read_text().replace(
                    "[postgres]\n", "[postgres]\nstandby_poll_seconds = 30\n"
                )
            )
        _a_active_b_standing_by_jobs_polled(ws, a, b)
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT max(seq) FROM bide_records").fetchone()
        assert row is not None
        committed = int(row[0])

        def b_has_it() -> bool:
            held = local_head(b.state / "log")
            return held is not None and held[0] >= committed

        until(b_has_it, 10, "the standby's copy to reach what the active node committed")
        assert a.daemon is not None
        assert b.daemon is not None
        stopped = time.monotonic()
        assert a.daemon.stop() == 0
        assert "lease handed over" in a.daemon.output()
        wait_active([b], timeout=10)
        handover = time.monotonic() - stopped
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
        assert b.daemon.stop() == 0
        per_epoch = _check_run(ws, pg_dsn, "handover")
        _replay_check(ws, b)
        print(
            f"\ngraceful handover (SIGTERM -> the standby active): {handover:.2f}s; "
            f"requests per epoch {per_epoch}"
        )
        assert sorted(per_epoch) == [1, 2]
        # An administrator who rewrites the epoch column (past the append-only trigger) is
        # caught: the chain's takeover records say which epoch each term's records are under.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE bide_records DISABLE TRIGGER bide_records_append_only")
            row = conn.execute(
                "UPDATE bide_records SET epoch = 1 WHERE seq = (SELECT max(seq) "
                "FROM bide_records) RETURNING seq"
            ).fetchone()
        assert row is not None
        out = verify_dsn(ws.root, pg_dsn)
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"record {row[0]}" in out.stdout
        assert "epoch column was altered" in out.stdout


def test_a_node_taking_over_starts_from_the_snapshot_the_last_one_kept_in_the_database(
    pg_dsn: str, node_dsn: str, tmp_path: Path
) -> None:
    """Node b never held the log, so it has no snapshot of its own: after node a is killed,
    b replays from the snapshot a kept in bide_snapshots, plus the records after it."""
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        a, b = node_config(ws, "a", node_dsn), node_config(ws, "b", node_dsn)
        for n in (a, b):
            n.config.write_text(
                n.config.read_text().replace("[log]\n", "[log]\nsnapshot_every = 20\n")
            )
        _a_active_b_standing_by_jobs_polled(ws, a, b)

        def kept() -> int:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute("SELECT seq FROM bide_snapshots WHERE name = 'state'").fetchone()
            return -1 if row is None else int(row[0])

        until(lambda: kept() >= 0, 20, "node a to keep a snapshot in the database")
        assert not (b.state / "snapshot").exists()
        assert a.daemon is not None
        assert b.daemon is not None
        a.daemon.kill()
        wait_active([b], timeout=LEASE + 15)
        replayed = [ln for ln in b.daemon.output().splitlines() if "msg=replayed" in ln]
        assert replayed, b.daemon.output()
        from_snapshot = int(replayed[-1].split("from_snapshot=")[1].split()[0])
        assert from_snapshot > 0, replayed[-1]
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
        assert b.daemon.stop() == 0
        _check_run(ws, pg_dsn, "snapshot")
        _replay_check(ws, b)


def test_a_second_node_on_the_same_state_directory_is_refused(pg_dsn: str, tmp_path: Path) -> None:
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        init_log(pg_dsn)
        a = node_config(ws, "a", pg_dsn)
        start(ws, a)
        wait_active([a])
        again = subprocess.run(
            [*BIDE, "run", "--config", str(a.config)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=ws.root,
        )
        assert again.returncode == 2, again.stdout + again.stderr
        assert a.daemon is not None
        assert f"locked by pid {a.daemon.proc.pid}" in again.stderr
        assert a.daemon.stop() == 0


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): its state in /proc is T."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("stage", ["request", "send"])
def test_a_node_paused_between_its_intent_and_its_request_never_sends_it(
    pg_dsn: str, node_dsn: str, tmp_path: Path, stage: str
) -> None:
    """Node a stops itself after the intent of a request to job long-0 is durable and before
    the request leaves: right after the intent (``request``), or after the poller's last
    check of the deadline and the lease, on the way into the HTTP client (``send``: only the
    check as the request's first byte is written can stop it there). Node b takes over,
    polls, and hands the lease back by a graceful stop, so after SIGCONT nothing but a itself
    could reach the provider: until a holds the lease again (a new epoch), the provider sees
    nothing at all, and the intent a held is recorded as not sent or its outcome unknown."""
    with workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        a, b = node_config(ws, "a", node_dsn), node_config(ws, "b", node_dsn)
        start(ws, a, env={"BIDE_FAULT_INJECT": f"{stage}:op-long-0:stop"})
        wait_active([a])
        start(ws, b)
        assert a.daemon is not None
        assert b.daemon is not None
        daemon_a = a.daemon
        until(partial(standby, b.daemon), 20, "node b to stand by")
        _register(ws, a)
        until(
            lambda: _stopped(daemon_a.proc.pid),
            20,
            "node a to stop itself between an intent and its request",
        )
        wait_active([b], timeout=LEASE + 15)
        seen = len(ws.sim.requests(kind="status", job_id="long-0"))
        ws.sim.wait_for_requests(seen + 1, kind="status", job_id="long-0", timeout=10)
        assert b.daemon.stop() == 0  # the lease handed over: only node a is left
        resumed = time.time()
        a.daemon.proc.send_signal(signal.SIGCONT)
        until(
            lambda: daemon_a.output().count("msg=ready") >= 2,
            20,
            "node a to be fenced, stand by and take the lease again",
        )
        assert "fenced" in a.daemon.output()
        retaken = epoch_starts(pg_dsn)[max(epochs_of(pg_dsn).values())]
        early = [r for r in ws.sim.requests(kind="status") if resumed <= r.wall < retaken]
        assert not early, f"node a sent {len(early)} request(s) before it held the lease again"
        assert a.daemon.stop() == 0
        _check_run(ws, pg_dsn, f"paused-{stage}")
        _replay_check(ws, a)
        # The request a held when it stopped: answered by nothing, recorded as never sent
        # (a's own record, if it landed) or its outcome unknown (the next term's recovery).
        _, log = loaded(pg_dsn, ws, f"paused-{stage}-log")
        mine = [e for _, e in log.events if e.operation_id == "op-long-0"]
        first = next(e for e in mine if isinstance(e, StatusRequestIntended)).request_number
        ends = [
            e
            for e in mine
            if isinstance(e, TransportFailed | RequestOutcomeUnknown | StatusResponseReceived)
            and e.request_number == first
        ]
        assert len(ends) == 1, ends
        assert not isinstance(ends[0], StatusResponseReceived), ends[0]
        gated = "not sent: the lease ran out on its way" in daemon_a.output()
        print(f"\npaused at {stage}: recorded as {ends[0]!r}; refused as written: {gated}")


@pytest.mark.parametrize("how", ["cut", "stall"])
def test_a_node_cut_from_the_database_stops_sending_within_its_lease(
    pg_dsn: str, node_dsn: str, tmp_path: Path, how: str
) -> None:
    """``cut``: the link is reset; ``stall``: it stays open and nothing comes back (a commit
    and a renewal in flight hang), the case only the node's own clock can end."""
    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    with (
        workspace(tmp_path, jobs=JOBS) as ws,
        proxy_to(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as proxy,
    ):
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        via_proxy = psycopg.conninfo.make_conninfo(node_dsn, host="127.0.0.1", port=str(proxy.port))
        a, b = node_config(ws, "a", via_proxy), node_config(ws, "b", node_dsn)
        _a_active_b_standing_by_jobs_polled(ws, a, b)
        assert a.daemon is not None
        assert b.daemon is not None
        a_epoch = max(epochs_of(pg_dsn).values())
        proxy.cut() if how == "cut" else proxy.stall()
        cut_at, cut_mono = time.time(), time.monotonic()
        wait_active([b], timeout=LEASE + 15)
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 1, kind="status", timeout=10)
        took_over = time.monotonic() - cut_mono
        proxy.restore()
        daemon_a = a.daemon
        until(lambda: "fenced" in daemon_a.output(), 20, "the cut node to stop as fenced")
        until(lambda: standbys(daemon_a) >= 2, 20, "the cut node to stand by again")
        assert a.daemon.stop() == 0
        assert b.daemon.stop() == 0
        arrivals = _requests_by_epoch(ws, pg_dsn, how)
        late = [
            wall - cut_at for wall, epoch in arrivals if epoch == a_epoch and wall >= cut_at + LEASE
        ]
        assert not late, f"node a sent {len(late)} requests more than a lease after the cut"
        assert any(epoch > a_epoch for _, epoch in arrivals)
        # Nothing node a acknowledged is lost: its local copy is a prefix of the database's.
        export = ws.root / f"export-{how}"
        for seg in sorted((a.state / "log").glob("seg-*.jsonl")):
            mine = seg.read_bytes()
            assert (export / seg.name).read_bytes()[: len(mine)] == mine
        _replay_check(ws, b)
        print(
            f"\ntakeover after a lost link ({how} -> first request by the other node), "
            f"lease {LEASE}s: {took_over:.2f}s"
        )


def test_postgresql_restarts_mid_run_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    with private_cluster() as cluster, workspace(tmp_path, jobs=JOBS) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, timeout_seconds=0.5)
        init_log(cluster.dsn)
        a, b = node_config(ws, "a", cluster.dsn), node_config(ws, "b", cluster.dsn)
        _a_active_b_standing_by_jobs_polled(ws, a, b)
        assert a.daemon is not None
        assert b.daemon is not None
        cluster.restart_immediate()
        restarted = len(ws.sim.requests(kind="status"))
        # Polling goes on after the restart (whichever node holds the lease then).
        ws.sim.wait_for_requests(restarted + 2 * len(JOBS), kind="status", timeout=30)
        for d in (b.daemon, a.daemon):  # a standby first, if one is
            if not active(d):
                assert d.stop() == 0
        for d in (a.daemon, b.daemon):
            if d.proc.poll() is None:
                assert d.stop() == 0
        _check_run(ws, cluster.dsn, "restart")
        export = ws.root / "export-restart"
        for node in (a, b):
            for seg in sorted((node.state / "log").glob("seg-*.jsonl")):
                mine = seg.read_bytes()
                assert (export / seg.name).read_bytes()[: len(mine)] == mine, (
                    f"node {node.name}'s copy holds records the database lost"
                )
        _replay_check(ws, a if "lease handed over" in a.daemon.output() else b)
