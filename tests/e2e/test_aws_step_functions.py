"""The real daemon, waiting with the shipped Step Functions profile on a simulator that speaks
AWS's JSON protocol and verifies every request's Signature V4 with botocore, from a secret
only the test and the credentials file know: the status read is a signed POST whose body names
the execution (a read declared as such, S19), and a FAILED execution ends as a failure with
AWS's cause, never a success."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.e2e.harness import _contains, workspace

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "profiles" / "aws-step-functions.toml"
FIXTURES = ROOT / "tests" / "providers" / "fixtures" / "aws-step-functions"
ARN = "arn:aws:states:us-east-1:123456789012:execution:OrderPipeline:run-2024-05-01"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY-e2e-9c1"
AWS_JSON = {
    "access_key_id": KEY_ID,
    "secret_access_key": SECRET,
    "region": "us-east-1",
    "service": "states",
}


def body(fixture: str) -> str:
    return (FIXTURES / f"{fixture}.json").read_text()


def shipped_profile_for(base_url: str) -> str:
    """The shipped profile, its call, signing and contract untouched: only the endpoint (the
    simulator's) and the waiting times (seconds, not minutes) differ."""
    text = SHIPPED.read_text().replace("https://states.us-east-1.amazonaws.com/", f"{base_url}/")
    for key, value in (
        ("backoff_base_seconds", "0.2"),
        ("backoff_cap_seconds", "0.4"),
        ("rate_limited_delay_seconds", "1.0"),
    ):
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    return text


def test_s3_a_failed_execution_read_by_a_signed_post_ends_as_a_failure(tmp_path: Path) -> None:
    steps: list[object] = [
        {"body": body("RUNNING"), "times": 2},
        {"body": body("FAILED")},
    ]
    with workspace(tmp_path, {ARN: steps}, server={"aws_json": AWS_JSON}) as ws:
        keys = ws.root / "creds" / "aws-step-functions.json"
        keys.write_text(json.dumps({"access_key_id": KEY_ID, "secret_access_key": SECRET}))
        os.chmod(keys, 0o600)
        (ws.root / "profiles" / "aws-step-functions.toml").write_text(
            shipped_profile_for(ws.sim.base_url)
        )
        ws.start_daemon()
        watched = ws.bide(
            "watch", "--provider", "aws-step-functions", "--job", ARN, "--operation", "sfn"
        )
        assert watched.returncode == 0, watched.stdout + watched.stderr
        ws.bide("wait", "sfn", "--timeout", "20s")
        status = json.loads(ws.bide("status", "sfn", "--json").stdout)
        story = ws.bide("story", "sfn").stdout
        check = ws.bide("replay", "--check")

        assert status["stop_reason"] == "provider_failure", status
        assert status["provider_error"] == "Lambda function ChargeCard failed: card declined"
        assert not status.get("results")
        assert "state RUNNING" in story
        assert "state FAILED, stopped: provider_failure" in story
        assert check.returncode == 0, check.stdout + check.stderr
        assert "0 mismatch" in check.stdout
        # S19: every read was a POST declared a read, naming the execution in its fixed body,
        # and the simulator verified its signature (a bad one is a 403); the secret went
        # nowhere but into the signature.
        reads = ws.sim.requests(kind="status", job_id=ARN)
        assert len(reads) == 3
        assert {(r.method, r.target, r.status) for r in reads} == {("POST", "/", 200)}
        for r in reads:
            sent = dict(r.headers)
            assert sent["X-Amz-Target"] == "AWSStepFunctions.DescribeExecution"
            assert "Authorization" in sent  # redacted in the simulator's log
        for path in ws.root.rglob("*"):
            if path.is_file() and path != keys:
                assert not _contains(path, SECRET.encode()), f"secret key leaked into {path}"
        assert not any(SECRET in text for text in ws.outputs)
