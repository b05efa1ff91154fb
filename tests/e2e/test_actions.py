"""Submit, fetch and cancel end to end: each its own recorded action (S22, S29, S34, S36)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from replay.events import ActionFailed, ActionIntended, ActionSucceeded, OperationRegistered
from tests.e2e.harness import DEFAULT_CONTRACT, Workspace, until, workspace

BODY = b'{"scenario": "quick"}'
QUICK = {"scenarios": {"quick": {"steps": "running, succeeded with result"}}}


def submit_profile(
    ws: Workspace,
    *,
    idempotent: bool = False,
    job_id_from: str = "location",
    cancel: bool = False,
    fetch_cap: int = 1_000_000,
) -> None:
    extra = (
        f'[submit]\nurl = "{ws.sim.base_url}/jobs"\ntimeout_seconds = 1\n'
        f'job_id_from = "{job_id_from}"\n'
        + ('job_id_pointer = "/id"\n' if job_id_from == "body" else "")
        + ('idempotency_header = "Idempotency-Key"\n' if idempotent else "")
        + f"\n[fetch]\nmax_bytes = {fetch_cap}\ntimeout_seconds = 5\n\n"
        + (f'[cancel]\nurl = "{ws.sim.base_url}/jobs/{{job_id}}/cancel"\n\n' if cancel else "")
    )
    contract = (
        DEFAULT_CONTRACT
        + f"idempotent_submit = {str(idempotent).lower()}\n"
        + f"cancel_documented = {str(cancel).lower()}\n"
    )
    ws.write_profile(contract=contract, extra=extra)


def _body(tmp: Path, data: bytes = BODY) -> str:
    path = tmp / "body.json"
    path.write_bytes(data)
    return str(path)


def _actions(ws: Workspace, kind: type) -> list:  # type: ignore[type-arg]
    log = ws.log()
    return [e for e in [*(e for _, e in log.events), *log.action_events] if isinstance(e, kind)]


def test_submit_202_location_polled_to_success_then_fetched(tmp_path: Path) -> None:
    with workspace(tmp_path, server={"result_size": 5000}, **QUICK) as ws:  # type: ignore[arg-type]
        submit_profile(ws)
        ws.start_daemon()
        out = ws.bide(
            "submit",
            "--provider",
            "sim",
            "--body",
            _body(tmp_path),
            "--operation",
            "exp",
            "--deadline",
            "1m",
        )
        assert out.returncode == 0, out.stdout + out.stderr
        [submit] = ws.sim.requests(kind="submit")
        [intent] = _actions(ws, ActionIntended)
        assert intent.at <= submit.wall  # recorded before the call
        assert intent.request_fingerprint
        [registered] = _actions(ws, OperationRegistered)
        assert registered.provider_job_id == submit.job_id
        assert registered.request_fingerprint == intent.request_fingerprint
        assert ws.bide("wait", "exp", "--timeout", "20s").returncode == 0
        target = tmp_path / "out.bin"
        fetched = ws.bide("fetch", "exp", "--to", str(target), "--json")
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        info = json.loads(fetched.stdout)
        data = target.read_bytes()
        assert len(data) == 5000 == info["size"]
        assert hashlib.sha256(data).hexdigest() == info["sha256"]
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        done = [e for e in _actions(ws, ActionSucceeded) if e.action_id.startswith("exp.fetch")]
        assert done[0].sha256 == info["sha256"]
        story = ws.bide("story", "exp").stdout
        assert "submit" in story
        assert "fetch" in story


def test_submit_202_with_id_in_body(tmp_path: Path) -> None:
    with workspace(tmp_path, server={"submit": "body"}, **QUICK) as ws:  # type: ignore[arg-type]
        submit_profile(ws, job_id_from="body")
        ws.start_daemon()
        out = ws.bide("submit", "--provider", "sim", "--body", _body(tmp_path), "--operation", "b")
        assert out.returncode == 0, out.stdout
        assert ws.bide("wait", "b", "--timeout", "20s").returncode == 0


def test_submit_timeout_without_idempotency_escalates_and_is_not_retried(tmp_path: Path) -> None:
    with workspace(tmp_path, server={"submit_steps": [{"delay": 3}]}, **QUICK) as ws:  # type: ignore[arg-type]
        submit_profile(ws)
        ws.start_daemon()
        out = ws.bide("submit", "--provider", "sim", "--body", _body(tmp_path), "--operation", "t")
        assert out.returncode == 1
        assert "submit_outcome_unknown" in out.stdout
        [failed] = _actions(ws, ActionFailed)
        assert [o.id for o in failed.options] == ["inspect_provider_console", "abandon"]
        assert len(ws.sim.requests(kind="submit")) == 1  # S29: never resubmitted silently
        outbox = (tmp_path / "state" / "outbox" / "t.submit.1.txt").read_text()
        assert "no idempotency key" in outbox
        assert ws.bide("decide", "t.submit", "abandon").returncode == 0


def test_submit_timeout_with_idempotency_retries_with_the_same_key(tmp_path: Path) -> None:
    with workspace(tmp_path, server={"submit_steps": [{"delay": 3}]}, **QUICK) as ws:  # type: ignore[arg-type]
        submit_profile(ws, idempotent=True)
        ws.start_daemon()
        out = ws.bide("submit", "--provider", "sim", "--body", _body(tmp_path), "--operation", "i")
        assert out.returncode == 0, out.stdout
        first, second = ws.sim.requests(kind="submit")
        key = first.header("Idempotency-Key")
        assert key
        assert second.header("Idempotency-Key") == key
        assert first.job_id == second.job_id  # the provider deduplicated: one job
        [registered] = _actions(ws, OperationRegistered)
        assert registered.idempotency_key == key


def test_duplicate_submit_refused_unless_forced(tmp_path: Path) -> None:
    slow = {"scenarios": {"quick": {"steps": "running"}}}
    with workspace(tmp_path, **slow) as ws:  # type: ignore[arg-type]
        submit_profile(ws)
        ws.start_daemon()
        body = _body(tmp_path)
        assert (
            ws.bide("submit", "--provider", "sim", "--body", body, "--operation", "d1").returncode
            == 0
        )
        again = ws.bide("submit", "--provider", "sim", "--body", body, "--operation", "d2")
        assert again.returncode == 1
        assert "duplicate submit: operation d1" in again.stdout
        forced = ws.bide(
            "submit", "--provider", "sim", "--body", body, "--operation", "d3", "--force"
        )
        assert forced.returncode == 0
        assert len(ws.sim.requests(kind="submit")) == 2


def test_fetch_over_the_cap_leaves_no_file(tmp_path: Path) -> None:
    with workspace(
        tmp_path, {"big": "succeeded with result"}, server={"result_size": 50_000}
    ) as ws:
        submit_profile(ws, fetch_cap=10_000)
        ws.start_daemon()
        assert ws.watch("big", "big").returncode == 0
        assert ws.bide("wait", "big", "--timeout", "20s").returncode == 0
        target = tmp_path / "big.bin"
        out = ws.bide("fetch", "big", "--to", str(target))
        assert out.returncode == 1
        assert "larger than the cap of 10000 bytes" in out.stdout
        assert not target.exists()
        assert not list((tmp_path / "state" / "results").glob("*"))
        assert ws.bide("status", "big", "--json").stdout.count('"succeeded"') >= 1


def test_fetch_of_a_non_succeeded_operation_refused(tmp_path: Path) -> None:
    with workspace(tmp_path, {"run": "running"}) as ws:
        ws.start_daemon()
        assert ws.watch("run", "run").returncode == 0
        out = ws.bide("fetch", "run", "--to", str(tmp_path / "x"))
        assert out.returncode == 1
        assert "has not succeeded" in out.stdout
        assert ws.sim.requests(kind="result") == []


def test_cancel_chosen_by_decision_is_its_own_recorded_call(tmp_path: Path) -> None:
    """S34: cancelling is a separate operation with its own record, never a status call."""
    with workspace(tmp_path, {"long": "running"}) as ws:
        submit_profile(ws, cancel=True)
        ws.start_daemon()
        assert ws.watch("long", "c", "--max-requests", "2").returncode == 0
        assert ws.bide("wait", "c", "--timeout", "20s").returncode == 3
        [esc] = json.loads(ws.bide("escalations", "--json").stdout)
        assert "cancel_at_provider" in [o["id"] for o in esc["options"]]
        assert ws.sim.requests(kind="cancel") == []  # never implicit
        assert ws.bide("decide", "c", "cancel_at_provider", "--escalation", "1").returncode == 0
        until(lambda: _actions(ws, ActionSucceeded), what="the cancel's outcome")
        [intent] = _actions(ws, ActionIntended)
        assert intent.kind == "cancel"
        [call] = ws.sim.requests(kind="cancel")
        assert intent.at <= call.wall


def test_cancel_not_offered_without_a_documented_cancel_call(tmp_path: Path) -> None:
    with workspace(tmp_path, {"long": "running"}) as ws:
        ws.start_daemon()
        assert ws.watch("long", "n", "--max-requests", "1").returncode == 0
        assert ws.bide("wait", "n", "--timeout", "20s").returncode == 3
        [esc] = json.loads(ws.bide("escalations", "--json").stdout)
        assert "cancel_at_provider" not in [o["id"] for o in esc["options"]]
        refused = ws.bide("decide", "n", "cancel_at_provider", "--escalation", "1")
        assert refused.returncode == 1


def test_sigkill_between_submit_intent_and_answer_is_not_repeated(tmp_path: Path) -> None:
    with workspace(tmp_path, server={"submit_steps": [{"delay": 30}]}, **QUICK) as ws:  # type: ignore[arg-type]
        submit_profile(ws)
        ws.write_profile  # noqa: B018
        path = ws.root / "profiles" / "sim.toml"
        path.write_text(path.read_text().replace("timeout_seconds = 1\n", "timeout_seconds = 60\n"))
        daemon = ws.start_daemon()
        dropped = ws.bide(
            "submit",
            "--provider",
            "sim",
            "--body",
            _body(tmp_path),
            "--operation",
            "k",
            "--wait-seconds",
            "0.5",
        )
        assert dropped.returncode == 75
        ws.sim.wait_for_requests(1, kind="submit", timeout=10)
        daemon.kill()
        ws.start_daemon()
        until(lambda: _actions(ws, ActionFailed), what="the unknown outcome")
        [failed] = _actions(ws, ActionFailed)
        assert failed.reason == "submit_outcome_unknown"
        assert "daemon stopped" in failed.detail
        assert len(ws.sim.requests(kind="submit")) == 1
        assert os.path.exists(ws.root / "state" / "outbox" / "k.submit.1.txt")
