"""Wall-clock jumps under a running daemon, with libfaketime on the daemon process only.

Deadlines and ``next_poll_at`` are UTC wall-clock times (persisted); the daemon's sleeps are on
the monotonic clock. libfaketime is preloaded into ``bide run`` with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, so only ``CLOCK_REALTIME`` moves: its offset is read from a
file the test rewrites (``FAKETIME_TIMESTAMP_FILE``, ``FAKETIME_NO_CACHE=1``). The simulator and
the test itself keep the real clock.

* Forward past the deadline: the next wake-up (a monotonic timer, so it comes on time) stops
  the operation with ``deadline_exceeded``; no request goes out after the jump.
* Forward for an operation whose deadline is far: no burst (timers are monotonic, one wake-up
  sends at most one request).
* Backward: no burst either, and no poll delayed by the jump: the wait between two polls is an
  interval on the monotonic clock (the intent records ``due_by_timer``); only deadlines are
  wall-clock facts.

(libfaketime breaks ``time.sleep`` -- ``clock_nanosleep`` with ``TIMER_ABSTIME`` fails with
EINVAL -- but the daemon never calls it: its sleeps are the event loop's ``epoll_wait``.)
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

from replay.events import OperationStopped, PollScheduled, StatusRequestIntended
from tests.e2e.harness import STATES, Workspace, until, workspace

LIBFAKETIME = next(
    iter(
        sorted(
            glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
            + glob.glob("/usr/lib/faketime/libfaketime.so.1")
            + glob.glob("/usr/local/lib/faketime/libfaketime.so.1")
        )
    ),
    None,
)

pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None,
    reason="libfaketime not installed (apt-get install -y faketime); it moves the daemon's "
    "wall clock without touching its monotonic clock",
)

# Polls every 0.5-1.0 s: at most 2 requests a second per operation, so a burst shows.
CONTRACT = """\
state_pointer = "/status"
backoff_base_seconds = 1.0
backoff_cap_seconds = 1.0
rate_limited_delay_seconds = 2.0
min_hint_seconds = 0.05
"""
SHORT = {"short-1": "op-short-1", "short-2": "op-short-2"}
LONG = ("long", "op-long")
MAX_PER_WINDOW = 2.0  # requests per second per operation the backoff allows


def _faked(ws: Workspace, offset_file: Path) -> dict[str, str]:
    assert LIBFAKETIME is not None
    offset_file.write_text("+0\n")
    return {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _jump(offset_file: Path, offset: str) -> None:
    tmp = offset_file.with_suffix(".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, offset_file)


def _requests(ws: Workspace, job: str) -> int:
    return len(ws.sim.requests(kind="status", job_id=job))


def _stops(ws: Workspace) -> dict[str, OperationStopped]:
    return {e.operation_id: e for _, e in ws.log().events if isinstance(e, OperationStopped)}


def _waiting(ws: Workspace, op: str) -> bool:
    """Whether ``op`` is between polls: its last event schedules the next one (no request of
    its is in flight, so the next one is decided against a wait that spans a jump made now)."""
    mine = [e for _, e in ws.log().events if e.operation_id == op]
    return bool(mine) and isinstance(mine[-1], PollScheduled)


def test_wall_clock_jumps_forward_and_back(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = dict.fromkeys([*SHORT, LONG[0]], "running")
    with workspace(tmp_path, jobs) as ws:
        (tmp_path / "profiles" / "sim.toml").write_text(
            f'[status]\nurl = "{ws.sim.base_url}/jobs/{{job_id}}"\ntimeout_seconds = 2\n\n'
            f'[credential]\nfile = "sim.token"\n\n[contract]\n{CONTRACT}\n{STATES}'
        )
        offset_file = tmp_path / "faketime.offset"
        daemon = ws.start_daemon(_faked(ws, offset_file))
        for job, op in SHORT.items():
            assert ws.watch(job, op, "--deadline", "10m", "--max-requests", "1000").returncode == 0
        assert (
            ws.watch(LONG[0], LONG[1], "--deadline", "1d", "--max-requests", "10000").returncode
            == 0
        )
        for job in jobs:
            ws.sim.wait_for_requests(2, kind="status", job_id=job, timeout=20)

        # Forward two hours: past the short deadlines, not the long one.
        long_before = _requests(ws, LONG[0])
        _jump(offset_file, "+2h")
        jumped = time.monotonic()
        until(
            lambda: set(SHORT.values()) <= set(_stops(ws)),
            timeout=10,
            what="deadline_exceeded for both short operations",
        )
        stopped_within = time.monotonic() - jumped
        stops = _stops(ws)
        intents = [e for _, e in ws.log().events if isinstance(e, StatusRequestIntended)]
        for op in SHORT.values():
            assert stops[op].reason == "deadline_exceeded", stops[op]
            late = [i for i in intents if i.operation_id == op and i.at >= i.deadline_at]
            assert late == [], f"{op}: a request was intended after its deadline"
        assert stopped_within < 1.0 + 1.5, "the stop did not come at the next wake-up"
        short_counts = {job: _requests(ws, job) for job in SHORT}
        window = 3.0
        time.sleep(window)
        assert {job: _requests(ws, job) for job in SHORT} == short_counts, (
            "a stopped operation was polled again"
        )
        sent = _requests(ws, LONG[0]) - long_before
        assert sent <= MAX_PER_WINDOW * (window + stopped_within) + 1, (
            f"burst after a forward jump: {sent} requests"
        )
        assert LONG[1] not in _stops(ws)

        # Backward one hour (from +2h to +1h): never a burst, and no wait stretched by the
        # hour either: the wait between two polls is an interval (issue 14).
        # The jump lands while the operation waits (waits are 0.5-1.0 s, a poll a few ms): a
        # jump during a request would leave no wait for the timer to measure across it.
        until(lambda: _waiting(ws, LONG[1]), timeout=10, what="the long operation between polls")
        long_before = _requests(ws, LONG[0])
        _jump(offset_file, "+1h")
        time.sleep(window)
        sent = _requests(ws, LONG[0]) - long_before
        assert sent <= MAX_PER_WINDOW * window + 1, f"burst after a backward jump: {sent}"
        assert sent >= window / 1.0 - 1, f"polls stopped after a backward jump: {sent}"
        assert LONG[1] not in _stops(ws)
        by_timer = [
            e for _, e in ws.log().events if isinstance(e, StatusRequestIntended) and e.due_by_timer
        ]
        assert by_timer, "no intent records that the monotonic timer made it due"
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
        checked = ws.bide("replay", "--check")
        assert checked.returncode == 0, checked.stdout
