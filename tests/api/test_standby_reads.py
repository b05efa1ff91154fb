"""A standby's answers, in process, over a real log a real daemon wrote: reads from the copy,
writes and a fetched file refused with 503 naming the active node, a copy that is rebuilt
read again from scratch, and the door's answer while the node changes role."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio

from daemon.api.door import ApiDoor
from daemon.api.peer import Peer
from daemon.api.schema import ActiveNode
from daemon.api.server import Request, Response
from daemon.commands.run import build_supervisor
from daemon.config import load_config
from daemon.standby import StandbyReads
from eventlog.store import local_head
from tests.e2e.harness import until, workspace


def _request(method: str, path: str, body: bytes = b"") -> Request:
    peer = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    return Request(method, path, path, {}, {}, body, peer)


def _json(response: Response) -> dict[str, object]:
    value = json.loads(response.body)
    assert isinstance(value, dict)
    return value


def test_a_standby_answers_reads_from_its_copy_and_refuses_writes(tmp_path: Path) -> None:
    # Small segments: the copy is read one segment file at a time.
    with workspace(tmp_path, jobs={"j1": "running"}, config_extra="segment_bytes = 4096\n") as ws:
        daemon = ws.start_daemon()
        assert ws.watch("j1", "op1").returncode == 0
        cfg = load_config(str(ws.config))
        until(lambda: len(list(cfg.log_dir.glob("seg-*"))) >= 3, 30, "three segments")
        daemon.stop()
        head = local_head(cfg.log_dir)
        assert head is not None

        async def main() -> None:
            reads = StandbyReads(cfg, lambda: build_supervisor(cfg, ask_witnesses=False), "b")
            refused = await reads.handle(_request("GET", "/v1/operations/op1"))
            assert refused.status == 503  # not read yet: "loading", never a wrong answer
            assert _json(refused)["error"] == "loading"

            await reads.refresh()
            reads.active = ActiveNode(node="a", holder="a/1/ff", epoch=3)
            got = await reads.handle(_request("GET", "/v1/operations/op1"))
            assert got.status == 200, got.body
            assert _json(got)["phase"] == "live"
            health = _json(await reads.handle(_request("GET", "/v1/health")))
            assert (health["role"], health["live"]) == ("standby", 1)
            assert health["log_head_sequence"] == head[0]
            assert health["active"] == {"node": "a", "holder": "a/1/ff", "epoch": 3}

            for method, path in (
                ("POST", "/v1/operations"),
                ("POST", "/v1/operations/op1/withdrawal"),
                ("POST", "/v1/operations/op1/decision"),
                ("GET", "/v1/fetches/op1.fetch.1/content"),
            ):
                answer = await reads.handle(_request(method, path, b"{}"))
                assert answer.status == 503, (method, path)
                assert (
                    "Retry-After",
                    "10",
                ) in answer.headers  # lease_seconds (10 without [postgres])
                problem = _json(answer)
                assert problem["error"] == "standby"
                assert "the active node is a (epoch 3)" in str(problem["detail"])

            # The lease moved a copy that was not the database's aside and copied it again.
            first = reads.sup
            shutil.copytree(cfg.log_dir, tmp_path / "copy")
            shutil.rmtree(cfg.log_dir)
            (tmp_path / "copy").rename(cfg.log_dir)
            await reads.refresh()
            assert reads.sup is not first  # folded again from record 0
            got = await reads.handle(_request("GET", "/v1/operations/op1"))
            assert got.status == 200, got.body

            door = ApiDoor(cfg)
            door.between("this node took the log (epoch 4) and is starting")
            answer = await door._dispatch(_request("GET", "/v1/health"))
            assert answer.status == 503
            assert ("Retry-After", "1") in answer.headers
            assert _json(answer)["error"] == "changing_role"

        anyio.run(main)
