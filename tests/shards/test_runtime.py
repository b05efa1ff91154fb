"""Real ``bide run`` nodes on a sharded PostgreSQL log against the simulator
(daemon.shards.runtime): the nodes split the shards, a joiner gets its share by graceful
handover (no lease timeout), a SIGKILLed node's shards are taken once their leases run out,
and the operations registered on the way keep being polled to their end; every shard's chain
verifies with ``verify.pub`` alone."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from daemon.spool import Spool
from eventlog.envelope import Checkpoint, Genesis
from eventlog.epochs import EPOCHS_DIR
from eventlog.nodekeys import NODE_DIR
from eventlog.pgstore import PgSettings
from eventlog.shards import Layout, layout_of
from replay.events import StatusRequestIntended
from tests.e2e.harness import (
    BIDE,
    LeaseTimes,
    Workspace,
    assert_provider_invariants,
    drop_registration,
    exported,
    until,
    verify_dsn,
    workspace,
)
from tests.e2e.pgnodes import Node, epoch_starts, epochs_of, loaded, node_config, start
from tests.eventlog._logtools import read_lines

SHARDS = 4
#: A SIGKILLed node's shards move after at most 3 s.
LEASE = LeaseTimes(seconds=3.0, renew=0.5, margin=0.2)
JOBS: dict[str, str | list[object]] = {
    f"job-{i}": "running x30, succeeded with result" for i in range(8)
}
_LINE = re.compile(r'^ts=(\S+) level=\S+ msg="(shard taken|shard released)" (.*)$', re.M)


@pytest.fixture
def sharded_dsn(pg_dsn: str) -> str:
    out = subprocess.run(
        [*BIDE, "log", "init", "--dsn", pg_dsn, "--shards", str(SHARDS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return pg_dsn


def _layout(dsn: str) -> Layout:
    return layout_of(PgSettings(dsn))


def _holders(dsn: str) -> dict[int, str]:
    """shard -> the node whose unexpired lease holds it (the database's word)."""
    layout = _layout(dsn)
    got: dict[int, str] = {}
    with psycopg.connect(dsn) as conn:
        for k in range(layout.count):
            row = conn.execute(
                f'SELECT holder FROM "{layout.schema(k)}".bide_lease WHERE expires_at > now()'
            ).fetchone()
            if row is not None and row[0]:
                got[k] = str(row[0]).split("/", 1)[0]
    return got


def _loads(dsn: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for who in _holders(dsn).values():
        out[who] = out.get(who, 0) + 1
    return out


def _api(node: Node) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(node.state / "api.sock"))
    return httpx.Client(transport=transport, base_url="http://bide", timeout=10.0)


def _moves(node: Node) -> list[tuple[str, int, float, str]]:
    """(what, shard, when, why) for each shard taken or released, from the node's log."""
    assert node.daemon is not None
    out = []
    for ts, what, rest in _LINE.findall(node.daemon.output()):
        fields = dict(re.findall(r"(\w+)=(\S+)", rest))
        when = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        out.append((what, int(fields["shard"]), when, fields.get("why", "")))
    return out


def _joined(node: Node) -> tuple[float, dict[str, str]]:
    """When the node was counted in the fair share ("node joined"), and that line's fields."""
    assert node.daemon is not None
    found = re.search(r'ts=(\S+) level=info msg="node joined" (.*)', node.daemon.output())
    assert found is not None, node.daemon.output()
    when = datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
    return when, dict(re.findall(r"(\w+)=(\S+)", found.group(2)))


def _register(nodes: list[Node], op: str, job: str) -> None:
    """Through the API of the node that holds the operation's shard (the others' standby
    reads refuse a write with 503; so does a holder still opening the shard)."""
    body = {"operation_id": op, "provider": "sim", "job_id": job, "max_status_requests": 60}
    answers: list[tuple[str, int, str]] = []

    def registered() -> bool:
        answers.clear()
        for node in nodes:
            with _api(node) as api:
                answer = api.post("/v1/operations", json=body)
            if answer.status_code in (200, 201):
                return True
            assert answer.status_code == 503, answer.text
            answers.append((node.name, answer.status_code, answer.text[:200]))
        return False

    until(registered, 20, f"a node to register {op}")


def _phase(node: Node, op: str) -> str:
    with _api(node) as api:
        answer = api.get(f"/v1/operations/{op}")
    return str(answer.json().get("phase", "")) if answer.status_code == 200 else ""


def _check_provider_side(ws: Workspace, dsn: str, ops: dict[str, str]) -> None:
    """From the simulator's request log, per shard: every request has an earlier durable
    intent in its shard's chain, within budget; no request made under a shard's epoch
    arrived after that shard's next epoch began (no operation polled by two nodes at once,
    a paused node sent nothing after resuming)."""
    layout = _layout(dsn)
    for op, job in ops.items():
        shard_dsn = layout.settings(PgSettings(dsn), layout.shard_of(op)).dsn
        _, log = loaded(shard_dsn, ws, f"{op}-{time.monotonic_ns()}")
        received = ws.sim.requests(kind="status", job_id=job)
        assert received
        assert_provider_invariants(log, received, op, strict=False)
        epochs, starts = epochs_of(shard_dsn), epoch_starts(shard_dsn)
        intents = [
            (seq, ev)
            for seq, ev in log.events
            if isinstance(ev, StatusRequestIntended) and ev.operation_id == op
        ]
        for record in received:
            seq = [s for s, i in intents if i.at <= record.wall][-1]
            later = starts.get(epochs[seq] + 1)
            assert later is None or record.wall < later, (op, record.wall, later)


def _verify_every_shard(ws: Workspace, dsn: str) -> None:
    layout = _layout(dsn)
    for k in range(layout.count):
        shard_dsn = layout.settings(PgSettings(dsn), k).dsn
        out = verify_dsn(ws.root, shard_dsn)
        assert out.returncode == 0, f"shard {k}: {out.stdout}{out.stderr}"


def test_nodes_split_hand_over_take_a_dead_nodes_shards_and_leave_gracefully(
    tmp_path: Path, sharded_dsn: str
) -> None:
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a, b, c = (node_config(ws, name, dsn, lease=LEASE) for name in ("a", "b", "c"))
        start(ws, a)
        start(ws, b)
        # Two nodes: two shards each.
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 30, "a and b to hold two shards each")

        ops = {f"op-{i}": f"job-{i}" for i in range(8)}
        layout = _layout(dsn)
        by_name = {n.name: n for n in (a, b, c)}
        receipts: list[tuple[Spool, str, str]] = []
        for i, (op, job) in enumerate(ops.items()):
            if i % 2:
                _register([a, b], op, job)
                continue
            # Through the spool of the node holding the operation's shard (bide watch).
            holder = by_name[_holders(dsn)[layout.shard_of(op)]]
            spool = Spool(holder.state / "spool")
            rid = drop_registration(ws, op, job, spool=spool, max_status_requests=60)
            receipts.append((spool, rid, op))

        def registered() -> bool:
            return all(_phase(a, op) or _phase(b, op) for op in ops)

        until(registered, 20, "every operation registered")
        for spool, rid, op in receipts:  # the receipt in the node's spool, as bide watch reads
            receipt = spool.read_receipt(rid)
            assert receipt is not None
            assert (receipt.status, receipt.operation_id) == ("registered", op)

        # A third node joins: its fair share (a=2, b=1, c=1) comes by handover from b.
        joined = time.time()
        start(ws, c)
        until(
            lambda: _loads(dsn) == {"a": 2, "b": 1, "c": 1},
            20,
            "c to get its share by handover",
        )
        until(lambda: _moves(c), 20, "c to start its shard")
        released = [m for m in _moves(b) if m[0] == "shard released" and m[2] >= joined]
        assert [(m[1], m[3]) for m in released] == [(released[0][1], "handover")]
        moved = released[0][1]
        taken = [m for m in _moves(c) if m[0] == "shard taken"]
        assert [m[1] for m in taken] == [moved]
        # Taken at once after the handover, not after b's lease ran out.
        handover_seconds = taken[0][2] - released[0][2]
        assert 0 <= handover_seconds < 1.5, handover_seconds
        assert [m for m in _moves(a) if m[2] >= joined] == []  # a moved nothing
        # c was counted (and so handed a shard) only once its copy of every shard had caught
        # up: the taker replays a tail, it does not copy a whole log while nobody polls.
        counted_at, fields = _joined(c)
        assert fields["copied"] == "4", fields
        assert released[0][2] >= counted_at, (released, counted_at)

        # SIGKILL c: its shard is b's again, once c's lease on it has run out.
        assert c.daemon is not None
        killed = time.time()
        c.daemon.kill()
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 20, "b to take c's shard")
        until(lambda: [m for m in _moves(b) if m[2] >= killed], 20, "b to start c's shard")
        again = [m for m in _moves(b) if m[0] == "shard taken" and m[2] >= killed]
        assert [m[1] for m in again] == [moved], _moves(b)
        after_kill = again[0][2] - killed
        assert LEASE.seconds - LEASE.renew - 0.3 <= after_kill < LEASE.seconds + 2.0, after_kill

        # a leaves gracefully: b takes its shards as a hands each over, not after a lease.
        assert a.daemon is not None
        leaving = time.time()
        assert a.daemon.stop(30) == 0, a.daemon.output()
        until(lambda: _loads(dsn) == {"b": 4}, 20, "b to take a's shards")
        until(lambda: len(_taken_since(b, leaving)) == 2, 20, "b to start a's shards")
        handed = {m[1]: m[2] for m in _moves(a) if m[0] == "shard released" and m[2] >= leaving}
        assert {m[3] for m in _moves(a) if m[2] >= leaving} == {"stopping"}
        leave_seconds = [m[2] - handed[m[1]] for m in _taken_since(b, leaving)]
        assert sorted(handed) == sorted(m[1] for m in _taken_since(b, leaving))
        assert all(0 <= s < 1.5 for s in leave_seconds), leave_seconds
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT node FROM bide_nodes WHERE node = 'a'").fetchall() == []
        # The moves' figures, for the closing note (shown with pytest -s or -rP).
        print(
            f"shard moves: join handover {handover_seconds:.3f} s, SIGKILL {after_kill:.3f} s, "
            f"graceful leave {', '.join(f'{s:.3f}' for s in leave_seconds)} s "
            f"(release or kill to the taker's ready)"
        )

        # Every operation was polled to its end across the moves.
        def ended() -> bool:
            return all(_phase(b, op) == "succeeded" for op in ops)

        until(ended, 60, "every operation to succeed")
        assert b.daemon is not None
        assert b.daemon.stop(30) == 0, b.daemon.output()
        for node in (a, b):
            assert "shard fenced" not in _output(node)
        assert _holders(dsn) == {}  # every lease handed over on the way out
        with psycopg.connect(dsn) as conn:
            left = conn.execute("SELECT node FROM bide_nodes WHERE node IN ('a', 'b')")
            assert left.fetchall() == []
        _verify_every_shard(ws, dsn)
        _check_provider_side(ws, dsn, ops)


def _taken_since(node: Node, since: float) -> list[tuple[str, int, float, str]]:
    return [m for m in _moves(node) if m[0] == "shard taken" and m[2] >= since]


def _output(node: Node) -> str:
    assert node.daemon is not None
    return node.daemon.output()


def _metrics_url(node: Node) -> str:
    assert node.daemon is not None
    found = re.search(r'msg="metrics listening" address=(\S+)', node.daemon.output())
    assert found is not None, node.daemon.output()
    return found.group(1)


def test_a_paused_node_is_fenced_per_shard_carries_on_and_gets_its_share_back(
    tmp_path: Path, sharded_dsn: str
) -> None:
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a, b = (node_config(ws, name, dsn, lease=LEASE) for name in ("a", "b"))
        with a.config.open("a") as f:
            f.write('\n[metrics]\nlisten = "127.0.0.1:0"\n')
        start(ws, a)
        start(ws, b)
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 30, "a and b to hold two shards each")
        ops = {f"op-{i}": f"job-{i}" for i in range(8)}
        for op, job in ops.items():
            _register([a, b], op, job)

        # The node's page: each active shard's series labelled with its shard, the node's own.
        until(lambda: len([m for m in _moves(a) if m[0] == "shard taken"]) >= 2, 20, "a's shards")
        mine = sorted(k for k, who in _holders(dsn).items() if who == "a")
        assert mine
        pages: list[str] = []

        def polled_everywhere() -> bool:
            # Each of a's shards answered by the provider (the first polls wait for the
            # node's first slice of the provider's quota).
            pages[:] = [httpx.get(_metrics_url(a), timeout=10).text]
            return all(
                re.search(rf'^bide_status_responses_total{{shard="{k}",', pages[0], re.M)
                for k in mine
            )

        until(polled_everywhere, 20, "a's shards to poll")
        page = pages[0]
        assert "bide_node_active 1" in page
        assert "bide_node_shards_held 2" in page
        for k in mine:
            assert re.search(rf'^bide_lease_epoch{{shard="{k}"}} [1-9]', page, re.M), page
        assert re.search(r'^bide_provider_quota_slice_rps{provider="sim"} ', page, re.M), page
        assert page.count("# TYPE bide_node_active ") == 1
        # The shards' engines run without edges: one listener, one socket, for the node.
        assert _output(a).count('msg="metrics listening"') == 1
        assert _output(a).count('msg="api listening"') == 1
        assert list((a.state / "shards").glob("*/api.sock")) == []
        families = [line.split()[2] for line in page.splitlines() if line.startswith("# TYPE")]
        assert len(families) == len(set(families))  # each family once, samples together

        # b paused past its leases: a takes every shard once they have run out.
        assert b.daemon is not None
        b.daemon.proc.send_signal(signal.SIGSTOP)
        until(lambda: _loads(dsn) == {"a": 4}, 20, "a to take b's shards")
        b.daemon.proc.send_signal(signal.SIGCONT)
        # b's terms are refused per shard (fenced), b stays up, and gets its share back by
        # a's handover.
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 30, "b to get its share back")
        until(lambda: "shard fenced" in _output(b), 10, "b's terms to end fenced")
        assert b.daemon.proc.poll() is None
        released = [m for m in _moves(a) if m[0] == "shard released"]
        assert {m[3] for m in released} == {"handover"}

        def ended() -> bool:
            return all(_phase(b, op) == "succeeded" for op in ops)

        until(ended, 60, "every operation to succeed")
        for node in (a, b):
            assert node.daemon is not None
            assert node.daemon.stop(30) == 0, node.daemon.output()
        assert _holders(dsn) == {}
        _verify_every_shard(ws, dsn)
        _check_provider_side(ws, dsn, ops)


def test_run_check_reads_every_shard(tmp_path: Path, sharded_dsn: str) -> None:
    with workspace(tmp_path, {}) as ws:
        node = node_config(ws, "a", sharded_dsn, lease=LEASE)
        ok = subprocess.run(
            [*BIDE, "run", "--check", "--config", str(node.config)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"{SHARDS} shards (0 held now)" in ok.stdout
        # A shard's schema gone: named, with the fix.
        layout = _layout(sharded_dsn)
        with psycopg.connect(sharded_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{layout.schema(2)}" CASCADE')
        bad = subprocess.run(
            [*BIDE, "run", "--check", "--config", str(node.config)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert bad.returncode == 78, bad.stdout + bad.stderr
        assert f"shard 2 ({layout.schema(2)})" in bad.stdout + bad.stderr
        assert "bide log init" in bad.stdout + bad.stderr


def test_one_live_process_per_node_name(tmp_path: Path, sharded_dsn: str) -> None:
    dsn = sharded_dsn
    with workspace(tmp_path, {}) as ws:
        a = node_config(ws, "a", dsn, lease=LEASE)
        start(ws, a)
        until(lambda: _loads(dsn) == {"a": SHARDS}, 30, "a to hold every shard")
        # Another process under the same name (its own state directory) takes nothing.
        twin = node_config(ws, "twin", dsn, lease=LEASE)
        twin.config.write_text(twin.config.read_text().replace('node = "twin"', 'node = "a"'))
        start(ws, twin)
        until(lambda: "a node of this name is live" in _output(twin), 20, "the twin to wait")
        assert "node joined" not in _output(twin)
        assert twin.daemon is not None
        assert twin.daemon.stop(20) == 0
        # a killed and started again at once: it joins once its old heartbeat ran out, and
        # takes every shard back once the old process's leases have.
        assert a.daemon is not None
        killed = time.time()
        a.daemon.kill()
        start(ws, a)
        until(lambda: "node joined" in _output(a), 20, "a to join again")
        assert "a node of this name is live" in _output(a)
        until(lambda: len(_taken_since(a, killed)) == SHARDS, 30, "a to take every shard")
        assert min(m[2] for m in _taken_since(a, killed)) - killed >= LEASE.seconds - 1.0
        assert a.daemon.stop(30) == 0
        assert _holders(dsn) == {}


def test_enrolled_nodes_sign_every_shard_with_their_own_keys(
    tmp_path: Path, sharded_dsn: str
) -> None:
    """forward_secure (the default with PostgreSQL): each node enrolled once, the root key
    offline; every shard's takeovers are signed by the holder's node key, every shard
    verifies, and no node keeps a shard's epoch key after its term."""
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a, b = (node_config(ws, name, dsn, lease=LEASE) for name in ("node-a", "node-b"))
        for n in (a, b):
            n.config.write_text(n.config.read_text().replace("forward_secure = false\n", ""))
            out = ws.root / f"enrolled-{n.name}"
            done = subprocess.run(
                [
                    *BIDE,
                    "node",
                    "enroll",
                    "--name",
                    n.name,
                    "--keys-dir",
                    "keys",
                    "--out",
                    str(out),
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
                cwd=ws.root,
            )
            assert done.returncode == 0, done.stderr
            (n.state / NODE_DIR).mkdir(mode=0o700, parents=True)
            for path in out.iterdir():
                shutil.copy2(path, n.state / NODE_DIR / path.name)
        (ws.root / "keys" / "signing.key").rename(ws.root / "offline-signing.key")
        start(ws, a)
        start(ws, b)
        until(lambda: _loads(dsn) == {"node-a": 2, "node-b": 2}, 30, "two shards each")
        ops = {f"op-{i}": f"job-{i}" for i in range(4)}
        for op, job in ops.items():
            _register([a, b], op, job)
        assert a.daemon is not None
        assert a.daemon.stop(30) == 0, a.daemon.output()  # b takes a's shards by handover
        until(lambda: _loads(dsn) == {"node-b": 4}, 20, "b to take a's shards")
        until(lambda: len(_taken_since(b, 0)) >= 4, 20, "b to start them")
        assert b.daemon is not None
        assert b.daemon.stop(30) == 0, b.daemon.output()

        layout = _layout(dsn)
        signers: set[str] = set()
        for k in range(layout.count):
            shard_dsn = layout.settings(PgSettings(dsn), k).dsn
            lines = read_lines(exported(shard_dsn, ws, f"fs-{k}"))
            takeovers = [
                ln.record for ln in lines if isinstance(ln.record, Checkpoint) and ln.record.holder
            ]
            # The genesis certified by its creator's node key; each later term's takeover
            # by its holder's (a first term goes on with the genesis's epoch key).
            genesis = lines[0].record
            assert isinstance(genesis, Genesis)
            assert genesis.cert is not None
            signed = [genesis.cert.node] + [cp.cert.node for cp in takeovers if cp.cert]
            assert set(signed) <= {"node-a", "node-b"}
            if len(takeovers) > 1:  # moved: the later holder's key signed its takeover
                assert takeovers[-1].cert is not None
                assert takeovers[-1].cert.node == takeovers[-1].holder.split("/")[0]
            signers |= set(signed)
        assert signers == {"node-a", "node-b"}
        _verify_every_shard(ws, dsn)
        for n in (a, b):
            left = [p for p in (n.state / "shards").glob(f"*/{EPOCHS_DIR}/*") if p.is_file()]
            assert left == [], left


def test_an_agent_registers_and_waits_through_a_node_not_holding_the_shard(
    tmp_path: Path, sharded_dsn: str
) -> None:
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a, b = (node_config(ws, name, dsn, lease=LEASE) for name in ("a", "b"))
        start(ws, a)
        start(ws, b)
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 30, "a and b to hold two shards each")
        until(lambda: len(_taken_since(a, 0)) + len(_taken_since(b, 0)) >= 4, 20, "shards up")
        layout = _layout(dsn)
        by_name = {"a": a, "b": b}
        for i in range(4):
            op = f"op-{i}"
            holder = _holders(dsn)[layout.shard_of(op)]
            other = by_name["b" if holder == "a" else "a"]
            body: dict[str, object] = {"operation_id": op, "provider": "sim", "job_id": f"job-{i}"}
            body["max_status_requests"] = 60
            with _api(other) as api:
                answer = api.post("/v1/operations", json=body)
            assert answer.status_code in (200, 201), answer.text
            # ... and waits there, answered from that node's copy of the shard's log.

            def ended(node: Node = other, op: str = op) -> bool:
                return _phase(node, op) == "succeeded"

            until(ended, 60, f"{op} to succeed, read through {other.name}")
        for n in (a, b):
            assert n.daemon is not None
            assert n.daemon.stop(30) == 0, n.daemon.output()
        _verify_every_shard(ws, dsn)


def test_a_spool_file_for_a_shard_held_elsewhere_is_rejected_with_the_way_to_send_it(
    tmp_path: Path, sharded_dsn: str
) -> None:
    """A registration dropped in the spool of a node not holding its shard is not lost: it
    waits two lease lengths for this node to take the shard, then is moved to
    spool/rejected with a receipt that says how to send it (the API relays it); one for a
    held shard is registered as before. ``bide watch`` with no daemon answering on a
    sharded node says what will happen to the file."""
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a, b = (node_config(ws, name, dsn, lease=LEASE) for name in ("a", "b"))
        start(ws, a)
        start(ws, b)
        until(lambda: _loads(dsn) == {"a": 2, "b": 2}, 30, "a and b to hold two shards each")
        until(lambda: len(_taken_since(a, 0)) + len(_taken_since(b, 0)) >= 4, 20, "shards up")
        layout = _layout(dsn)
        holders = _holders(dsn)
        elsewhere = next(
            f"op-{i}" for i in range(100) if holders[layout.shard_of(f"op-{i}")] == "b"
        )
        here = next(f"op-{i}" for i in range(100) if holders[layout.shard_of(f"op-{i}")] == "a")
        spool = Spool(a.state / "spool")
        dropped = time.monotonic()
        lost = drop_registration(ws, elsewhere, "job-0", spool=spool, max_status_requests=60)
        kept = drop_registration(ws, here, "job-1", spool=spool, max_status_requests=60)

        until(lambda: spool.read_receipt(lost) is not None, 20, "the file held elsewhere answered")
        waited = time.monotonic() - dropped
        receipt = spool.read_receipt(lost)
        assert receipt is not None
        assert receipt.status == "rejected", receipt
        assert waited >= 2 * LEASE.seconds - 0.5, waited  # it waited for the shard first
        reason = receipt.reason or ""
        shard = layout.shard_of(elsewhere)
        assert f"shard {shard}, held by node b" in reason, reason
        assert "bide watch" in reason, reason
        assert "relays the request" in reason, reason
        assert (spool.rejected / f"{lost}.json").exists()
        kept_reason = (spool.rejected / f"{lost}.json.reason").read_text()
        assert kept_reason.strip() == reason
        assert (_phase(a, elsewhere), _phase(b, elsewhere)) == ("", "")  # nothing recorded
        got = spool.read_receipt(kept)
        assert got is not None
        assert (got.status, got.operation_id) == ("registered", here)

        # Through the API of the same node the same registration is relayed and recorded.
        with _api(a) as api:
            body = {"operation_id": elsewhere, "provider": "sim", "job_id": "job-0"}
            answer = api.post("/v1/operations", json=body)
        assert answer.status_code == 201, answer.text
        assert _phase(a, elsewhere) == "live"

        for n in (a, b):
            assert n.daemon is not None
            assert n.daemon.stop(30) == 0, n.daemon.output()
        # No daemon answers: bide watch drops the file and says what a sharded node does.
        out = subprocess.run(
            [
                *BIDE,
                *("watch", "--provider", "sim", "--job", "job-2", "--operation", "later"),
                *("--wait-seconds", "0.5", "--config", str(a.config)),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ws.root,
        )
        assert out.returncode == 75, out.stdout + out.stderr
        said = out.stdout + out.stderr
        assert "sharded log" in said, said
        assert "spool/rejected" in said, said
        assert "run this command again" in said, said


def test_a_shard_whose_term_fails_does_not_end_the_node(tmp_path: Path, sharded_dsn: str) -> None:
    """The barrier: one shard's term failing on something else than fencing (here its local
    log locked by another process, as a fenced term's writer left it before the writer's close
    was fixed) is logged, that shard goes back to standby, and the node carries on with the
    others; once the cause is gone the shard is taken like any other."""
    dsn = sharded_dsn
    with workspace(tmp_path, JOBS) as ws:
        a = node_config(ws, "a", dsn, lease=LEASE)
        log = a.state / "shards" / "001" / "log"
        log.mkdir(mode=0o700, parents=True)
        holder = subprocess.Popen(
            [
                "python3",
                "-c",
                "import fcntl, os, sys\n"
                f"fd = os.open({str(log / 'LOCK')!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "print('held', flush=True)\n"
                "sys.stdin.read()\n",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            start(ws, a)
            until(lambda: "shard term failed" in _output(a), 30, "shard 1's term to fail")
            assert "shard=1 " in next(
                line for line in _output(a).splitlines() if "shard term failed" in line
            )
            assert "LockedError" in _output(a)
            until(
                lambda: {k for k, who in _holders(dsn).items() if who == "a"} >= {0, 2, 3},
                30,
                "a to hold the other shards",
            )
            assert a.daemon is not None
            assert a.daemon.proc.poll() is None, a.daemon.output()
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
        # The lock gone: shard 1 is taken once the failed term's lease has run out.
        until(lambda: ("shard taken", 1) in {m[:2] for m in _moves(a)}, 30, "a to take shard 1 too")
        assert _loads(dsn) == {"a": SHARDS}
        op = "op-barrier"
        _register([a], op, "job-0")
        assert a.daemon.stop(30) == 0, a.daemon.output()
        assert _holders(dsn) == {}
