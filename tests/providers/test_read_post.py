"""Status reads sent as POST (S19): only on the operator's explicit word with a fixed body, the
job id JSON-escaped into it; AWS Signature V4 by botocore's signer, checked here by the
simulator's verifier (botocore recomputing the signature from a test-known secret)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon.awssign import AwsSigning, Signer, SigningError
from daemon.errors import ConfigError
from daemon.profile import load_profile
from daemon.simulator.awsjson import AwsJson, signature_problem

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "profiles" / "aws-step-functions.toml"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY-unit-4f2"
URL = "http://127.0.0.1:8443/"

STATUS = """[status]
url = "https://states.us-east-1.amazonaws.com/"
{lines}

[contract]
state_pointer = "/status"
[contract.states]
success = ["SUCCEEDED"]
"""


def profile(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "sfn.toml"
    path.write_text(STATUS.format(lines="\n".join(lines)))
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    return str(caught.value)


def test_s19_post_without_read_only_post_is_refused_naming_the_keys(tmp_path: Path) -> None:
    path = profile(tmp_path, 'method = "POST"', 'body = \'{"executionArn": "{job_id}"}\'')
    message = refusal(path)
    assert message.startswith(f"{path}:3: status.method:")
    assert "read_only_post = true" in message
    assert "not a safe method" in message
    assert "and body" not in message  # the body is there: only the missing key is named


def test_s19_post_without_a_body_template_is_refused(tmp_path: Path) -> None:
    message = refusal(profile(tmp_path, 'method = "POST"', "read_only_post = true"))
    assert "status.method" in message
    assert "body" in message
    bare = refusal(profile(tmp_path, 'method = "POST"'))
    assert "read_only_post = true and body" in bare


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"executionArn": "fixed"}', "exactly once"),
        ('{"a": "{job_id}", "b": "{job_id}"}', "exactly once"),
        ('{"executionArn": {job_id}}', "not JSON"),
        ('{"executionArn": "x-{job_id}"}', "whole JSON string value"),
    ],
)
def test_s19_the_body_template_holds_the_job_id_once_as_a_string(
    tmp_path: Path, body: str, why: str
) -> None:
    path = profile(tmp_path, 'method = "POST"', "read_only_post = true", f"body = '{body}'")
    message = refusal(path)
    assert "status.body" in message
    assert why in message


def test_s19_a_post_read_names_the_job_in_the_body_not_the_url(tmp_path: Path) -> None:
    path = profile(
        tmp_path, 'method = "POST"', "read_only_post = true", 'body = \'{"id": "{job_id}"}\''
    )
    path.write_text(path.read_text().replace(".com/", ".com/{job_id}"))
    assert "status.url" in refusal(path)


def test_body_and_read_only_post_are_refused_on_a_get(tmp_path: Path) -> None:
    path = profile(tmp_path, "read_only_post = true")
    path.write_text(path.read_text().replace(".com/", ".com/{job_id}"))
    assert "status.read_only_post: only for a status read sent as method" in refusal(path)


def test_check_profile_refuses_an_undeclared_post(tmp_path: Path) -> None:
    path = profile(tmp_path, 'method = "POST"')
    out = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "check-profile", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert f"{path}:3: status.method" in out.stdout
    assert "read_only_post" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    "job_id",
    [
        'arn:aws:states:us-east-1:1:execution:m:"quoted"',
        "back\\slash\\",
        'x", "stateMachineArn": "arn:other',
        "tab\tnewline\n\u00e9\u2028",
    ],
)
def test_s19_the_job_id_is_json_escaped_into_the_body(job_id: str) -> None:
    body = load_profile(SHIPPED).status_body(job_id)
    assert body is not None
    assert json.loads(body) == {"executionArn": job_id}  # one key, the id verbatim
    assert body.isascii()


def test_without_botocore_a_sigv4_profile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("botocore", "botocore.auth", "botocore.awsrequest", "botocore.credentials"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError, match=r"\[aws\]: .*install bide\[aws\]"):
        load_profile(SHIPPED)


def test_check_profile_without_botocore_says_install_bide_aws() -> None:
    """The CLI path, in a Python where botocore cannot be imported (as without the extra)."""
    blocked = "botocore", "botocore.auth", "botocore.awsrequest", "botocore.credentials"
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        "from daemon.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "check-profile", str(SHIPPED)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert "install bide[aws]" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def keys_file(tmp_path: Path, secret: str = SECRET, mode: int = 0o600) -> Path:
    path = tmp_path / "aws.json"
    path.write_text(json.dumps({"access_key_id": KEY_ID, "secret_access_key": secret}))
    os.chmod(path, mode)
    return path


def signed(tmp_path: Path, body: bytes, secret: str = SECRET) -> dict[str, str]:
    keys_file(tmp_path, secret)
    signer = Signer(AwsSigning(region="us-east-1", service="states"), tmp_path, "sfn")
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AWSStepFunctions.DescribeExecution",
    }
    return signer.sign("POST", URL, headers, body)


def verify(headers: dict[str, str], body: bytes, wall: float | None = None) -> str | None:
    config = AwsJson(access_key_id=KEY_ID, secret_access_key=SECRET)
    sent = (("Host", "127.0.0.1:8443"), *headers.items())
    return signature_problem(
        config,
        method="POST",
        url=URL,
        headers=sent,
        body=body,
        wall=time.time() if wall is None else wall,
    )


def test_sigv4_by_botocore_verifies_and_covers_the_body_and_headers(tmp_path: Path) -> None:
    body = b'{"executionArn": "arn:aws:states:us-east-1:1:execution:m:e"}'
    headers = signed(tmp_path, body)
    assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    assert "x-amz-target" in headers["Authorization"]  # the action is signed
    assert SECRET not in json.dumps(headers)
    assert verify(headers, body) is None
    assert verify(headers, body.replace(b":e", b":other")) == (
        "the signature does not match the request"
    )
    tampered = {**headers, "X-Amz-Target": "AWSStepFunctions.StopExecution"}
    assert verify(tampered, body) == "the signature does not match the request"
    assert "not now" in str(verify(headers, body, wall=time.time() + 3600))  # no replay later
    assert verify(signed(tmp_path, body, secret="another-secret"), body) is not None


def test_aws_credentials_errors_name_the_file_never_the_key(tmp_path: Path) -> None:
    keys_file(tmp_path, mode=0o644)
    signer = Signer(AwsSigning(region="us-east-1", service="states"), tmp_path, "sfn")
    with pytest.raises(SigningError) as caught:
        signer.sign("POST", URL, {}, b"{}")
    assert "chmod 0600" in str(caught.value)
    assert SECRET not in str(caught.value)
    (tmp_path / "aws.json").write_text(json.dumps({"access_key_id": SECRET}))
    os.chmod(tmp_path / "aws.json", 0o600)
    with pytest.raises(SigningError) as caught:
        signer.check()
    assert "must be JSON" in str(caught.value)
    assert SECRET not in str(caught.value)
