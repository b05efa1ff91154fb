"""The simulator's AWS JSON protocol: ``POST /`` names the job in its body; with a key pair in
the script, a request whose SigV4 signature does not verify is a 403 and consumes no step,
and the secret is never in the request log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from daemon.awssign import AwsSigning, Signer
from daemon.simulator import Script, run_in_thread, script_from_dict

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "sim-test-secret-2b7e"
ARN = "arn:aws:states:us-east-1:1:execution:m:e"
TARGET = {
    "Content-Type": "application/x-amz-json-1.0",
    "X-Amz-Target": "AWSStepFunctions.DescribeExecution",
}


def script(secret: str | None) -> Script:
    aws: dict[str, object] = {"access_key_id": KEY_ID}
    if secret is not None:
        aws["secret_access_key"] = secret
    return script_from_dict(
        {"server": {"aws_json": aws}, "jobs": {ARN: {"steps": ["RUNNING", "FAILED"]}}}
    )


def signed_post(tmp_path: Path, url: str, body: bytes, secret: str) -> httpx.Response:
    keys = tmp_path / "aws.json"
    keys.write_text(json.dumps({"access_key_id": KEY_ID, "secret_access_key": secret}))
    os.chmod(keys, 0o600)
    signer = Signer(AwsSigning(region="us-east-1", service="states"), tmp_path, "sim")
    headers = signer.sign("POST", url, dict(TARGET), body)
    return httpx.post(url, headers=headers, content=body)


def test_a_signed_describe_reads_the_job_and_a_bad_signature_is_403(tmp_path: Path) -> None:
    body = json.dumps({"executionArn": ARN}).encode()
    with run_in_thread(script(SECRET)) as sim:
        url = sim.url("/")
        forged = signed_post(tmp_path, url, body, "not-the-secret")
        unsigned = httpx.post(url, headers=TARGET, content=body)
        good = signed_post(tmp_path, url, body, SECRET)
        unknown = signed_post(tmp_path, url, json.dumps({"executionArn": "nope"}).encode(), SECRET)
        get = httpx.get(url)
    assert forged.status_code == 403
    assert forged.json()["__type"] == "InvalidSignatureException"
    assert unsigned.status_code == 403
    assert (good.status_code, good.json()["status"]) == (200, "RUNNING")  # the first step
    assert (unknown.status_code, unknown.json()["__type"]) == (400, "ExecutionDoesNotExist")
    assert get.status_code == 405
    log = sim.requests(job_id=ARN)
    assert [(r.kind, r.status, r.call) for r in log] == [
        ("status", 403, None),
        ("status", 403, None),
        ("status", 200, 1),
    ]
    assert SECRET not in repr(sim.requests())


def test_without_a_secret_the_route_takes_the_bearer_token() -> None:
    with run_in_thread(script(None), token="t0k") as sim:
        body = json.dumps({"executionArn": ARN}).encode()
        refused = httpx.post(sim.url("/"), headers=TARGET, content=body)
        read = httpx.post(
            sim.url("/"), headers={**TARGET, "Authorization": "Bearer t0k"}, content=body
        )
    assert refused.status_code == 401
    assert read.json()["status"] == "RUNNING"
