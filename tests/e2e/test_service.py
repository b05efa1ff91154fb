"""Running as a system service: the unit, the notify protocol, metrics, permissions, logs."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import until, workspace

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "bide.service"


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_is_notify_with_the_hardening_the_operator_expects() -> None:
    d = _directives(UNIT.read_text())
    assert d["Type"] == ["notify"]
    assert d["StateDirectory"] == ["bide"]
    assert any(v.startswith("data.key:") for v in d["LoadCredential"])
    assert any(v.startswith("signing.key:") for v in d["LoadCredential"])
    expected = {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }
    for key, value in expected.items():
        assert d[key][0] == value, key
    assert "@system-service" in d["SystemCallFilter"]
    assert "WatchdogSec" in d


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
def test_unit_exposure_is_at_most_2() -> None:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= 2.0


def test_notify_ready_status_watchdog_stopping_in_order(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(10)
    try:
        with workspace(tmp_path) as ws:
            daemon = ws.start_daemon({"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "200000"})
            seen: list[str] = []
            while not any(m.startswith("WATCHDOG=1") for m in seen[1:]):
                seen += sock.recv(4096).decode().splitlines()
            assert daemon.stop() == 0
            while "STOPPING=1" not in seen:
                seen += sock.recv(4096).decode().splitlines()
    finally:
        sock.close()
    ready = seen.index("READY=1")
    status = next(i for i, m in enumerate(seen) if m.startswith("STATUS="))
    watchdog = seen.index("WATCHDOG=1")
    assert ready < status < watchdog < seen.index("STOPPING=1")
    assert "0 live" in seen[status]


def test_metrics_from_a_running_daemon(tmp_path: Path) -> None:
    extra = '\n[metrics]\nlisten = "127.0.0.1:0"\n'
    with workspace(
        tmp_path,
        {"m1": "queued, succeeded with result", "m2": [{"status": 401}]},
        config_extra=extra,
    ) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("m1", "m1").returncode == 0
        assert ws.watch("m2", "m2").returncode == 0
        assert ws.bide("wait", "m1", "--timeout", "20s").returncode == 0
        assert ws.bide("wait", "m2", "--timeout", "20s").returncode == 3
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", daemon.output())
        assert m, daemon.output()
        text = httpx.get(m.group(0), timeout=5).text
        assert 'bide_operations{phase="succeeded"} 1' in text
        assert 'bide_operations{phase="escalated"} 1' in text
        assert 'bide_escalations_total{reason="authorization_denied"} 1' in text
        assert 'bide_status_responses_total{provider="sim",outcome="ok"} 2' in text
        assert 'bide_polls_scheduled_total{source="local_backoff"}' in text
        assert "bide_wakeup_lateness_seconds_count" in text
        assert "bide_log_append_seconds_bucket" in text
        assert re.search(r"^bide_log_bytes [1-9]\d*$", text, re.M)
        (tmp_path / "metrics.txt").write_text(text)


def test_log_lines_are_logfmt(tmp_path: Path) -> None:
    with workspace(tmp_path, {"l1": "queued, manual_review"}) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("l1", "l1").returncode == 0
        assert ws.bide("wait", "l1", "--timeout", "20s").returncode == 3
        daemon.stop()
        lines = daemon.output().splitlines()
        assert lines
        for line in lines:
            assert re.match(r'^ts=\S+Z level=(info|warn|error) msg=("[^"]*"|\S+)', line), line


def test_world_writable_decisions_dir_refused(tmp_path: Path) -> None:
    with workspace(tmp_path) as ws:
        ws.start_daemon().stop()
        decisions = tmp_path / "state" / "spool" / "decisions"
        os.chmod(decisions, 0o777)
        daemon = ws.start_daemon(ready=False)
        assert daemon.proc.wait(20) == 2
        assert str(decisions) in daemon.output()
        assert "world-writable" in daemon.output()


def test_group_readable_key_refused(tmp_path: Path) -> None:
    with workspace(tmp_path) as ws:
        os.chmod(tmp_path / "keys" / "signing.key", 0o640)
        daemon = ws.start_daemon(ready=False)
        assert daemon.proc.wait(20) == 2
        until(lambda: "chmod 600" in daemon.output(), what="the fix in the message")
        assert "signing.key" in daemon.output()
        assert "0640" in daemon.output()


def test_deploy_examples_validate() -> None:
    deploy = UNIT.parent
    from daemon.config import load_config
    from daemon.profile import load_profile

    for profile in (deploy / "profiles").glob("*.toml"):
        load_profile(profile)
    cfg = load_config(str(deploy / "bide.toml"))
    assert cfg.state_dir == Path("/var/lib/bide")
    assert cfg.spool.approvers_group == "bide-approvers"
