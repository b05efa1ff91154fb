"""The daemon end to end: the real ``bide run`` against the simulator, driven by the CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec

from daemon.spool import RegistrationFile, Spool, new_request_id
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    OperationRegistered,
    RequestOutcomeUnknown,
    StatusRequestIntended,
)
from replay.observations import Registration
from tests.e2e.harness import Workspace, until, workspace


def _intents(ws: Workspace, op: str) -> list[StatusRequestIntended]:
    return [
        e
        for _, e in ws.log().events
        if isinstance(e, StatusRequestIntended) and e.operation_id == op
    ]


def assert_intents_precede_requests(ws: Workspace, op: str, job: str) -> None:
    """Every request the provider saw has a durable intent with its number, written before."""
    intents = {e.request_number: e for e in _intents(ws, op)}
    received = ws.sim.requests(kind="status", job_id=job)
    for n, record in enumerate(received, start=1):
        assert n in intents, f"request {n} reached the provider with no intent in the log"
        assert intents[n].at <= record.wall, f"intent {n} written after the request arrived"


def test_register_poll_to_success_and_story(tmp_path: Path) -> None:
    """S35: routine polls inside the approved deadline and budget need no human decision."""
    with workspace(tmp_path, {"exp-1": "queued x2, running, succeeded with result"}) as ws:
        ws.start_daemon()
        watched = ws.watch("exp-1", "nightly", "--deadline", "1m", "--max-requests", "10")
        assert watched.returncode == 0, watched.stderr
        assert watched.stdout.strip() == "nightly"
        waited = ws.bide("wait", "nightly", "--timeout", "30s", "--json")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        final = json.loads(waited.stdout)
        assert final["phase"] == "succeeded"
        assert final["status_requests_used"] == 4
        assert final["provider_results"]["result_url"].endswith("/results/exp-1")
        assert len(ws.sim.requests(kind="status", job_id="exp-1")) == 4
        assert_intents_precede_requests(ws, "nightly", "exp-1")
        story = ws.bide("story", "nightly")
        assert "registered job exp-1" in story.stdout
        assert "state queued" in story.stdout
        assert "from local backoff" in story.stdout
        assert "succeeded" in story.stdout.splitlines()[-1]
        check = ws.bide("replay", "--check")
        assert check.returncode == 0, check.stdout
        assert "0 mismatch" in check.stdout


def test_escalation_answered_with_decide(tmp_path: Path) -> None:
    with workspace(tmp_path, {"odd": "queued, manual_review"}) as ws:
        ws.start_daemon()
        assert ws.watch("odd", "review-me").returncode == 0
        waited = ws.bide("wait", "review-me", "--timeout", "30s")
        assert waited.returncode == 3, waited.stdout  # escalated
        listed = ws.bide("escalations", "--json")
        [escalation] = json.loads(listed.stdout)
        assert escalation["reason"] == "unknown_state"
        # bide's detail names the provider's state; the state itself is provider data
        assert "state ⟨provider_state⟩ is in no list" in escalation["detail"]
        assert escalation["provider_state"] == "manual_review"
        offered = [o["id"] for o in escalation["options"]]
        assert "abandon" in offered
        assert "cancel_at_provider" not in offered
        outbox = list((tmp_path / "state" / "outbox").glob("review-me.*.txt"))
        assert len(outbox) == 1
        assert "unknown_state" in outbox[0].read_text()

        bogus = ws.bide("decide", "review-me", "resubmit_quietly", "--escalation", "1")
        assert bogus.returncode == 1
        assert "not offered" in bogus.stdout  # the API answered with the reason at once

        chosen = ws.bide(
            "decide", "review-me", "abandon", "--note", "needs a human", "--escalation", "1"
        )
        assert chosen.returncode == 0, chosen.stdout + chosen.stderr
        assert ws.bide("wait", "review-me", "--timeout", "10s").returncode == 4  # closed
        events = [e for _, e in ws.log().events if e.operation_id == "review-me"]
        [decision] = [e for e in events if isinstance(e, DecisionRecorded)]
        assert decision.option_id == "abandon"
        assert decision.approver == _me()  # the file's owner, not a claimed name
        assert any(isinstance(e, DecisionRejected) for e in events)
        assert len(ws.sim.requests(kind="status", job_id="odd")) == 2


def test_extend_decision_resumes_with_new_budget_and_counters_kept(tmp_path: Path) -> None:
    with workspace(tmp_path, {"long": "running x4, succeeded with result"}) as ws:
        ws.start_daemon()
        assert ws.watch("long", "ext", "--max-requests", "2").returncode == 0
        assert ws.bide("wait", "ext", "--timeout", "30s").returncode == 3
        [esc] = json.loads(ws.bide("escalations", "--json").stdout)
        assert esc["reason"] == "request_budget_exhausted"
        assert ws.bide("decide", "ext", "extend", "--escalation", "1").returncode == 0
        assert ws.bide("wait", "ext", "--timeout", "30s").returncode in (0, 3)
        status = json.loads(ws.bide("status", "ext", "--json").stdout)
        assert status["status_requests_used"] > 2  # never reset (S17)
        assert status["max_status_requests"] > 2


def test_extend_adds_exactly_its_time_and_checks_to_a_deadline_not_reached(tmp_path: Path) -> None:
    """Issue 37: an unknown state stops the wait long before its deadline and budget; the
    approved extension adds 15 minutes and 4 checks to them, as the option's label says."""
    with workspace(tmp_path, {"odd": "running, mystery, running x2, succeeded with result"}) as ws:
        ws.start_daemon()
        assert (
            ws.watch("odd", "ext-add", "--max-requests", "10", "--deadline", "30m").returncode == 0
        )
        assert ws.bide("wait", "ext-add", "--timeout", "30s").returncode == 3
        [esc] = json.loads(ws.bide("escalations", "--json").stdout)
        assert esc["reason"] == "unknown_state"
        [extend] = [o for o in esc["options"] if o["id"] == "extend"]
        assert "(+15 min," in extend["label"]
        assert "checks 10 -> 14 (+4)" in extend["label"]
        assert ws.bide("decide", "ext-add", "extend", "--escalation", "1").returncode == 0
        assert ws.bide("wait", "ext-add", "--timeout", "30s").returncode == 0
        status = json.loads(ws.bide("status", "ext-add", "--json").stdout)
        assert (status["status_requests_used"], status["max_status_requests"]) == (5, 14)
        events = [e for _, e in ws.log().events]
        [registered] = [e for e in events if isinstance(e, OperationRegistered)]
        [decided] = [e for e in events if isinstance(e, DecisionRecorded)]
        assert registered.extend_rule == "add"
        assert decided.new_deadline_at == registered.deadline_at + 900
        assert decided.new_max_status_requests == 10 + 4
        assert ws.log().ops["ext-add"].deadline_at == registered.deadline_at + 900


def test_restart_with_overdue_operations_polls_each_exactly_once(tmp_path: Path) -> None:
    with workspace(tmp_path, {f"job-{i}": "running" for i in range(3)}) as ws:
        # Slow backoff: a second request inside the check window would be a catch-up burst.
        ws.write_profile(
            contract=(
                'state_pointer = "/status"\nbackoff_base_seconds = 5\nbackoff_cap_seconds = 10\n'
                "rate_limited_delay_seconds = 30\nfirst_poll_after_seconds = 2\n"
            )
        )
        daemon = ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        rids = [_drop_registration(spool, f"job-{i}", f"op-{i}") for i in range(3)]
        until(lambda: all(spool.read_receipt(r) for r in rids), what="3 registrations")
        assert daemon.stop() == 0  # before any first poll is due
        assert ws.sim.requests(kind="status") == []
        due = max(op.next_poll_at for op in ws.log().ops.values())
        until(lambda: time.time() > due + 1.0, timeout=10, what="every operation overdue")
        restarted_at = time.time()
        ws.start_daemon()
        ws.sim.wait_for_requests(3, kind="status", timeout=10)
        time.sleep(1.0)  # a catch-up burst would land inside this window (next poll >= 2.5 s)
        for i in range(3):
            got = ws.sim.requests(kind="status", job_id=f"job-{i}")
            assert len(got) == 1, f"op-{i} got {len(got)} requests after restart"
            assert got[0].wall >= restarted_at


def _drop_registration(spool: Spool, job: str, op: str) -> str:
    rid = new_request_id()
    reg = Registration(operation_id=op, provider="sim", provider_job_id=job)
    spool.drop(spool.incoming, rid, msgspec.json.encode(RegistrationFile(1, rid, reg)))
    return rid


def test_intent_without_outcome_is_recorded_unknown_and_stays_counted(tmp_path: Path) -> None:
    with workspace(tmp_path, {"slow": [{"delay": 3.0, "state": "running"}, "running"]}) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("slow", "crashy").returncode == 0
        ws.sim.wait_for_requests(1, kind="status", job_id="slow", timeout=10)
        daemon.kill()  # SIGKILL while the request is in flight
        ws.start_daemon()
        until(
            lambda: any(isinstance(e, RequestOutcomeUnknown) for _, e in ws.log().events),
            what="the unknown outcome to be recorded",
        )
        status = json.loads(ws.bide("status", "crashy", "--json").stdout)
        assert status["status_requests_used"] >= 1  # the reservation was kept (S11, S13)
        [unknown] = [e for _, e in ws.log().events if isinstance(e, RequestOutcomeUnknown)]
        assert unknown.request_number == 1


def test_rejected_spool_files_change_nothing(tmp_path: Path) -> None:
    with workspace(tmp_path, {"ok": "running"}) as ws:
        ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        (spool.incoming / ("a" * 32 + ".json")).write_text("{not json")
        os.symlink("/etc/passwd", spool.incoming / ("b" * 32 + ".json"))
        big = tmp_path / "big.json"  # written beside the spool, renamed in whole
        big.write_bytes(b" " * 600_000)
        big.rename(spool.incoming / ("c" * 32 + ".json"))
        unknown = ws.bide("watch", "--provider", "nope", "--job", "x", "--operation", "n1")
        assert unknown.returncode == 1
        assert "no profile for provider 'nope'" in unknown.stdout  # the API said so at once
        until(lambda: len(list(spool.rejected.glob("*.reason"))) == 3, what="3 rejections")
        reasons = sorted(p.read_text() for p in spool.rejected.glob("*.reason"))
        assert any("not a valid spool file" in r for r in reasons)
        assert any("symbolic link" in r for r in reasons)
        assert any("limit is" in r for r in reasons)
        assert Path("/etc/passwd").exists()
        assert ws.log().ops == {}
        assert list(spool.incoming.iterdir()) == []


def test_job_id_cannot_escape_the_status_path(tmp_path: Path) -> None:
    with workspace(tmp_path) as ws:
        ws.sim.add_job(["running"], job_id="../../_sim/requests?x=1")
        ws.start_daemon()
        assert ws.watch("../../_sim/requests?x=1", "escape").returncode == 0
        [req] = ws.sim.wait_for_requests(1, job_id="../../_sim/requests?x=1", timeout=10)
        assert req.kind == "status"
        assert req.target.startswith("/jobs/..%2F..%2F_sim%2Frequests%3Fx%3D1")


def test_second_daemon_on_the_same_log_is_refused(tmp_path: Path) -> None:
    """S30: exactly one owner: the log's lock refuses a second daemon, naming the first."""
    with workspace(tmp_path) as ws:
        first = ws.start_daemon()
        second = ws.bide("run", timeout=20)
        assert second.returncode == 2
        assert f"locked by pid {first.proc.pid}" in second.stderr


def test_watch_while_daemon_down_is_queued_then_registered(tmp_path: Path) -> None:
    with workspace(tmp_path, {"later": "succeeded with result"}) as ws:
        ws.start_daemon().stop()
        queued = ws.watch("later", "queued-op")
        assert queued.returncode == 75
        assert "not running" in queued.stdout
        ws.start_daemon()
        assert ws.bide("wait", "queued-op", "--timeout", "20s").returncode == 0


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_ingest_is_idempotent_when_a_recorded_file_is_seen_again(tmp_path: Path) -> None:
    with workspace(tmp_path, {"once": "running"}) as ws:
        daemon = ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        first = _drop_registration(spool, "once", "only-once")
        until(lambda: spool.read_receipt(first), what="the first receipt")
        daemon.kill()
        # As if the daemon had died after appending but before deleting the file.
        again = _drop_registration(spool, "once", "only-once")
        ws.start_daemon()
        until(lambda: spool.read_receipt(again), what="the second receipt")
        receipt = spool.read_receipt(again)
        assert receipt is not None
        assert receipt.status == "registered"
        registered = [e for _, e in ws.log().events if isinstance(e, OperationRegistered)]
        assert len(registered) == 1
        assert list(spool.incoming.iterdir()) == []


def test_sigterm_right_after_ready_drains_and_exits_zero(tmp_path: Path) -> None:
    """systemd may stop the unit the moment READY=1 arrives: the signal handlers must already
    be in place then, or SIGTERM's default action kills the daemon without a final checkpoint."""
    with workspace(tmp_path) as ws:
        for _ in range(5):
            daemon = ws.start_daemon(ready=False)
            deadline = time.monotonic() + 20
            while "msg=ready" not in daemon.output():  # no sleep: signal the instant it shows
                assert time.monotonic() < deadline, daemon.output()
                assert daemon.proc.poll() is None, daemon.output()
            assert daemon.stop() == 0, daemon.output()
            assert "msg=stopping" in daemon.output()
        assert ws.bide("verify").returncode == 0
