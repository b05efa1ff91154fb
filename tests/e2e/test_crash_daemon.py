"""The crash suite: the real daemon SIGKILLed at seeded random moments, again and again.

60 operations on a mix of scripted jobs (successes after a few polls, 503 and 429 with short
Retry-After, 429 without it, 404 then success, unknown states, slow answers inside and past the
client timeout, jobs that never finish) are registered through the spool while ``bide run`` is
started and killed with SIGKILL 36 times. The moments are drawn from ``random.Random(SEED)``
in three kinds: while it starts up (replay, recovery of in-flight intents, spool scan), right
after a status request reached the provider (the request is in flight), and at a random time,
with registrations dropped just before some kills. A final clean run lets every operation end
(deadlines are a few seconds) and stops with SIGTERM.

Then, for the whole run: every operation either succeeded or stopped with an escalation; the
log verifies offline (a torn tail left by a kill was quarantined by the next start) and
``replay --check`` re-derives every decision; every operation was registered exactly once and
every receipt says so; and for every operation, what the provider received is covered request
by request by durable intents (``received <= intended <= budget``), none after the deadline,
none before the schedule bide had recorded (``assert_provider_invariants``, non-strict: an
intent may die before its request leaves, never the other way round).

Two short deterministic kills run outside the ``slow`` selection: a Retry-After still honoured
by the restarted daemon, and a deadline that passed while the daemon was down.

Every test runs once per store (the ``store`` fixture). With the log in PostgreSQL the daemon is
a node: a killed node holds the lease until it expires and its restart (a new holder) waits it
out, so the lease is short (``SHORT_LEASE``: 2 s, renewed every 0.5 s) and the status timeout
(``TIMEOUT``) well under what is left of it between renewals; a start-up kill comes after the
node took the lease (before, it is a standby, not starting up); and the log is also verified
in the database (``bide verify --dsn``).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from daemon.config import load_config
from daemon.spool import Spool
from replay.events import (
    EscalationRaised,
    NodeTookOver,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    RequestOutcomeUnknown,
    StatusRequestIntended,
)
from tests.e2e.harness import (
    SHORT_LEASE,
    Daemon,
    Workspace,
    assert_log_verifies,
    assert_provider_invariants,
    assert_snapshot_is_the_full_fold,
    drop_registration,
    until,
    workspace,
    write_status_profile,
)

# Another seed for exploring: BIDE_CRASH_SEED=N pytest tests/e2e/test_crash_daemon.py -s
SEED = int(os.environ.get("BIDE_CRASH_SEED", "52025"))
OPERATIONS = 60
KILLS = 36
DEADLINE = 6.0  # the contract's default deadline, from each registration
TIMEOUT = 1.0  # the status timeout: fits the short lease's 1.5 s between renewals, with margin

CONTRACT = f"""\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{{ name = "result_url", pointer = "/result_url", kind = "url" }}]
next_check_at_pointer = "/next_check_at"
poll_after_seconds_pointer = "/poll_after_seconds"
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.6
rate_limited_delay_seconds = 1.2
min_hint_seconds = 0.05
not_found_grace_seconds = 5
default_deadline_seconds = {DEADLINE}
default_max_status_requests = 10
default_max_transport_failures = 3
default_max_rate_limited = 3
"""
QUOTA = "[quota]\nrequests_per_second = 1000\nburst = 1000\nmax_in_flight = 64\n"

MIX: dict[str, str | list[object]] = {
    "quick": "queued x2, running, succeeded with result",
    "retry-after": [{"status": 503, "retry_after": 1}, "running", "succeeded with result"],
    "retry-date": [{"status": 503, "retry_after_date": 1}, "succeeded with result"],
    "429-retry-after": [{"status": 429, "retry_after": 1}, "running", "succeeded with result"],
    "429-bare": [{"status": 429}, "succeeded with result"],
    "eventual-404": [{"status": 404, "times": 2}, "succeeded with result"],
    "unknown": "queued, manual_review",
    "slow": [{"delay": 0.4, "state": "running"}, "running", "succeeded with result"],
    "too-slow": [{"delay": 2.5, "state": "running"}, "succeeded with result"],
    "hinted": [{"state": "running", "poll_after_seconds": 1}, "succeeded with result"],
    "long": "running",
}


def _kill_moment(rng: random.Random, ws: Workspace, daemon: Daemon) -> str:
    """Wait for the drawn moment (the daemon is ready); returns what kind it was."""
    if rng.random() < 0.4:
        seen = len(ws.sim.requests(kind="status"))
        try:
            ws.sim.wait_for_requests(seen + 1, kind="status", timeout=2.0)
        except TimeoutError:
            return "idle"
        time.sleep(rng.uniform(0.0, 0.05))
        return "in_flight"
    time.sleep(rng.uniform(0.0, 0.9))
    return "timed"


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_duplicates_nothing(
    tmp_path: Path, store: str
) -> None:
    """S31: every meaningful event is durable before the next step, so a SIGKILL at any moment
    loses nothing acknowledged and repeats no request the log does not explain."""
    rng = random.Random(SEED)
    kinds = sorted(MIX)
    plan = {f"op-{n:02d}": rng.choice(kinds) for n in range(OPERATIONS)}
    jobs = {f"job-{op[3:]}": MIX[kind] for op, kind in plan.items()}
    pending = list(plan)
    rids: dict[str, str] = {}
    moments: Counter[str] = Counter()
    started = time.monotonic()

    # Frequent snapshots: most restarts fold a snapshot plus the events after it.
    with workspace(
        tmp_path, jobs, config_extra="snapshot_every = 30\n", store=store, lease=SHORT_LEASE
    ) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, extra=QUOTA, timeout_seconds=TIMEOUT)
        spool = Spool(load_config(str(ws.config)).spool_dir)

        def register(count: int) -> None:
            for op in pending[:count]:
                rids[op] = drop_registration(ws, op, f"job-{op[3:]}")
            del pending[:count]

        for _ in range(KILLS):
            if rng.random() < 0.2:  # during start-up: replay, recovery, the spool scan
                daemon = ws.start_daemon(ready=False)
                ws.wait_writer(daemon)
                time.sleep(rng.uniform(0.05, 0.5))
                moments["start-up"] += 1
            else:
                daemon = ws.start_daemon()
                time.sleep(rng.uniform(0.0, 0.3))
                register(rng.randint(1, 3))
                moments[_kill_moment(rng, ws, daemon)] += 1
            daemon.kill()  # SIGKILL

        final = ws.start_daemon()
        register(len(pending))
        until(
            lambda: all(spool.read_receipt(r) for r in rids.values()),
            timeout=30,
            what="a receipt for every registration",
        )

        def ended() -> bool:
            ops = ws.log().ops
            return set(ops) == set(plan) and all(o.phase != "live" for o in ops.values())

        until(ended, timeout=60, what="every operation to end")
        time.sleep(1.0)  # a request after an operation ended would land here
        assert final.stop() == 0, final.output()
        loop_seconds = time.monotonic() - started

        # -- the log: it verifies, and every decision re-derives ------------------------------
        assert_log_verifies(ws)
        checked = ws.bide("replay", "--check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "0 mismatch" in checked.stdout
        assert_snapshot_is_the_full_fold(ws)
        resumed = sum(bool(re.search(r"from_snapshot=[1-9]", d.output())) for d in ws.daemons)
        assert resumed > 0
        log = ws.log()
        events = [e for _, e in log.events]

        # -- registrations: each exactly once, each answered ---------------------------------
        registered = Counter(e.operation_id for e in events if isinstance(e, OperationRegistered))
        assert set(registered) == set(plan)
        assert all(n == 1 for n in registered.values()), registered.most_common(3)
        polled_by = Counter(e.provider_job_id for e in events if isinstance(e, OperationRegistered))
        assert all(n == 1 for n in polled_by.values())
        for op_name, rid in rids.items():
            receipt = spool.read_receipt(rid)
            assert receipt is not None
            assert (receipt.status, receipt.operation_id) == ("registered", op_name), receipt
        assert list(spool.incoming.iterdir()) == []
        assert list(spool.rejected.iterdir()) == []
        assert {r.job_id for r in ws.sim.requests(kind="status")} <= set(jobs)

        # -- every operation ended: success, or a stop with its escalation -------------------
        outcomes: Counter[str] = Counter()
        for op_id, op in log.ops.items():
            mine = [e for e in events if e.operation_id == op_id]
            if op.phase == "succeeded":
                assert any(isinstance(e, OperationSucceeded) for e in mine)
                outcomes["succeeded"] += 1
                continue
            assert op.phase == "escalated", f"{op_id} ended {op.phase}"
            assert op.stop_reason is not None
            assert any(isinstance(e, OperationStopped) and e.reason == op.stop_reason for e in mine)
            # The escalation is the last decision; a takeover after it (postgres) is noted only.
            decisions = [e for e in mine if not isinstance(e, NodeTookOver)]
            assert isinstance(decisions[-1], EscalationRaised)
            assert decisions[-1].reason == op.stop_reason
            outcomes[op.stop_reason] += 1

        # -- the provider's side: received <= intended <= budget, none after the deadline ----
        received_total = intended_total = 0
        for op_id, op in log.ops.items():
            received = ws.sim.requests(kind="status", job_id=op.provider_job_id)
            intents = assert_provider_invariants(log, received, op_id, strict=False)
            assert len(received) <= len(intents) <= op.max_status_requests
            assert all(r.wall <= op.deadline_at for r in received)
            received_total += len(received)
            intended_total += len(intents)
        assert intended_total == sum(isinstance(e, StatusRequestIntended) for e in events)

        unknown = sum(isinstance(e, RequestOutcomeUnknown) for e in events)
        torn = sum("torn log tail quarantined" in d.output() for d in ws.daemons)
        undecided = sum(d.output().count("decided a fact left undecided") for d in ws.daemons)
        print(
            f"\ncrash suite ({store}, seed {SEED}): {KILLS} SIGKILLs "
            f"({dict(sorted(moments.items()))}), {len(ws.daemons)} daemon starts, "
            f"{len(plan)} operations, {loop_seconds:.0f} s"
        )
        print(f"  outcomes: {dict(outcomes.most_common())}")
        print(
            f"  status requests: {received_total} received by the provider, {intended_total} "
            f"intended; {unknown} outcomes recorded unknown after a kill; "
            f"{undecided} facts decided after a kill between the two appends; "
            f"{torn} torn log tails quarantined; {resumed} starts resumed from a snapshot"
        )
        print(f"  mix: {dict(Counter(plan.values()).most_common())}")


def test_retry_after_is_honoured_across_a_sigkill(tmp_path: Path, store: str) -> None:
    """Killed while waiting out a Retry-After: the restarted daemon still waits it out (S20).

    The Retry-After (4 s) outlasts the restart, a PostgreSQL node's wait for the killed one's
    lease included, so the restarted daemon is up while it still runs."""
    jobs: dict[str, str | list[object]] = {
        "ra": [{"status": 503, "retry_after": 4}, "succeeded with result"]
    }
    with workspace(tmp_path, jobs, store=store, lease=SHORT_LEASE) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, extra=QUOTA, timeout_seconds=TIMEOUT)
        daemon = ws.start_daemon()
        drop_registration(ws, "ra", "ra")
        [first] = ws.sim.wait_for_requests(1, kind="status", job_id="ra", timeout=10)
        until(
            lambda: ws.committed_log().ops["ra"].not_before is not None,
            what="the Retry-After recorded",
        )
        daemon.kill()
        ws.start_daemon()
        restarted = time.time()
        until(lambda: ws.log().ops["ra"].phase == "succeeded", what="success after the restart")
        log = ws.log()
        [_, second] = ws.sim.requests(kind="status", job_id="ra")
        not_before = log.ops["ra"].not_before
        assert not_before is not None
        assert not_before >= first.wall + 4
        assert restarted < not_before, "the restart came after the Retry-After: nothing tested"
        assert second.wall >= not_before, "the restart polled before Retry-After expired"
        assert_provider_invariants(log, [first, second], "ra")


def test_deadline_passed_while_down_stops_without_a_request(tmp_path: Path, store: str) -> None:
    """Killed, restarted after the deadline: a stop, never a late request (S9, S16)."""
    with workspace(tmp_path, {"slowpoke": "running"}, store=store, lease=SHORT_LEASE) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, extra=QUOTA, timeout_seconds=TIMEOUT)
        daemon = ws.start_daemon()
        drop_registration(ws, "slowpoke", "slowpoke", deadline_at=time.time() + 1.5)
        ws.sim.wait_for_requests(1, kind="status", job_id="slowpoke", timeout=10)
        daemon.kill()
        deadline = ws.log().ops["slowpoke"].deadline_at
        until(lambda: time.time() > deadline + 0.3, what="the deadline to pass")
        seen = len(ws.sim.requests(kind="status", job_id="slowpoke"))
        ws.start_daemon()
        until(lambda: ws.log().ops["slowpoke"].phase == "escalated", what="the stop")
        time.sleep(0.5)
        log = ws.log()
        op = log.ops["slowpoke"]
        assert op.stop_reason == "deadline_exceeded"
        received = ws.sim.requests(kind="status", job_id="slowpoke")
        assert len(received) == seen  # nothing after the restart
        assert all(r.wall < deadline for r in received)
        assert_provider_invariants(log, received, "slowpoke", strict=False)
