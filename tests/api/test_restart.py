"""SIGKILL the daemon while 50 clients wait on it, under socket activation.

The test holds the listening socket as systemd would (``deploy/bide.socket``) and starts
the daemon with it (fd 3, ``LISTEN_FDS``/``LISTEN_PID``). While 50 ``bide wait`` processes
wait and a client keeps registering, the daemon is killed with SIGKILL and started again on
the same socket: every waiter gets its answer from the new daemon (or exits with its
documented code), and every registration acknowledged before the kill is in the log after.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

from daemon.api.client import ApiClient
from daemon.errors import DaemonError
from tests.e2e.harness import BIDE, until, workspace, write_status_profile
from tests.faults.support import metrics_url, scrape

WAITERS = 50
DOCUMENTED = {0, 3, 4, 124, 69}


def test_waiters_survive_a_sigkill_and_acknowledged_registrations_are_kept(tmp_path: Path) -> None:
    jobs = {f"j{i}": "running x30, succeeded with result" for i in range(WAITERS)}
    jobs.update({f"r{i}": "running" for i in range(400)})
    with workspace(
        tmp_path,
        jobs=jobs,
        config_extra='\n[metrics]\nlisten = "127.0.0.1:0"\n',
        api="registrations_per_second = 1000\nregistrations_burst = 1000\n",
    ) as ws:
        # The waited jobs have the quota to themselves; the registrations go to another one.
        ws.write_profile(extra="[quota]\nrequests_per_second = 200\nmax_in_flight = 16\n")
        write_status_profile(ws, "other")
        (tmp_path / "state").mkdir()
        path = tmp_path / "state" / "api.sock"
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        holder.bind(str(path))
        holder.listen(1024)
        try:
            first = ws.start_daemon(listen=holder)
            assert "inherited=True" in first.output()
            with ApiClient(path) as client:
                for i in range(WAITERS):
                    client.call(
                        "POST",
                        "/v1/operations",
                        body={
                            "provider": "sim",
                            "job_id": f"j{i}",
                            "operation_id": f"op-{i}",
                            "deadline_seconds": 300,
                            "max_status_requests": 100,
                        },
                    )
            waiters = [
                subprocess.Popen(
                    [*BIDE, "wait", f"op-{i}", "--timeout", "240s", "--config", str(ws.config)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i in range(WAITERS)
            ]
            url = metrics_url(first)
            until(
                lambda: scrape(url).get("bide_api_waiters", 0) >= WAITERS,
                150,  # 50 CLI processes start (0.3 s of CPU each); slow on a loaded 2-core host
                "every waiter to be waiting in the daemon",
            )

            acknowledged: list[str] = []
            stop = threading.Event()

            def register() -> None:
                with ApiClient(path, timeout=5) as client:
                    for i in range(400):
                        if stop.is_set():
                            return
                        try:
                            client.call(
                                "POST",
                                "/v1/operations",
                                body={
                                    "provider": "other",
                                    "job_id": f"r{i}",
                                    "operation_id": f"reg-{i}",
                                },
                            )
                        except DaemonError:
                            return  # the daemon died under this call: not acknowledged
                        acknowledged.append(f"reg-{i}")

            registering = threading.Thread(target=register)
            registering.start()
            until(lambda: len(acknowledged) >= 20, 30, "registrations to be acknowledged")
            still_waiting = scrape(url).get("bide_api_waiters", 0)
            first.kill()  # SIGKILL, mid-registration and mid-wait
            stop.set()
            registering.join(30)
            kept = list(acknowledged)
            assert still_waiting >= WAITERS / 2, "the jobs ended before the kill: no test"

            ws.start_daemon(listen=holder)
            codes = [w.wait(300) for w in waiters]
            outputs = [w.communicate()[0] for w in waiters]
            assert set(codes) <= DOCUMENTED, (codes, outputs[:3])
            assert codes.count(0) == WAITERS, [
                (c, o) for c, o in zip(codes, outputs, strict=True) if c != 0
            ][:3]
            log = ws.log()
            missing = [op for op in kept if op not in log.ops]
            assert not missing, f"acknowledged, then lost: {missing}"
            assert all(log.ops[f"op-{i}"].phase == "succeeded" for i in range(WAITERS))
        finally:
            holder.close()
