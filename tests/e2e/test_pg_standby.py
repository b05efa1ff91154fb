"""A standby node answers on its own socket, and a takeover shows in the story (issue 37).

Two real ``bide run`` nodes on one PostgreSQL log, against the simulator: the standby says
it is a standby and names the active node (health, ``bide status``), answers reads from its
copy of the log (the operation registered through the active node), refuses writes with 503
naming the active node; after the active node is killed with SIGKILL while an operation is
live, the standby takes over and the operation's story says so, with the node and epoch.
"""

from __future__ import annotations

import json
import subprocess
import time
from functools import partial
from pathlib import Path

import httpx

from daemon.config import load_config
from tests.e2e.harness import (
    BIDE,
    SHORT_LEASE,
    Workspace,
    until,
    workspace,
    write_status_profile,
)
from tests.e2e.pgnodes import Node, node_config, standby, start, wait_active

JOBS: dict[str, str | list[object]] = {"long": "running"}
#: Polls about once a second, for long enough that the operation is live throughout.
CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
backoff_base_seconds = 0.5
backoff_cap_seconds = 1.0
default_deadline_seconds = 300
default_max_status_requests = 500
"""


def _bide(ws: Workspace, node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*BIDE, *args, "--config", str(node.config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ws.root,
    )
    ws.outputs += [out.stdout, out.stderr]
    return out


def _api(node: Node) -> httpx.Client:
    socket = load_config(str(node.config)).socket_path
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://bide")


def _two_nodes(ws: Workspace) -> tuple[Node, Node]:
    assert ws.dsn is not None
    write_status_profile(
        ws, "sim", contract=CONTRACT, timeout_seconds=0.5
    )  # fits in the short lease
    a, b = node_config(ws, "a", ws.dsn), node_config(ws, "b", ws.dsn)
    start(ws, a)
    wait_active([a])
    until(partial(standby, start(ws, b)), 20, "node b to stand by")
    return a, b


def test_a_standby_answers_reads_from_its_copy_and_refuses_writes(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs=JOBS, store="postgres", lease=SHORT_LEASE) as ws:
        a, b = _two_nodes(ws)
        out = _bide(ws, a, "watch", "--provider", "sim", "--job", "long", "--operation", "op1")
        assert out.returncode == 0, out.stdout + out.stderr

        registered = time.monotonic()
        with _api(b) as api:
            # Its copy catches up with the round committed through the active node.
            until(lambda: api.get("/v1/operations/op1").status_code == 200, 20, "op1 on b")
            lag = time.monotonic() - registered
            view = api.get("/v1/operations/op1").json()
            assert (view["operation_id"], view["phase"]) == ("op1", "live")

            health = api.get("/v1/health").json()
            assert health["role"] == "standby"
            assert health["status"] == "ok"
            assert health["active"]["node"] == "a"
            assert health["active"]["epoch"] == 1
            assert health["live"] == 1

            listed = api.get("/v1/operations").json()["operations"]
            assert [o["operation_id"] for o in listed] == ["op1"]
            assert api.get("/v1/escalations").status_code == 200
            story = api.get("/v1/operations/op1/story").json()
            assert story["lines"][0]["text"].startswith("registered job")

            refused = api.post(
                "/v1/operations",
                json={"operation_id": "op2", "provider": "sim", "job_id": "long"},
            )
            assert refused.status_code == 503
            assert int(refused.headers["Retry-After"]) >= 1
            problem = refused.json()
            assert problem["error"] == "standby"
            assert "the active node is a (epoch 1)" in problem["detail"]

        status = _bide(ws, b, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].startswith("standby; active node a (epoch 1)")
        assert lines[1].startswith("op1  sim/long  live")
        assert "not running" not in status.stdout + status.stderr

        as_json = _bide(ws, b, "status", "op1", "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout)["phase"] == "live"

        write = _bide(ws, b, "watch", "--provider", "sim", "--job", "long", "--operation", "op3")
        assert write.returncode != 0
        assert "standby" in write.stderr
        assert "active node is a (epoch 1)" in write.stderr
        assert "not running" not in write.stderr
        print(f"\nregistered through a, readable on standby b after {lag:.3f}s (polled)")
        print(status.stdout + write.stderr)


def test_a_takeover_while_an_operation_is_live_is_in_its_story(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs=JOBS, store="postgres", lease=SHORT_LEASE) as ws:
        a, b = _two_nodes(ws)
        out = _bide(ws, a, "watch", "--provider", "sim", "--job", "long", "--operation", "op1")
        assert out.returncode == 0, out.stdout + out.stderr
        ws.sim.wait_for_requests(1, kind="status", timeout=20)
        with _api(b) as api:
            until(lambda: api.get("/v1/operations/op1").status_code == 200, 20, "op1 on b")
        assert a.daemon is not None
        assert b.daemon is not None
        a.daemon.kill()
        assert wait_active([b], timeout=30) is b

        def told() -> bool:
            story = _bide(ws, b, "story", "op1")
            return "taken over by node b (epoch 2)" in story.stdout

        until(told, 20, "the takeover in op1's story")
        story = _bide(ws, b, "story", "op1").stdout.splitlines()
        took = next(i for i, line in enumerate(story) if "taken over by node b" in line)
        assert 0 < took < len(story)
        assert story[0].split(" ", 1)[1].startswith("registered job")
        print("\n" + "\n".join(story[max(0, took - 1) : took + 2]))

        health = _bide(ws, b, "status")
        assert health.returncode == 0
        assert not health.stdout.startswith("standby")  # b is the active node now
