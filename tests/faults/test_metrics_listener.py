"""Too many connections to ``/metrics`` cannot take the daemon down (issue 20, finding 8).

The daemon's file-descriptor limit is lowered (``prlimit``) to a few above what it holds, then
200 clients connect to the metrics port and hold their connections. Extra connections are
closed at once, an ``accept`` that hits EMFILE backs off; the daemon keeps polling, and once
the clients let go a scrape answers again.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.harness import until, workspace
from tests.faults.support import metrics_url, scrape

pytestmark = pytest.mark.skipif(
    shutil.which("prlimit") is None, reason="prlimit (util-linux) lowers the daemon's fd limit"
)


def test_a_flood_of_metrics_connections_leaves_the_daemon_serving(tmp_path: Path) -> None:
    extra = '\n[metrics]\nlisten = "127.0.0.1:0"\n'
    with workspace(tmp_path, {"long": "running"}, config_extra=extra) as ws:
        daemon = ws.start_daemon()
        url = metrics_url(daemon)
        assert (
            ws.watch("long", "long", "--deadline", "5m", "--max-requests", "10000").returncode == 0
        )
        ws.sim.wait_for_requests(2, kind="status", timeout=10)
        pid = daemon.proc.pid
        held = len(os.listdir(f"/proc/{pid}/fd"))
        subprocess.run(
            ["prlimit", f"--pid={pid}", f"--nofile={held + 6}:"],  # soft only
            check=True,
        )
        port = urlsplit(url).port
        assert port is not None
        clients = []
        try:
            for _ in range(200):
                sock = socket.socket()
                sock.settimeout(2)
                try:
                    sock.connect(("127.0.0.1", port))
                except OSError:
                    sock.close()
                    continue
                clients.append(sock)
            before = len(ws.sim.requests(kind="status"))
            time.sleep(2.0)
            assert daemon.proc.poll() is None, daemon.output()[-2000:]
            assert len(ws.sim.requests(kind="status")) > before, "polling stopped"
        finally:
            for sock in clients:
                sock.close()
        subprocess.run(["prlimit", f"--pid={pid}", "--nofile=1024:"], check=True)
        until(lambda: _scrapes(url), timeout=15, what="a scrape to answer again")
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0


def _scrapes(url: str) -> bool:
    try:
        return "bide_status_requests_sent_total" in scrape(url)
    except OSError:
        return False
