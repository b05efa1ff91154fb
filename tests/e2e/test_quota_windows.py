"""The provider quota as the provider sees it (issue 14): with ``requests_per_second = R`` no
window of L seconds at the provider holds more than ``ceil(R * L)`` requests, checked at every
request's arrival in the simulator's log; with ``burst = B``, at most ``B - 1`` more."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from daemon.spool import RegistrationFile, Spool, new_request_id
from replay.observations import Registration
from tests.e2e.harness import DEFAULT_CONTRACT, workspace

WINDOWS = (1.0, 2.0, 10.0)


def most_in_window(arrivals: list[float], length: float) -> int:
    """The most arrivals in any half-open window ``[t, t + length)`` that starts at one."""
    arrivals = sorted(arrivals)
    most, end = 0, 0
    for start, t in enumerate(arrivals):
        end = max(end, start)
        while end < len(arrivals) and arrivals[end] < t + length:
            end += 1
        most = max(most, end - start)
    return most


def test_most_in_window_counts_half_open_windows() -> None:
    assert most_in_window([0.0, 0.5, 1.0, 1.2], 1.0) == 3  # [0.5, 1.5)
    assert most_in_window([0.0, 1.0, 2.0], 1.0) == 1
    assert most_in_window([0.0, 0.0, 0.999, 1.0], 1.0) == 3
    assert most_in_window([], 1.0) == 0


@pytest.mark.parametrize(
    ("jobs", "rate", "burst"),
    [
        pytest.param(50, 8, 1, id="50-jobs-8-per-s"),
        pytest.param(50, 8, 5, id="50-jobs-8-per-s-burst-5"),
        pytest.param(500, 50, 1, id="500-jobs-50-per-s"),
    ],
)
def test_no_window_at_the_provider_exceeds_the_quota(
    tmp_path: Path, jobs: int, rate: int, burst: int
) -> None:
    script = {f"j{i}": "running" for i in range(jobs)}
    with workspace(tmp_path, script) as ws:
        ws.write_profile(
            contract=DEFAULT_CONTRACT + "first_poll_after_seconds = 0.2\n",
            extra=f"[quota]\nrequests_per_second = {rate}\nburst = {burst}\nmax_in_flight = 4\n",
        )
        ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        for i in range(jobs):  # registered in one instant: all due at the same moment
            rid = new_request_id()
            reg = Registration(
                operation_id=f"op{i}",
                provider="sim",
                provider_job_id=f"j{i}",
                max_status_requests=1,
                first_poll_after_seconds=0.2,
            )
            spool.drop(spool.incoming, rid, msgspec.json.encode(RegistrationFile(1, rid, reg)))
        ws.sim.wait_for_requests(jobs, kind="status", timeout=jobs / rate * 2 + 30)
        arrivals = [r.wall for r in ws.sim.requests(kind="status")]
        assert len(arrivals) == jobs
        for length in WINDOWS:
            allowed = burst - 1 + math.ceil(rate * length)
            seen = most_in_window(arrivals, length)
            print(
                f"{jobs} jobs, {rate}/s, burst {burst}: at most {seen} requests in any "
                f"{length:g} s window (allowed {allowed})"
            )
            assert seen <= allowed, f"{seen} requests within {length:g} s (allowed {allowed})"
        # Not slower than the quota needs either: the whole round takes about jobs / rate.
        spread = max(arrivals) - min(arrivals)
        assert spread <= (jobs - burst) / rate * 1.3 + 1.0, f"{jobs} requests took {spread:.1f}s"


def test_submits_take_their_turn_in_the_same_quota(tmp_path: Path) -> None:
    """Status polls and submits of one provider share one quota: 2 requests/s in all."""
    from tests.e2e.test_actions import submit_profile  # the submit-capable sim profile

    scenarios = {"scenarios": {"quick": {"steps": "running, running, running"}}}
    with workspace(tmp_path, **scenarios) as ws:  # type: ignore[arg-type]
        submit_profile(ws)
        profile = tmp_path / "profiles" / "sim.toml"
        profile.write_text(
            profile.read_text() + "\n[quota]\nrequests_per_second = 2\nmax_in_flight = 4\n"
        )
        ws.start_daemon()
        body = tmp_path / "body.json"
        body.write_bytes(b'{"scenario": "quick"}')
        for n in range(4):
            done = ws.bide(
                "submit",
                "--provider",
                "sim",
                "--body",
                str(body),
                "--force",
                "--operation",
                f"s{n}",
                "--deadline",
                "1m",
                "--wait-seconds",
                "0",
            )
            assert done.returncode in (0, 75), done.stdout + done.stderr
        ws.sim.wait_for_requests(4, kind="submit", timeout=30)
        ws.sim.wait_for_requests(4, kind="status", timeout=30)
        arrivals = [r.wall for r in ws.sim.requests() if r.kind in ("submit", "status")]
        assert most_in_window(arrivals, 1.0) <= 2, sorted(arrivals)
        assert most_in_window(arrivals, 2.0) <= 4, sorted(arrivals)
