"""The shipped provider profiles (deploy/profiles/) read every documented state of their API
as the API reference means it: bodies written from each provider's public reference
(tests/providers/fixtures/PROFILE/STATE.json), read through ``bide check-profile --sample``'s
path (replay.reading.read_response, then replay.decide, on a synthetic operation). Above all:
a failed job is never read as a success."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from daemon.profile import load_profile
from daemon.sample import read_sample

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "deploy" / "profiles"
FIXTURES = Path(__file__).parent / "fixtures"

#: (profile, fixture, state shown, category)
CASES = [
    *[
        ("github-actions", s, "queued", "pending")
        for s in ("queued", "waiting", "requested", "pending")
    ],
    ("github-actions", "in_progress", "in_progress", "pending"),
    ("github-actions", "completed-success", "success", "success"),
    ("github-actions", "completed-failure", "failure", "failure"),
    ("github-actions", "completed-startup_failure", "failure", "failure"),
    ("github-actions", "completed-timed_out", "timed_out", "failure"),
    ("github-actions", "completed-neutral", "neutral_or_action_required", "failure"),
    ("github-actions", "completed-action_required", "neutral_or_action_required", "failure"),
    ("github-actions", "completed-cancelled", "cancelled", "canceled"),
    ("github-actions", "completed-skipped", "cancelled", "canceled"),
    ("github-actions", "completed-stale", "stale", "expired"),
    ("github-actions", "completed-null", None, "unknown"),
    *[
        ("databricks-runs", s, "PENDING", "pending")
        for s in ("QUEUED", "PENDING", "BLOCKED", "WAITING_FOR_RETRY")
    ],
    *[("databricks-runs", s, "RUNNING", "pending") for s in ("RUNNING", "TERMINATING")],
    ("databricks-runs", "TERMINATED-SUCCESS", "SUCCESS", "success"),
    *[
        ("databricks-runs", f"TERMINATED-{s}", "FAILED", "failure")
        for s in (
            "FAILED",
            "SUCCESS_WITH_FAILURES",
            "UPSTREAM_FAILED",
            "MAXIMUM_CONCURRENT_RUNS_REACHED",
        )
    ],
    ("databricks-runs", "TERMINATED-TIMEDOUT", "TIMEDOUT", "failure"),
    *[
        ("databricks-runs", f"TERMINATED-{s}", "CANCELED", "canceled")
        for s in ("CANCELED", "UPSTREAM_CANCELED", "EXCLUDED", "DISABLED")
    ],
    ("databricks-runs", "SKIPPED", "SKIPPED", "canceled"),
    ("databricks-runs", "INTERNAL_ERROR", "INTERNAL_ERROR", "failure"),
    ("kubernetes-job", "running", "Running", "pending"),
    ("kubernetes-job", "suspended", "Suspended", "pending"),
    ("kubernetes-job", "resumed", "Running", "pending"),
    ("kubernetes-job", "success-criteria-met", "SuccessCriteriaMet", "pending"),
    ("kubernetes-job", "failure-target", "FailureTarget", "pending"),
    ("kubernetes-job", "complete", "Complete", "success"),
    ("kubernetes-job", "failed", "Failed", "failure"),
    ("kubernetes-job", "deadline-exceeded", "DeadlineExceeded", "failure"),
    ("google-lro", "running", "running", "pending"),
    ("google-lro", "running-done-false", "running", "pending"),
    ("google-lro", "done", "done", "success"),
    ("google-lro", "error", "error", "failure"),
    ("google-lro", "deadline-exceeded", "deadline_exceeded", "failure"),
    ("google-lro", "cancelled", "cancelled", "canceled"),
    ("google-lro", "done-without-outcome", None, "unknown"),
    *[
        ("openai-batch", s, s, "pending")
        for s in ("validating", "in_progress", "finalizing", "cancelling")
    ],
    ("openai-batch", "completed", "completed", "success"),
    ("openai-batch", "failed", "failed", "failure"),
    ("openai-batch", "expired", "expired", "expired"),
    ("openai-batch", "cancelled", "cancelled", "canceled"),
    ("anthropic-batch", "in_progress", "in_progress", "pending"),
    ("anthropic-batch", "canceling", "canceling", "pending"),
    ("anthropic-batch", "ended", "ended", "success"),
    ("azure-operation", "NotStarted", "NotStarted", "pending"),
    ("azure-operation", "Running", "Running", "pending"),
    ("azure-operation", "Succeeded", "Succeeded", "success"),
    ("azure-operation", "Failed", "Failed", "failure"),
    ("azure-operation", "Canceled", "Canceled", "canceled"),
    ("replicate-prediction", "starting", "starting", "pending"),
    ("replicate-prediction", "processing", "processing", "pending"),
    ("replicate-prediction", "succeeded", "succeeded", "success"),
    ("replicate-prediction", "failed", "failed", "failure"),
    ("replicate-prediction", "canceled", "canceled", "canceled"),
    # A state the reference does not document (a Job with no status at all): no rule or state
    # list matches, and the wait stops as ``unknown_state`` rather than guess.
    ("databricks-runs", "undocumented", None, "unknown"),
    ("kubernetes-job", "undocumented", None, "unknown"),
    ("openai-batch", "undocumented", "paused", "unknown"),
    ("anthropic-batch", "undocumented", "paused", "unknown"),
    ("azure-operation", "undocumented", "Paused", "unknown"),
    ("replicate-prediction", "undocumented", "paused", "unknown"),
    ("aws-step-functions", "undocumented", "PAUSED", "unknown"),
    *[("aws-step-functions", s, s, "pending") for s in ("RUNNING", "PENDING_REDRIVE")],
    ("aws-step-functions", "SUCCEEDED", "SUCCEEDED", "success"),
    ("aws-step-functions", "FAILED", "FAILED", "failure"),
    ("aws-step-functions", "TIMED_OUT", "TIMED_OUT", "failure"),
    ("aws-step-functions", "ABORTED", "ABORTED", "canceled"),
]

#: The decision the daemon takes for each category (the first event after ResponseClassified).
STOPS = {
    "pending": "poll_scheduled",
    "success": "operation_succeeded",
    "failure": "operation_stopped",
    "canceled": "operation_stopped",
    "expired": "operation_stopped",
    "unknown": "operation_stopped",
}


def sample(profile: str, fixture: str, **kwargs: Any) -> dict[str, Any]:
    body = (FIXTURES / profile / f"{fixture}.json").read_bytes()
    return read_sample(load_profile(PROFILES / f"{profile}.toml"), body, **kwargs)


def test_every_fixture_is_covered() -> None:
    covered = {(p, f) for p, f, _, _ in CASES}
    on_disk = {(d.name, f.stem) for d in FIXTURES.iterdir() if d.is_dir() for f in d.glob("*.json")}
    assert on_disk == covered


@pytest.mark.parametrize(("profile", "fixture", "state", "category"), CASES)
def test_s3_each_documented_state_is_read_as_the_reference_means_it(
    profile: str, fixture: str, state: str | None, category: str
) -> None:
    report = sample(profile, fixture)
    assert report["category"] == category, report
    if state is not None:
        assert report["state"] == state
    else:
        assert report["state"].startswith("no rule matched")
    decision = [e["event"] for e in report["decision"]]
    assert decision[0] == "response_classified", decision
    assert decision[1] == STOPS[category], decision
    if category == "unknown":
        assert report["decision"][1]["reason"] == "unknown_state"
    if category == "failure":
        assert report["decision"][1]["reason"] == "provider_failure"
        assert report["provider_error"], "a failure keeps the provider's error"
        assert "operation_succeeded" not in decision


@pytest.mark.parametrize(
    ("profile", "fixture", "error"),
    [
        ("github-actions", "completed-failure", "failure"),
        ("databricks-runs", "TERMINATED-FAILED", "Task Orders_Ingest failed with message: failed"),
        ("kubernetes-job", "failed", "BackoffLimitExceeded"),
        ("google-lro", "error", "Invalid argument: the model has no version"),
        ("openai-batch", "failed", "invalid_json_line"),
        ("azure-operation", "Failed", "The training data is empty."),
        ("replicate-prediction", "failed", "CUDA out of memory"),
        ("aws-step-functions", "FAILED", "Lambda function ChargeCard failed: card declined"),
        ("aws-step-functions", "TIMED_OUT", "exceeded its TimeoutSeconds"),
    ],
)
def test_a_failure_carries_the_providers_error(profile: str, fixture: str, error: str) -> None:
    assert error in sample(profile, fixture)["provider_error"]


@pytest.mark.parametrize(
    ("profile", "fixture", "results"),
    [
        (
            "github-actions",
            "completed-success",
            {
                "conclusion": "success",
                "html_url": "https://github.com/octo-org/octo-repo/actions/runs/30433642",
                "head_sha": "acb5820ced9479c074f688cc328bf03f341a511d",
            },
        ),
        (
            "databricks-runs",
            "TERMINATED-SUCCESS",
            {
                "run_page_url": "https://my-workspace.cloud.databricks.com/#job/11223344/run/123",
                "result_state": "SUCCESS",
                "first_task_run_id": "2112892",
            },
        ),
        (
            "kubernetes-job",
            "complete",
            {"succeeded": "1", "completion_time": "2024-05-01T10:05:00Z"},
        ),
        ("google-lro", "done", {"metadata": None}),
        (
            "openai-batch",
            "completed",
            {"output_file_id": "file-cvaTdG", "error_file_id": "file-HOWS94"},
        ),
        (
            "anthropic-batch",
            "ended",
            {
                "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_013Zva2CMHLNnXjNJJKqJ2EF/results",
                "errored": "2",
            },
        ),
        ("azure-operation", "Succeeded", {"result": '{"modelId":"my-model"}'}),
        (
            "replicate-prediction",
            "succeeded",
            {
                "output": "hello Alice",
                "web_url": "https://replicate.com/p/gm3qorzdhgbfurvjtvhg6dckhu",
            },
        ),
        (
            "aws-step-functions",
            "SUCCEEDED",
            {"output": '{"invoice": "s3://orders/42/invoice.pdf"}', "stop_date": "1714557712.456"},
        ),
    ],
)
def test_a_success_carries_the_results_a_next_step_needs(
    profile: str, fixture: str, results: dict[str, str | None]
) -> None:
    report = sample(profile, fixture)
    assert report["category"] == "success"
    [succeeded] = [e for e in report["decision"] if e["event"] == "operation_succeeded"]
    for name, value in results.items():
        assert name in report["results"]
        if value is not None:
            assert report["results"][name] == value
    assert succeeded["results"]


def test_numeric_run_ids_are_checked_against_the_registered_id() -> None:
    assert "the registered id" in sample("github-actions", "queued", job_id="30433642")["identity"]
    other = sample("github-actions", "completed-success", job_id="30433643")
    assert other["unreadable"]["reason"] == "contradiction"
    assert [e["event"] for e in other["decision"]][1] != "operation_succeeded"
    assert sample("databricks-runs", "RUNNING", job_id="455644833")["category"] == "pending"


def test_the_providers_retry_after_is_read() -> None:
    report = sample("github-actions", "in_progress", headers={"retry_after": "120"})
    assert report["hints"]["retry_after_in_seconds"] == 120.0
    [scheduled] = [e for e in report["decision"] if e["event"] == "poll_scheduled"]
    assert scheduled["next_poll_in_seconds"] >= 120
    assert scheduled["delay_source"] == "provider_retry_after"


@pytest.mark.parametrize(
    "profile",
    ["github-actions", "databricks-runs", "kubernetes-job", "google-lro", "aws-step-functions"],
)
def test_check_profile_accepts_each_shipped_profile(profile: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "daemon.cli",
            "check-profile",
            str(PROFILES / f"{profile}.toml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)[0]["ok"] is True


def test_check_profile_sample_prints_the_reading_and_the_decision() -> None:
    command = [
        sys.executable,
        "-m",
        "daemon.cli",
        "check-profile",
        str(PROFILES / "github-actions.toml"),
        "--sample",
        str(FIXTURES / "github-actions" / "completed-failure.json"),
        "--header",
        "Retry-After: 30",
        "--job-id",
        "30433642",
    ]
    text = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert text.returncode == 0, text.stderr
    assert "category: failure" in text.stdout
    assert "decision: operation_stopped: reason=provider_failure" in text.stdout
    data = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    report = json.loads(data.stdout)
    assert (report["state"], report["category"]) == ("failure", "failure")
    assert report["hints"]["retry_after_in_seconds"] == 30.0


def test_githubs_primary_rate_limit_403_waits_until_the_reset() -> None:
    """GitHub answers its primary rate limit with 403, x-ratelimit-remaining 0 and the reset
    in epoch seconds: rate-limited, next poll at the reset; a 403 without them is a refused
    token."""
    reset = 1_800_000_000 + 900  # the sample registers at 1_800_000_000 and answers soon after
    command = [
        sys.executable,
        "-m",
        "daemon.cli",
        "check-profile",
        str(PROFILES / "github-actions.toml"),
        "--sample",
        str(FIXTURES / "github-actions" / "errors" / "401.json"),
        "--status",
        "403",
        "--json",
    ]
    limited = [
        *command,
        "--header",
        "x-ratelimit-remaining: 0",
        "--header",
        f"X-RateLimit-Reset: {reset}",
    ]
    out = subprocess.run(limited, capture_output=True, text=True, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["http_outcome"] == "rate_limited"
    assert report["hints"]["refused"] == []
    assert 0 < report["hints"]["rate_limit_reset_in_seconds"] <= 900
    [scheduled] = [e for e in report["decision"] if e["event"] == "poll_scheduled"]
    assert scheduled["delay_source"] == "provider_retry_after"
    assert scheduled["next_poll_in_seconds"] == report["hints"]["rate_limit_reset_in_seconds"]
    assert not [e for e in report["decision"] if e["event"] == "operation_stopped"]
    denied = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    decided = json.loads(denied.stdout)["decision"]
    [stopped] = [e for e in decided if e["event"] == "operation_stopped"]
    assert stopped["reason"] == "authorization_denied"


#: (profile, fixture under errors/, HTTP status, how the first answer is decided): error
#: bodies as each reference documents them, with the status they come with.
ERRORS = [
    *[
        (p, "401", 401, "authorization_denied")
        for p in (
            "github-actions",
            "google-lro",
            "databricks-runs",
            "kubernetes-job",
            "openai-batch",
            "anthropic-batch",
            "azure-operation",
            "replicate-prediction",
        )
    ],
    ("aws-step-functions", "403", 403, "authorization_denied"),
    *[
        (p, "404", 404, "not_found")  # S24: polled again inside the grace window, else stopped
        for p in (
            "github-actions",
            "google-lro",
            "databricks-runs",
            "kubernetes-job",
            "openai-batch",
            "anthropic-batch",
            "azure-operation",
            "replicate-prediction",
        )
    ],
    # AWS's JSON protocol says "no such execution" with a 400 the contract does not explain.
    ("aws-step-functions", "400", 400, "integration_failure"),
]


def test_every_error_body_is_covered() -> None:
    on_disk = {(d.parent.name, f.stem) for d in FIXTURES.glob("*/errors") for f in d.glob("*.json")}
    assert on_disk == {(p, f) for p, f, _, _ in ERRORS}


@pytest.mark.parametrize(("profile", "fixture", "status", "decided"), ERRORS)
def test_an_error_answer_is_never_read_as_a_state(
    profile: str, fixture: str, status: int, decided: str
) -> None:
    body = (FIXTURES / profile / "errors" / f"{fixture}.json").read_bytes()
    report = read_sample(load_profile(PROFILES / f"{profile}.toml"), body, status=status)
    assert report["state"] is None  # an error body carries no job state, whatever it holds
    events = [e["event"] for e in report["decision"]]
    assert "operation_succeeded" not in events
    if decided == "not_found" and events[-1] == "poll_scheduled":
        return  # inside the profile's not_found_grace_seconds: eventual consistency
    [stopped] = [e for e in report["decision"] if e["event"] == "operation_stopped"]
    assert stopped["reason"] == decided
