"""What the real daemon keeps per ended-and-retired operation, by ``tracemalloc`` (issue 38).

``python -m tests.bench.trace_retention [--rate 20] [--step 1500] [--steps 3] [--top 25]``

``bide run`` (under :mod:`tests.bench.traced_daemon`) against the simulator, retention on
(``ended_after = 1``, ``check_seconds = 0.5``); registrations through the API at ``rate`` a
second, each job answering ``running`` twice then ``succeeded``, as in the retention soak. After
every ``step`` registrations, the driver pauses until every operation has ended and retired
(none live, none ended kept: the same live count each time), then has the daemon write a
snapshot. Printed: the daemon's RSS and traced memory at each snapshot, and the allocations that
grew the most between the first and the last, by traceback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from daemon.api.client import ApiClient
from tests.bench.bench_retention import SOAK_CONTRACT, SOAK_QUOTA, _daemon_rss
from tests.e2e import harness


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def _settled(client: ApiClient) -> bool:
    page: dict[str, list[object]]
    """No operation live or ended-and-kept: everything registered has retired."""
    page = client.call("GET", "/v1/operations", params={"all": "1"})
    return not page["operations"]


def run(rate: float, step: int, steps: int, top: int) -> None:
    total = step * steps
    jobs: dict[str, str | list[object]] = {f"j{n}": "running x2, succeeded" for n in range(total)}
    api = (
        "registrations_per_second = 1000\nregistrations_burst = 1000\n"
        "\n[retention]\nended_after = 1\ncheck_seconds = 0.5\n"
    )
    tmp = Path(tempfile.mkdtemp(prefix="trace-retention-"))
    traces = tmp / "traces"
    traces.mkdir()
    harness.BIDE = [sys.executable, "-m", "tests.bench.traced_daemon", str(traces)]
    rows: list[tuple[int, int, int]] = []
    try:
        with harness.workspace(tmp, jobs=jobs, api=api) as ws:
            ws.write_profile(contract=SOAK_CONTRACT, extra=SOAK_QUOTA)
            root = str(Path(__file__).parents[2])
            daemon = ws.start_daemon(env={"PYTHONPATH": root}, ready=False)
            daemon.wait_ready(timeout=180)
            with ApiClient(ws.root / "state" / "api.sock", timeout=60) as client:
                n = 0
                for k in range(steps):
                    started = time.monotonic()
                    for i in range(step):
                        time.sleep(max(0.0, started + i / rate - time.monotonic()))
                        client.call(
                            "POST",
                            "/v1/operations",
                            body={"provider": "sim", "job_id": f"j{n}", "operation_id": f"op-{n}"},
                        )
                        n += 1
                    _wait(lambda: _settled(client), 120, "operations to retire")
                    time.sleep(1.0)
                    os.kill(daemon.proc.pid, signal.SIGUSR2)
                    done = traces / f"trace-{k}.done"
                    _wait(done.exists, 300, f"{done}")
                    snap = tracemalloc.Snapshot.load(str(traces / f"trace-{k}.snap"))
                    traced = sum(s.size for s in snap.statistics("filename"))
                    rows.append((n, _daemon_rss(daemon.proc.pid), traced))
                    print(f"ended {n}: RSS {rows[-1][1]} KiB, traced {traced / 1024:.0f} KiB")
                    sys.stdout.flush()
            assert daemon.stop() == 0
        first = tracemalloc.Snapshot.load(str(traces / "trace-0.snap"))
        last = tracemalloc.Snapshot.load(str(traces / f"trace-{steps - 1}.snap"))
        ended = rows[-1][0] - rows[0][0]
        print(
            f"per ended operation, {rows[0][0]} -> {rows[-1][0]}: "
            f"RSS {(rows[-1][1] - rows[0][1]) * 1024 / ended:.0f} bytes, "
            f"traced {(rows[-1][2] - rows[0][2]) / ended:.0f} bytes"
        )
        for key in ("lineno", "traceback"):
            print(f"\ngrew most ({key}):")
            for stat in last.compare_to(first, key)[:top]:
                print(f"  {stat.size_diff:+9d} B {stat.count_diff:+6d} blocks  {stat}")
                if key == "traceback":
                    for line in stat.traceback.format(limit=12):
                        print("      " + line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--step", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    a = parser.parse_args()
    run(a.rate, a.step, a.steps, a.top)
