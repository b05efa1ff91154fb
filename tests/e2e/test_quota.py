"""Many agents, one provider: the shared quota spreads requests out instead of sending waves."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from daemon.spool import RegistrationFile, Spool, new_request_id
from replay.events import PollScheduled, StatusRequestIntended
from replay.observations import Registration
from tests.e2e.harness import DEFAULT_CONTRACT, until, workspace

OPS = 50
RATE = 10.0


def test_fifty_agents_do_not_hit_the_provider_in_waves(tmp_path: Path) -> None:
    jobs = {f"j{i}": "running" for i in range(OPS)}
    with workspace(tmp_path, jobs) as ws:
        ws.write_profile(
            contract=DEFAULT_CONTRACT + "first_poll_after_seconds = 0.2\n",
            extra=f"[quota]\nrequests_per_second = {RATE}\nmax_in_flight = 2\n",
        )
        ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        for i in range(OPS):  # all registered at once, all due at the same moment
            rid = new_request_id()
            reg = Registration(
                operation_id=f"op{i}",
                provider="sim",
                provider_job_id=f"j{i}",
                max_status_requests=1,
            )
            spool.drop(spool.incoming, rid, msgspec.json.encode(RegistrationFile(1, rid, reg)))
        ws.sim.wait_for_requests(OPS, kind="status", timeout=30)
        arrivals = sorted(r.wall for r in ws.sim.requests(kind="status"))
        burst = max(1.0, RATE)
        for i, start in enumerate(arrivals):
            in_window = sum(1 for t in arrivals[i:] if t < start + 1.0)
            assert in_window <= RATE + burst + 1, f"{in_window} requests within 1 s"
        assert arrivals[-1] - arrivals[0] >= (OPS - burst) / RATE * 0.8  # spread, not a wave
        until(
            lambda: (
                len([e for _, e in ws.log().events if isinstance(e, StatusRequestIntended)]) == OPS
            ),
            what="intents",
        )
        log = ws.log()
        held = [
            e
            for _, e in log.events
            if isinstance(e, PollScheduled) and e.delay_source == "local_quota"
        ]
        assert len(held) >= OPS - burst - 1  # each held-back poll is recorded as such
        for ev in held:
            assert ev.next_poll_at <= log.ops[ev.operation_id].deadline_at
        status = json.loads(ws.bide("status", "--json").stdout)
        assert all(op["status_requests_used"] == 1 for op in status)
