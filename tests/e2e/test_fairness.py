"""One agent cannot starve another (issue 20, finding 7): with 200 operations of one
registrant due at once on a provider, another registrant's 5 are polled within their share of
the quota, not after the 200. Registrants are the spool files' owners (the test chowns them);
the quota still holds at the provider."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec
import pytest

from daemon.spool import RegistrationFile, Spool, new_request_id
from replay.observations import Registration
from tests.e2e.harness import DEFAULT_CONTRACT, until, workspace
from tests.e2e.test_quota_windows import most_in_window

RATE = 10
BUSY, QUIET = 4242, 4343  # uids of the two registrants (no user names needed)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns spool files to two uids")


def _register(spool: Spool, op: str, job: str, owner: int, deadline_at: float) -> None:
    rid = new_request_id()
    reg = Registration(
        operation_id=op,
        provider="sim",
        provider_job_id=job,
        max_status_requests=2,
        first_poll_after_seconds=0.0,
        deadline_at=deadline_at,
    )
    staging = spool.root / f".{rid}"
    staging.write_bytes(msgspec.json.encode(RegistrationFile(1, rid, reg)))
    os.chown(staging, owner, -1)
    os.rename(staging, spool.incoming / f"{rid}.json")


def test_a_busy_agent_does_not_starve_a_quiet_one(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {f"b{i}": "running" for i in range(200)}
    jobs.update({f"q{i}": "running" for i in range(5)})
    with workspace(tmp_path, jobs) as ws:
        ws.write_profile(
            contract=DEFAULT_CONTRACT,
            extra=f"[quota]\nrequests_per_second = {RATE}\nmax_in_flight = 4\n",
        )
        ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        now = time.time()
        for i in range(200):
            _register(spool, f"busy-{i}", f"b{i}", BUSY, now + 120)
        until(
            lambda: len(ws.sim.requests(kind="status")) >= 5,
            timeout=30,
            what="the busy agent's polls to start",
        )
        started = time.monotonic()
        for i in range(5):
            _register(spool, f"quiet-{i}", f"q{i}", QUIET, time.time() + 8)
        quiet = {f"q{i}" for i in range(5)}
        until(
            lambda: quiet <= {r.job_id for r in ws.sim.requests(kind="status")},
            timeout=8,
            what="every quiet operation's first poll",
        )
        took = time.monotonic() - started
        # Fair shares: two registrants, so the quiet one waits about one second of quota
        # (its share) plus its own five polls, never the busy one's 200 (20 s at 10/s).
        assert took < 5.0, f"the quiet agent's polls waited {took:.1f} s"
        status = json.loads(ws.bide("status", "--all", "--json").stdout)
        owners = {op["operation_id"].split("-")[0]: op["registered_by"] for op in status}
        assert owners == {"busy": f"uid:{BUSY}", "quiet": f"uid:{QUIET}"}
        arrivals = [r.wall for r in ws.sim.requests(kind="status")]
        assert most_in_window(arrivals, 1.0) <= RATE
