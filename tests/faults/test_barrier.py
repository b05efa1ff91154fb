"""A bug in bide stops one operation, never the daemon (issue 20).

The real daemon runs with ``BIDE_FAULT_INJECT`` naming one operation per stage of a poll
(before the intent, after it, before the decision), one submit action and one spool file. Each
of those ends as the barrier says: the operation escalated ``internal_error`` with the
exception's class and no message, the action's outcome recorded as unknown, the file rejected.
Meanwhile a healthy operation is polled to success; after a restart without the variable, no
stopped operation is polled again, and ``replay --check`` explains every event.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from daemon.spool import RegistrationFile, Spool, new_request_id
from replay.events import ActionFailed, OperationStopped
from replay.observations import Registration
from tests.e2e.harness import until, workspace
from tests.e2e.test_actions import submit_profile

STAGES = {"op-poll": "poll", "op-request": "request", "op-decide": "decide"}


def test_an_exception_at_any_stage_stops_that_one_thing_and_the_daemon_goes_on(
    tmp_path: Path,
) -> None:
    jobs: dict[str, str | list[object]] = {
        "j-poll": "running",
        "j-request": "running",
        "j-decide": "running",
        "j-healthy": "running, succeeded with result",
    }
    scenarios: dict[str, object] = {"quick": {"steps": "running, succeeded with result"}}
    with workspace(tmp_path, jobs, scenarios=scenarios) as ws:
        submit_profile(ws)
        bad_file = new_request_id()
        inject = ",".join(
            [
                *(f"{stage}:{op}" for op, stage in STAGES.items()),
                "action:sub.submit",
                f"ingest:{bad_file}.json",
            ]
        )
        daemon = ws.start_daemon({"BIDE_FAULT_INJECT": inject})
        assert "FAULT INJECTION ENABLED" in daemon.output()
        for op in STAGES:
            assert ws.watch(op.replace("op-", "j-"), op, "--max-requests", "5").returncode == 0
        body = tmp_path / "body.json"
        body.write_bytes(b'{"scenario": "quick"}')
        submitted = ws.bide(
            "submit",
            "--provider",
            "sim",
            "--body",
            str(body),
            "--operation",
            "sub",
            "--wait-seconds",
            "10",
        )
        assert submitted.returncode == 1, submitted.stdout + submitted.stderr  # escalated
        spool = Spool(tmp_path / "state" / "spool")
        reg = Registration(
            operation_id="from-bad-file", provider="sim", provider_job_id="j-healthy"
        )
        spool.drop(
            spool.incoming, bad_file, msgspec.json.encode(RegistrationFile(1, bad_file, reg))
        )
        assert ws.watch("j-healthy", "healthy", "--max-requests", "5").returncode == 0
        assert ws.bide("wait", "healthy", "--timeout", "20s").returncode == 0

        def stopped() -> dict[str, OperationStopped]:
            return {
                e.operation_id: e for _, e in ws.log().events if isinstance(e, OperationStopped)
            }

        until(lambda: set(STAGES) <= set(stopped()), what="every faulted operation to stop")
        for op in STAGES:
            stop = stopped()[op]
            assert stop.reason == "internal_error", stop
            assert stop.detail.startswith("InjectedFault while "), stop.detail
            assert "injected at" not in stop.detail  # the class, never the message
            assert ws.log().ops[op].phase == "escalated"
            assert (tmp_path / "state" / "outbox" / f"{op}.1.txt").exists()
        failed = [e for e in ws.log().action_events if isinstance(e, ActionFailed)]
        assert [e.action_id for e in failed] == ["sub.submit"]
        assert "internal error (InjectedFault)" in failed[0].detail
        receipt = json.loads((spool.receipts / f"{bad_file}.json").read_text())
        assert receipt["status"] == "rejected"
        assert "internal error (InjectedFault)" in receipt["reason"]
        assert "from-bad-file" not in ws.log().ops
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0

        polled = {
            op: len(ws.sim.requests(kind="status", job_id=op.replace("op-", "j-"))) for op in STAGES
        }
        again = ws.start_daemon()  # no fault injection: nothing stopped is retried
        assert ws.watch("j-healthy", "healthy-2", "--max-requests", "5").returncode == 0
        assert ws.bide("wait", "healthy-2", "--timeout", "20s").returncode == 0
        assert again.stop() == 0
        assert polled == {
            op: len(ws.sim.requests(kind="status", job_id=op.replace("op-", "j-"))) for op in STAGES
        }
        checked = ws.bide("replay", "--check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
