"""Each step kind, over a real socket, produces exactly what the script says."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import pytest

from daemon.simulator import SimulatorHandle, parse_script, run_in_thread


def test_steps_advance_one_per_call_and_the_last_repeats(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    states = [client.get("/jobs/seq").json()["status"] for _ in range(8)]
    assert states == ["queued"] * 2 + ["running"] * 3 + ["succeeded"] * 3
    log = sim.requests(kind="status", job_id="seq")
    assert [r.call for r in log] == list(range(1, 9))
    assert [r.step for r in log] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert [r.step_label for r in log][-1] == "succeeded"


def test_success_with_result_points_at_the_result_endpoint(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    body = client.get("/jobs/file").json()
    assert body == {
        "id": "file",
        "status": "succeeded",
        "result_url": f"{sim.base_url}/results/file",
    }


def test_success_without_result_has_no_result_url(client: httpx.Client) -> None:
    assert client.get("/jobs/noresult").json() == {"id": "noresult", "status": "succeeded"}


def test_404_for_the_first_calls_then_the_job_appears(client: httpx.Client) -> None:
    codes = [client.get("/jobs/eventual").status_code for _ in range(3)]
    assert codes == [404, 404, 200]


def test_503_with_retry_after_seconds(client: httpx.Client) -> None:
    response = client.get("/jobs/r503")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "120"


def test_503_with_retry_after_http_date_relative_to_the_request() -> None:
    now = 1_700_000_000.25
    script = parse_script("[jobs.j]\nsteps = [{ status = 503, retry_after_date = 30 }]")
    with run_in_thread(script, clock=lambda: now) as sim:
        response = httpx.get(sim.job_url("j"))
    assert response.status_code == 503
    when = parsedate_to_datetime(response.headers["Retry-After"])
    # Whole seconds, rounded up: never earlier than the 30 s asked for.
    assert when.timestamp() == 1_700_000_031
    assert parsedate_to_datetime(response.headers["Date"]).timestamp() == 1_700_000_000


def test_retry_after_date_is_in_the_future_on_a_real_clock(client: httpx.Client) -> None:
    before = time.time()
    when = parsedate_to_datetime(client.get("/jobs/r503date").headers["Retry-After"])
    assert before + 30 <= when.timestamp() <= time.time() + 31


def test_429_without_then_with_retry_after(client: httpx.Client) -> None:
    first, second = client.get("/jobs/r429"), client.get("/jobs/r429")
    assert (first.status_code, first.headers.get("Retry-After")) == (429, None)
    assert (second.status_code, second.headers.get("Retry-After")) == (429, "7")


def test_401_403_500(client: httpx.Client) -> None:
    responses = [client.get("/jobs/denied") for _ in range(3)]
    assert [r.status_code for r in responses] == [401, 403, 500]
    assert [r.json() for r in responses] == [
        {"error": "Unauthorized"},
        {"error": "Forbidden"},
        {"error": "Internal Server Error"},
    ]


def test_reset_sends_no_response_and_is_logged(sim: SimulatorHandle, client: httpx.Client) -> None:
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        client.get("/jobs/reset")
    assert client.get("/jobs/reset").json()["status"] == "running"  # the next step answers
    first = sim.requests(job_id="reset")[0]
    assert (first.status, first.fault, first.call) == (None, "reset", 1)


def test_close_without_response(sim: SimulatorHandle, client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        client.get("/jobs/closed")
    assert sim.requests(job_id="closed")[0].fault == "close"


def test_slow_response_passes_the_client_timeout(sim: SimulatorHandle) -> None:
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(sim.job_url("slow"), timeout=0.2)
    assert time.monotonic() - started < 5
    [record] = sim.requests(job_id="slow")
    assert record.delay == 30  # logged on arrival, before the answer is held back


def test_oversize_body_with_content_length(client: httpx.Client) -> None:
    response = client.get("/jobs/big")
    assert response.headers["Content-Length"] == "3000000"
    assert len(response.content) == 3_000_000
    body = json.loads(response.content)
    assert body["status"] == "running"
    assert len(body["padding"]) > 2_900_000


def test_oversize_body_streamed_chunked(sim: SimulatorHandle, client: httpx.Client) -> None:
    cap, seen = 1024 * 1024, 0
    with client.stream("GET", "/jobs/bigchunked") as response:
        assert "Content-Length" not in response.headers
        assert response.headers["Transfer-Encoding"] == "chunked"
        for chunk in response.iter_raw():
            seen += len(chunk)
            if seen > cap:
                break  # a capped client gives up mid-body
    assert seen > cap
    assert client.get("/jobs/seq").status_code == 200  # the simulator is not stuck


def test_malformed_json(client: httpx.Client) -> None:
    response = client.get("/jobs/malformed")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)


def test_a_state_never_seen_before(client: httpx.Client) -> None:
    assert client.get("/jobs/odd").json() == {"id": "odd", "status": "manual_review"}


def test_running_past_its_own_expiry(client: httpx.Client) -> None:
    body = client.get("/jobs/expired").json()
    expires = datetime.fromisoformat(body["expires_at"])
    assert body["status"] == "running"
    assert expires < datetime.now(UTC)


def test_hints_valid_negative_absurd_and_unparseable(client: httpx.Client) -> None:
    bodies = [client.get("/jobs/hints").json() for _ in range(4)]
    check_at = datetime.fromisoformat(bodies[0]["next_check_at"]).timestamp()
    assert 3500 < check_at - time.time() <= 3600
    assert [b["poll_after_seconds"] for b in bodies] == [5, -5, 1e9, "soon"]
    assert bodies[2]["next_check_at"] == "not a date"


def test_extra_headers_and_request_id_on_every_response(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    ok = client.get("/jobs/ratelimit")
    missing = client.get("/jobs/nonexistent")
    assert ok.headers["RateLimit"] == "limit=10, remaining=0, reset=30"
    for response in (ok, missing):
        assert response.headers["RateLimit-Policy"] == "10;w=60"
    ids = [ok.headers["X-Request-Id"], missing.headers["X-Request-Id"]]
    assert ids == [f"sim-{r.seq}" for r in sim.requests()[-2:]]


def test_redirect_to_another_origin(sim: SimulatorHandle, client: httpx.Client) -> None:
    response = client.get("/jobs/away")
    assert response.status_code == 302
    assert response.headers["Location"] == f"http://localhost:{sim.address[1]}/jobs/away"


def test_cross_origin_redirect_target_sees_whether_the_credential_came_along() -> None:
    # The credential-leak test: a job on A redirects to B; B's log shows what was forwarded.
    with run_in_thread() as other, run_in_thread() as sim:
        other.add_job(["succeeded"], job_id="moved")
        sim.add_job([{"redirect": other.job_url("moved")}], job_id="j")
        secret = {"Authorization": "Bearer leak-me"}
        final = httpx.get(sim.job_url("j"), headers=secret, follow_redirects=True)
        assert final.json()["status"] == "succeeded"
        httpx.get(other.job_url("moved"), headers=secret)
        redirected, direct = other.requests(job_id="moved")
    assert redirected.header("Authorization") is None  # httpx drops it across origins
    assert direct.header("Authorization") == "<redacted>"  # present, but never logged


def test_200_without_state_field(client: httpx.Client) -> None:
    assert client.get("/jobs/nostate").json() == {"id": "nostate", "progress": 0.5}


def test_literal_body_and_content_type(client: httpx.Client) -> None:
    response = client.get("/jobs/literal")
    assert response.headers["Content-Type"] == "text/html"
    assert response.text == "<html>maintenance</html>"
