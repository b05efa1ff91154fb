"""Bearer auth, and a request log that keeps every fact but no secret."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import msgspec

from daemon.simulator import (
    REDACTED,
    Script,
    read_request_log,
    redact_headers,
    redact_target,
    run_in_thread,
)

from .conftest import TOKEN


def test_missing_or_wrong_token_is_401_and_consumes_no_step(script: Script) -> None:
    with run_in_thread(script, token=TOKEN) as sim:
        missing = httpx.get(sim.job_url("seq"))
        wrong = httpx.get(sim.job_url("seq"), headers={"Authorization": "Bearer nope"})
        right = httpx.get(sim.job_url("seq"), headers={"Authorization": f"Bearer {TOKEN}"})
        admin = httpx.get(sim.url("/_sim/requests"))  # admin needs no token
    assert [missing.status_code, wrong.status_code, right.status_code] == [401, 401, 200]
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert admin.status_code == 200
    log = sim.requests(job_id="seq")
    assert [(r.status, r.call, r.step) for r in log] == [
        (401, None, None),
        (401, None, None),
        (200, 1, 0),
    ]


def test_secrets_are_redacted_everywhere_in_the_log(script: Script, tmp_path: Path) -> None:
    log_file = tmp_path / "requests.jsonl"
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Cookie": f"session={TOKEN}",
        "X-Api-Key": TOKEN,
        "Proxy-Authorization": "Basic abc",
        "X-Echo": f"token is {TOKEN}",
        "Idempotency-Key": "visible-key",
    }
    with run_in_thread(script, token=TOKEN, request_log=log_file) as sim:
        with httpx.Client(headers=headers) as client:
            client.get(sim.job_url("seq"), params={"access_token": TOKEN, "page": "2"})
            client.post(sim.url("/jobs"), json={"scenario": "quick"})
            admin = client.get(sim.url("/_sim/requests"))
        records = sim.requests()
    everything = msgspec.json.encode(records) + admin.content + log_file.read_bytes()
    assert TOKEN.encode() not in everything
    assert b"Basic abc" not in everything
    first = records[0]
    for name in ("Authorization", "Cookie", "X-Api-Key", "Proxy-Authorization"):
        assert first.header(name) == REDACTED
    assert first.header("X-Echo") == f"token is {REDACTED}"
    assert first.header("Idempotency-Key") == "visible-key"
    assert first.target == f"/jobs/seq?access_token={REDACTED}&page=2"
    assert read_request_log(log_file) == records  # the file holds the same records


def test_log_records_times_method_path_and_order(script: Script) -> None:
    before_wall, before_mono = time.time(), time.monotonic()
    with run_in_thread(script) as sim:
        httpx.get(sim.job_url("seq"))
        httpx.head(sim.job_url("seq"))
        httpx.post(sim.url("/jobs/seq/cancel"))
        records = sim.wait_for_requests(3, job_id="seq", timeout=5)
    assert [(r.method, r.target, r.kind) for r in records] == [
        ("GET", "/jobs/seq", "status"),
        ("HEAD", "/jobs/seq", "status"),
        ("POST", "/jobs/seq/cancel", "cancel"),
    ]
    assert before_wall <= records[0].wall <= records[1].wall <= records[2].wall <= time.time()
    assert before_mono <= records[0].monotonic <= records[2].monotonic <= time.monotonic()


def test_redaction_helpers() -> None:
    assert redact_headers([("authorization", "x"), ("Accept", "*/*")]) == [
        ("authorization", REDACTED),
        ("Accept", "*/*"),
    ]
    assert redact_target("/a?key=1&sig=2&x=3") == f"/a?key={REDACTED}&sig={REDACTED}&x=3"
    assert redact_target("/a/s3cr3t", ["s3cr3t"]) == f"/a/{REDACTED}"


def test_torn_last_line_of_a_log_file_is_skipped(tmp_path: Path, script: Script) -> None:
    log_file = tmp_path / "r.jsonl"
    with run_in_thread(script, request_log=log_file) as sim:
        httpx.get(sim.job_url("seq"))
    with log_file.open("ab") as f:
        f.write(b'{"seq": 2, "wa')
    assert [r.seq for r in read_request_log(log_file)] == [1]
