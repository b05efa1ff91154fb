"""Crypto-shredding, following deploy/README.md "Rotating the data key" step by step with the
real daemon and the real CLI: rotate, stop, delete the snapshot and the old key, start again.

What the old key sealed becomes unreadable for good: the daemon and every reader report those
records by sequence number and leave out their operations (whose ids are sealed with them),
and every other operation goes on being polled and read.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from daemon.config import load_config
from eventlog.reader import LogReader
from tests.e2e.harness import BIDE, Workspace, drop_registration, until, workspace

FAST = (
    'state_pointer = "/status"\nbackoff_base_seconds = 0.1\nbackoff_cap_seconds = 0.2\n'
    "rate_limited_delay_seconds = 1\ndefault_max_status_requests = 1000\n"
)


def _polls(ws: Workspace, job: str) -> int:
    return len([r for r in ws.sim.requests(kind="status") if r.target.endswith("/" + job)])


def _keygen(*args: str) -> None:
    proc = subprocess.run(
        [*BIDE, "keygen", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_crypto_shredding_as_documented(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {f"job-{n}": "running" for n in ("a", "b", "c")}
    with workspace(tmp_path, jobs) as ws:
        keys_dir = tmp_path / "keys"
        ws.write_profile(contract=FAST)
        first = ws.start_daemon()
        drop_registration(ws, "op-a", "job-a")
        drop_registration(ws, "op-b", "job-b")
        until(
            lambda: _polls(ws, "job-a") >= 2 and _polls(ws, "job-b") >= 2,
            what="op-a and op-b polled",
        )

        # "bide keygen --rotate ... ; systemctl restart bide"
        _keygen("--rotate", str(keys_dir))
        retired = list(keys_dir.glob("data-*.key"))
        assert len(retired) == 1
        assert first.stop() == 0
        second = ws.start_daemon()
        drop_registration(ws, "op-c", "job-c")  # new records use the new key
        until(lambda: _polls(ws, "job-c") >= 2, what="op-c polled")

        # "stop bide, delete the snapshot, delete the key, and start bide again"
        assert second.stop() == 0
        shredded_before = _polls(ws, "job-a")  # counted once no daemon polls it any more
        cfg = load_config(str(ws.config))
        cfg.snapshot_path.unlink()
        retired[0].unlink()
        third = ws.start_daemon()
        out = third.output()
        assert "log event left out" in out
        assert "seq=" in out
        assert "no data key with id" in out  # shredded, and said so
        seen = _polls(ws, "job-c")
        until(lambda: _polls(ws, "job-c") >= seen + 2, what="op-c still polled")
        assert _polls(ws, "job-a") == shredded_before  # its registration is gone for good
        assert third.stop() == 0

        # The readers: the other operation reads on. status starts from the snapshot the
        # clean stop wrote (the shredded events lie before it); story reads from record 0 and
        # names every event it leaves out.
        status = ws.bide("status", "--offline")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "op-c" in status.stdout
        assert "op-a" not in status.stdout
        story = ws.bide("story", "op-c", "--offline")
        assert story.returncode == 0, story.stdout + story.stderr
        assert "log event left out" in story.stderr
        assert "seq=" in story.stderr
        log = ws.log()
        assert set(log.ops) == {"op-c"}
        assert log.unreadable
        events = {
            s.seq for s in LogReader(cfg.log_dir).poll() if type(s.record).__name__ == "EventRecord"
        }
        assert {seq for seq, _ in log.unreadable} <= events
        # The chain still verifies with the public key: shredding never breaks it.
        audit = ws.bide("verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr
