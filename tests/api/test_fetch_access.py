"""Who may fetch a result, how often, and how much of them the daemon keeps: real daemons,
the simulator's result downloads, real Unix users (prefix ``bidea``) on the API and the spool."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import msgspec
import pytest

from daemon.api.client import ApiCallError
from daemon.spool import FetchFile, Spool, new_request_id
from replay.events import ActionIntended, ActionSucceeded
from tests.api.test_api import api, watch
from tests.e2e.harness import Workspace, until, workspace
from tests.unixusers import as_user, python_for_everyone, shared_dir, unix_users, why_not

GROUPS = ("bidea-fagents", "bidea-fapi")
USERS: dict[str, tuple[str, ...]] = {"bidea-f1": GROUPS, "bidea-f2": GROUPS}
CONFIG = """
[spool]
agents_group = "bidea-fagents"
"""
API = 'socket_group = "bidea-fapi"\nsocket_mode = "0660"\n'


def _intents(ws: Workspace) -> list[ActionIntended]:
    return [e for e in ws.log().action_events if isinstance(e, ActionIntended)]


def _spool_fetch(ws: Workspace, op: str, owner: int | None = None) -> str:
    """A fetch request dropped in the spool, owned by ``owner`` (who asks, for the daemon)."""
    spool = Spool(ws.root / "state" / "spool")
    rid = new_request_id()
    data = msgspec.json.encode(FetchFile(1, rid, "fetch", op, None))
    if owner is None:
        spool.drop(spool.incoming, rid, data)
        return rid
    tmp = spool.incoming / f".{rid}.tmp"  # a dot-file: the daemon takes it once renamed
    tmp.write_bytes(data)
    tmp.chmod(0o640)
    os.chown(tmp, owner, -1)
    tmp.rename(spool.incoming / f"{rid}.json")
    return rid


def _reason(ws: Workspace, rid: str) -> str:
    spool = Spool(ws.root / "state" / "spool")
    until(lambda: spool.read_receipt(rid) is not None, what=f"the answer to {rid}")
    receipt = spool.read_receipt(rid)
    assert receipt is not None
    assert receipt.status == "rejected", receipt
    return receipt.reason or ""


@pytest.mark.skipif(why_not() is not None, reason=why_not() or "")
def test_only_the_registrant_fetches_and_the_requester_is_recorded() -> None:
    with unix_users(USERS, GROUPS) as users, shared_dir() as shared:
        f1, f2 = users["bidea-f1"], users["bidea-f2"]
        python = python_for_everyone(shared)
        root = shared / "ws"
        root.mkdir()
        out = shared / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o1777)
        with workspace(
            root,
            jobs={"j1": "succeeded with result"},
            server={"result_size": 3000},
            config_extra=CONFIG,
            api=API,
        ) as ws:
            os.chmod(ws.config, 0o644)
            ws.start_daemon()
            registered = as_user(
                ws, python, f1, "watch", "--provider", "sim", "--job", "j1", "--operation", "op-f1"
            )
            assert registered.returncode == 0, registered.stdout + registered.stderr
            assert as_user(ws, python, f1, "wait", "op-f1", "--timeout", "20s").returncode == 0

            # Another agent, through the API: the operation does not exist for them.
            theirs = as_user(ws, python, f2, "fetch", "op-f1", "--to", str(out / "f2.bin"))
            assert theirs.returncode == 1, theirs.stdout + theirs.stderr
            assert "no operation 'op-f1'" in theirs.stdout
            assert not (out / "f2.bin").exists()
            # ... and through the spool: the file's owner is who asks.
            rid = _spool_fetch(ws, "op-f1", owner=f2.uid)
            assert "no operation 'op-f1'" in _reason(ws, rid)
            assert ws.sim.requests(kind="result") == []  # the credential never left for them
            assert _intents(ws) == []

            mine = as_user(ws, python, f1, "fetch", "op-f1", "--to", str(out / "f1.bin"), "--json")
            assert mine.returncode == 0, mine.stdout + mine.stderr
            data = (out / "f1.bin").read_bytes()
            assert len(data) == 3000
            assert (out / "f1.bin").stat().st_uid == f1.uid
            [intent] = _intents(ws)
            assert (intent.requested_by, intent.requested_by_uid) == ("bidea-f1", f1.uid)
            [done] = [e for e in ws.log().action_events if isinstance(e, ActionSucceeded)]
            assert hashlib.sha256(data).hexdigest() == done.sha256
            assert "requested by bidea-f1" in ws.bide("story", "op-f1").stdout
            check = ws.bide("replay", "--check")
            assert check.returncode == 0, check.stdout + check.stderr


def test_fetches_are_limited_per_user_with_a_typed_refusal(tmp_path: Path) -> None:
    config = "[fetch]\nper_principal_per_minute = 1\nburst = 2\n"
    with workspace(tmp_path, jobs={"j1": "succeeded with result"}, config_extra=config) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-1", "j1")
            assert client.call("GET", "/v1/operations/op-1", params={"wait": "20s"})["done"]
            for _ in range(2):
                answer = client.call("POST", "/v1/operations/op-1/fetch", params={"wait": "20s"})
                assert answer["status"] == "fetched"
            with pytest.raises(ApiCallError) as limited:
                client.call("POST", "/v1/operations/op-1/fetch")
            assert (limited.value.status, limited.value.error) == (429, "fetch_rate_limited")
            assert "per_principal_per_minute" in limited.value.detail
        rid = _spool_fetch(ws, "op-1")  # the spool is the same door
        assert "per_principal_per_minute" in _reason(ws, rid)
        assert len(ws.sim.requests(kind="result")) == 2


def test_results_are_pruned_by_age_and_total_size(tmp_path: Path) -> None:
    config = "[fetch]\nresults_max_bytes = 5000\nresults_max_age_seconds = 3600\n"
    with workspace(
        tmp_path,
        jobs={"j1": "succeeded with result"},
        server={"result_size": 2000},
        config_extra=config,
    ) as ws:
        results = tmp_path / "state" / "results"
        results.mkdir(parents=True)
        stale = results / "left-from-last-week"
        stale.write_bytes(b"x" * 10)
        os.utime(stale, (time.time() - 7 * 86400, time.time() - 7 * 86400))
        ws.start_daemon()
        assert not stale.exists()  # pruned by age at start
        with api(ws) as client:
            watch(client, "op-1", "j1")
            assert client.call("GET", "/v1/operations/op-1", params={"wait": "20s"})["done"]
            for _ in range(4):
                answer = client.call("POST", "/v1/operations/op-1/fetch", params={"wait": "20s"})
                assert answer["status"] == "fetched"
            kept = sorted(p.name for p in results.iterdir())
            assert kept == ["op-1.fetch.3", "op-1.fetch.4"]  # 4000 bytes of the cap's 5000
            gone = client.call("GET", "/v1/fetches/op-1.fetch.1")
            assert gone["status"] == "fetched"
            with pytest.raises(ApiCallError) as refused:
                client.download("/v1/fetches/op-1.fetch.1/content", lambda _: None)
            assert (refused.value.status, refused.value.error) == (410, "result_gone")


def test_a_fetch_recorded_before_the_requester_was_decodes_and_replays() -> None:
    old = {
        "type": "action_intended",
        "operation_id": "op",
        "at": 1.0,
        "action_id": "op.fetch.1",
        "kind": "fetch",
        "provider": "sim",
        "method": "GET",
        "url": "https://x/r",
        "timeout_seconds": 5.0,
        "max_bytes": 10,
        "result_name": "result_url",
    }
    decoded = msgspec.json.decode(msgspec.json.encode(old), type=ActionIntended)
    assert (decoded.requested_by, decoded.requested_by_uid) == ("", None)
