"""The real daemon, waiting with the shipped GitHub Actions profile on a simulator that answers
as the workflow-runs API does: a run that completes with ``conclusion = failure`` ends as a
failure, with the conclusion as the provider's error, never as a success; a successful run ends
with its results."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from tests.e2e.harness import workspace

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "profiles" / "github-actions.toml"
FIXTURES = ROOT / "tests" / "providers" / "fixtures" / "github-actions"
RUN_ID = "30433642"


def body(fixture: str) -> str:
    return (FIXTURES / f"{fixture}.json").read_text()


def shipped_profile_for(base_url: str) -> str:
    """The shipped profile, its rules and results untouched: only the API's address (the
    simulator's), the credential file and the waiting times (seconds, not minutes) differ."""
    text = SHIPPED.read_text()
    text = text.replace("https://api.github.com/repos/OWNER/REPO/actions/runs", f"{base_url}/jobs")
    text = text.replace('file = "github.token"', 'file = "sim.token"')
    for key, value in (
        ("backoff_base_seconds", "0.2"),
        ("backoff_cap_seconds", "0.4"),
        ("rate_limited_delay_seconds", "1.0"),
        ("not_found_grace_seconds", "5"),
    ):
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    return text


def run(tmp_path: Path, final: str) -> tuple[dict[str, object], str]:
    steps: list[object] = [
        {"body": body("queued")},
        {"body": body("in_progress"), "times": 2},
        {"body": body(final)},
    ]
    with workspace(tmp_path, {RUN_ID: steps}) as ws:
        (ws.root / "profiles" / "github-actions.toml").write_text(
            shipped_profile_for(ws.sim.base_url)
        )
        ws.start_daemon()
        watched = ws.bide(
            "watch", "--provider", "github-actions", "--job", RUN_ID, "--operation", "gh-run"
        )
        assert watched.returncode == 0, watched.stdout + watched.stderr
        ws.bide("wait", "gh-run", "--timeout", "20s")
        status = json.loads(ws.bide("status", "gh-run", "--json").stdout)
        story = ws.bide("story", "gh-run").stdout
        # Every decision re-derives from the log under the recorded rule-based contract.
        check = ws.bide("replay", "--check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "0 mismatch" in check.stdout
        return status, story


def test_s3_a_failed_workflow_run_ends_as_a_failure_never_a_success(tmp_path: Path) -> None:
    status, story = run(tmp_path, "completed-failure")
    assert status["stop_reason"] == "provider_failure", status
    assert status["provider_error"] == "failure"
    assert "succeeded" not in str(status.get("phase", ""))
    assert not status.get("results")
    assert "state queued" in story
    assert "state in_progress" in story
    assert "state failure, stopped: provider_failure" in story


def test_a_successful_workflow_run_ends_with_its_results(tmp_path: Path) -> None:
    status, story = run(tmp_path, "completed-success")
    assert status.get("stop_reason") is None, status
    assert "html_url" in json.dumps(status)
    assert "acb5820ced9479c074f688cc328bf03f341a511d" in json.dumps(status) + story


def test_githubs_primary_rate_limit_403_is_waited_out_until_the_reset(tmp_path: Path) -> None:
    """GitHub's primary rate limit (403, x-ratelimit-remaining 0, x-ratelimit-reset in epoch
    seconds) is a wait until the reset, not a refused token: the daemon asks again only once
    the reset has passed, and the run then ends with its results."""
    reset = math.ceil(time.time()) + 3
    limited = {
        "status": 403,
        "body": '{"message": "API rate limit exceeded for user ID 1."}',
        "headers": {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)},
    }
    with workspace(tmp_path, {RUN_ID: [limited, {"body": body("completed-success")}]}) as ws:
        (ws.root / "profiles" / "github-actions.toml").write_text(
            shipped_profile_for(ws.sim.base_url)
        )
        ws.start_daemon()
        watched = ws.bide(
            "watch", "--provider", "github-actions", "--job", RUN_ID, "--operation", "gh-rl"
        )
        assert watched.returncode == 0, watched.stdout + watched.stderr
        ws.bide("wait", "gh-rl", "--timeout", "30s")
        status = json.loads(ws.bide("status", "gh-rl", "--json").stdout)
        check = ws.bide("replay", "--check")
        received = ws.sim.requests(kind="status", job_id=RUN_ID)
    assert status.get("stop_reason") is None, status
    assert "html_url" in json.dumps(status)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 mismatch" in check.stdout
    [first, second] = received
    assert (first.status, second.status) == (403, 200)
    assert second.wall >= reset, f"polled {reset - second.wall:.3f} s before the reset"
