"""Retention end to end: the real daemon with a one-second ``[retention] ended_after``.

An operation that ended leaves the daemon's memory: the API answers 410 naming
``bide story OP --offline``, which still tells its whole story from the log; a retry of its
registration, through the API or the spool, is answered the same way every time (another
request under its id is a conflict); after a restart the snapshot holds a tombstone, not
the operation; a live operation is untouched throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.api.client import ApiCallError, ApiClient
from daemon.config import load_config
from daemon.readers import open_keyring
from daemon.signing import snapshot_keys
from daemon.snapshots import load_snapshot
from eventlog import keys
from replay.ledger import Ledger
from tests.api.test_api import api, watch
from tests.e2e.harness import (
    Workspace,
    assert_snapshot_is_the_full_fold,
    drop_registration,
    until,
    workspace,
)
from tests.faults.support import metrics_url, scrape

RETENTION = "\n[retention]\nended_after = 1\ncheck_seconds = 0.2\n"
METRICS = '\n[metrics]\nlisten = "127.0.0.1:0"\n'


def _gone(client: ApiClient, path: str) -> ApiCallError:
    with pytest.raises(ApiCallError) as gone:
        client.call("GET", path)
    return gone.value


def _retired(client: ApiClient, op: str) -> bool:
    try:
        client.call("GET", f"/v1/operations/{op}")
    except ApiCallError as exc:
        return exc.status == 410
    return False


def _snapshot_ledger(ws: Workspace) -> Ledger:
    cfg = load_config(str(ws.config))
    keyring = open_keyring(cfg)
    snap = load_snapshot(
        cfg.snapshot_path, keyring, snapshot_keys(cfg, keys.keys_directory(cfg.keys_dir))
    )
    assert snap is not None
    return snap.ledger


def test_an_ended_operation_retires_and_its_story_stays_in_the_log(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {"j-done": "succeeded with result", "j-live": "running"}
    with workspace(
        tmp_path, jobs=jobs, api="allow_self_approval = true\n" + RETENTION, config_extra=METRICS
    ) as ws:
        daemon = ws.start_daemon()
        with api(ws) as client:
            first = watch(client, "op-done", "j-done", deadline_seconds=60)
            assert first["created"] is True
            watch(client, "op-live", "j-live", deadline_seconds=600, max_status_requests=5000)
            until(lambda: _retired(client, "op-done"), 20, "the ended operation to retire")

            gone = _gone(client, "/v1/operations/op-done")
            assert (gone.status, gone.error) == (410, "operation_retired")
            assert "bide story op-done --offline" in gone.detail
            assert _gone(client, "/v1/operations/op-done/story").status == 410
            # A retry of the same registration: the same answer, every time.
            for _ in range(2):
                with pytest.raises(ApiCallError) as again:
                    watch(client, "op-done", "j-done", deadline_seconds=60)
                assert (again.value.status, again.value.error) == (410, "operation_retired")
            with pytest.raises(ApiCallError) as other:
                watch(client, "op-done", "another-job")
            assert (other.value.status, other.value.error) == (409, "operation_id_in_use")
            live = client.call("GET", "/v1/operations/op-live")
            assert live["phase"] == "live"
            listed = client.call("GET", "/v1/operations")
            assert [op["operation_id"] for op in listed["operations"]] == ["op-live"]
        assert scrape(metrics_url(daemon))["bide_operations_retired_total"] == 1

        # The spool's retry (the same provider and job): refused, the reason beside the file.
        drop_registration(ws, "op-done", "j-done")
        rejected = load_config(str(ws.config)).spool_dir / "rejected"
        until(lambda: list(rejected.glob("*.reason")), 20, "the spool's retry to be refused")
        (reason,) = [p.read_text() for p in rejected.glob("*.reason")]
        assert "bide story op-done --offline" in reason

        offline = ws.bide("story", "op-done", "--offline")
        assert offline.returncode == 0, offline.stderr
        assert "succeeded" in offline.stdout
        assert "retired from the daemon's memory" in offline.stdout
        status = ws.bide("status", "op-done", "--offline")
        assert status.returncode == 2
        assert "bide story op-done --offline" in status.stderr

        assert ws.daemons[0].stop() == 0
        ledger = _snapshot_ledger(ws)
        assert_snapshot_is_the_full_fold(ws)
        assert "op-done" not in ledger.ops
        assert ledger.tombstones.get("op-done") is not None
        assert ledger.ops["op-live"].phase == "live"

        ws.start_daemon()
        with api(ws) as client:
            with pytest.raises(ApiCallError) as after:
                watch(client, "op-done", "j-done", deadline_seconds=60)
            assert (after.value.status, after.value.error) == (410, "operation_retired")
            assert client.call("GET", "/v1/operations/op-live")["phase"] == "live"
        assert ws.bide("replay", "--check").returncode == 0
