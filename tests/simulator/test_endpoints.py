"""Submit, idempotency, cancel, results, HEAD, the admin endpoints, ids in paths."""

from __future__ import annotations

import socket

import httpx
import msgspec
import pytest

from daemon.simulator import RequestRecord, SimulatorHandle, parse_script, run_in_thread


def test_submit_answers_202_with_location_and_the_job_follows_its_scenario(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    response = client.post("/jobs", json={"scenario": "quick", "format": "pdf"})
    assert response.status_code == 202
    job_id = response.json()["id"]
    assert response.headers["Location"] == f"/jobs/{job_id}"
    states = [client.get(response.headers["Location"]).json()["status"] for _ in range(3)]
    assert states == ["running", "succeeded", "succeeded"]
    [submit] = sim.requests(kind="submit")
    assert submit.job_id == job_id


def test_submitted_ids_are_fresh(client: httpx.Client) -> None:
    ids = {client.post("/jobs", json={"scenario": "quick"}).json()["id"] for _ in range(3)}
    assert len(ids) == 3


def test_idempotency_key_returns_the_same_job(sim: SimulatorHandle, client: httpx.Client) -> None:
    key = {"Idempotency-Key": "k-1"}
    first = client.post("/jobs", json={"scenario": "quick"}, headers=key)
    again = client.post("/jobs", json={"scenario": "quick"}, headers=key)
    assert again.status_code == 202
    assert again.headers["Location"] == first.headers["Location"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/jobs", json={"scenario": "slowjob"}, headers=key)
    assert other.status_code == 422  # same key, different request: refused, no new job
    assert len({r.job_id for r in sim.requests(kind="submit")}) == 1
    assert sim.requests(kind="submit")[0].header("Idempotency-Key") == "k-1"  # not a secret


def test_submit_inline_steps_and_unknown_scenario(client: httpx.Client) -> None:
    inline = client.post("/jobs", json={"steps": ["failed"]})
    assert client.get(inline.headers["Location"]).json()["status"] == "failed"
    unknown = client.post("/jobs", json={"scenario": "nope"})
    assert unknown.status_code == 422
    assert "quick" in unknown.json()["error"]
    assert client.post("/jobs", content=b"{not json").status_code == 400


@pytest.mark.parametrize(
    ("style", "header", "absolute"),
    [
        ("absolute-location", "Location", True),
        ("operation-location", "Operation-Location", True),
        ("body", None, False),
    ],
)
def test_submit_styles(style: str, header: str | None, absolute: bool) -> None:
    script = parse_script(
        f'[server]\nsubmit = "{style}"\ndefault_scenario = "s"\nid_prefix = "op/"\n'
        '[scenarios.s]\nsteps = "queued"\n'
    )
    with run_in_thread(script) as sim:
        response = httpx.post(sim.url("/jobs"))  # no body: the default scenario
    assert response.status_code == 202
    assert response.json() == {"id": "op/1"}
    if header is None:
        assert "Location" not in response.headers
    else:
        assert response.headers[header] == f"{sim.base_url}/jobs/op%2F1"


def test_cancel_records_it_and_the_job_reports_canceled(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    assert client.get("/jobs/seq").json()["status"] == "queued"
    response = client.post("/jobs/seq/cancel")
    assert (response.status_code, response.json()["status"]) == (202, "canceled")
    assert client.get("/jobs/seq").json() == {"id": "seq", "status": "canceled"}
    assert [r.kind for r in sim.requests(job_id="seq")] == ["status", "cancel", "status"]
    assert client.post("/jobs/nope/cancel").status_code == 404


def test_cancel_absent_when_the_provider_has_none() -> None:
    script = parse_script('[server]\ncancel = false\n[jobs.j]\nsteps = "running"\n')
    with run_in_thread(script) as sim:
        assert httpx.post(sim.url("/jobs/j/cancel")).status_code == 404
        assert httpx.get(sim.job_url("j")).json()["status"] == "running"


def test_result_download(client: httpx.Client) -> None:
    response = client.get("/results/file")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/octet-stream"
    assert len(response.content) == 100_000
    assert response.content.startswith(b"result of file\n")
    head = client.head("/results/file")
    assert (head.headers["Content-Length"], head.content) == ("100000", b"")
    assert client.get("/results/nope").status_code == 404


def test_head_has_the_headers_without_the_body_and_counts_as_a_call(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    head = client.head("/jobs/odd")
    get = client.get("/jobs/odd")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["Content-Length"] == get.headers["Content-Length"] != "0"
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert [r.call for r in sim.requests(job_id="odd")] == [1, 2]


def test_wrong_method_is_405(client: httpx.Client) -> None:
    response = client.delete("/jobs/seq")
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET, HEAD"


def test_admin_add_job_and_read_the_log(sim: SimulatorHandle, client: httpx.Client) -> None:
    added = client.post("/_sim/jobs", json={"id": "rt", "steps": [{"status": 503}, "running"]})
    assert added.status_code == 201
    assert added.json() == {"id": "rt", "url": f"{sim.base_url}/jobs/rt"}
    assert [client.get("/jobs/rt").status_code for _ in range(2)] == [503, 200]
    assert client.post("/_sim/jobs", json={"id": "rt", "steps": "queued"}).status_code == 409
    bad = client.post("/_sim/jobs", json={"steps": [{"tims": 2}]})
    assert bad.status_code == 422
    assert "tims" in bad.json()["error"]
    bare = client.post("/_sim/jobs", json=["queued", {"status": 500}])
    assert bare.status_code == 201
    assert client.get(f"/jobs/{bare.json()['id']}").json()["status"] == "queued"
    log = msgspec.json.decode(client.get("/_sim/requests").content, type=list[RequestRecord])
    assert [r.seq for r in log] == list(range(1, len(log) + 1))
    assert [r.status for r in log if r.job_id == "rt" and r.kind == "status"] == [503, 200]


def test_handle_add_job_from_another_thread(sim: SimulatorHandle, client: httpx.Client) -> None:
    job_id = sim.add_job("queued, succeeded with result", result_size=5)
    assert job_id == "job-1"
    with pytest.raises(ValueError, match="already taken"):
        sim.add_job(["running"], job_id=job_id)
    with pytest.raises(ValueError, match="tims"):
        sim.add_job([{"tims": 1}])
    client.get(sim.job_url(job_id))
    assert len(client.get(client.get(sim.job_url(job_id)).json()["result_url"]).content) == 5


def test_job_ids_are_percent_decoded_path_segments(
    sim: SimulatorHandle, client: httpx.Client
) -> None:
    response = client.get(sim.job_url("a/b c"))
    assert response.json() == {"id": "a/b c", "status": "running"}
    [record] = sim.requests(job_id="a/b c")
    assert record.target == "/jobs/a%2Fb%20c"
    assert client.get("/jobs/a/b%20c").status_code == 404  # an unencoded slash is two segments


def _raw_get(sim: SimulatorHandle, target: str) -> bytes:
    host, port = sim.address
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(
    "target", ["/jobs/../x", "/jobs/%2E%2E/x", "/jobs/./seq", "/x/../jobs/seq"]
)
def test_paths_that_escape_get_404_and_are_logged(sim: SimulatorHandle, target: str) -> None:
    assert _raw_get(sim, target).startswith(b"HTTP/1.1 404 ")
    [record] = sim.requests()
    assert (record.kind, record.target, record.status) == ("path_escape", target, 404)
    assert sim.requests(kind="status") == []  # no job's step was consumed


def test_waiting_for_requests_is_bounded(sim: SimulatorHandle, client: httpx.Client) -> None:
    client.get("/jobs/seq")
    assert [r.call for r in sim.wait_for_requests(1, job_id="seq", timeout=5)] == [1]
    with pytest.raises(TimeoutError, match="not met within"):
        sim.wait_for_requests(2, kind="cancel", timeout=0.05)


def test_ids_in_a_query_or_across_path_segments_only_where_the_script_asks() -> None:
    """Databricks' ``runs/get?run_id=ID`` and Google's ``v1/{+name}`` resource names."""
    jobs = '[jobs."7"]\nsteps = "running"\n[jobs."projects/p/operations/o"]\nsteps = "queued"\n'
    plain = parse_script(jobs)
    with run_in_thread(plain) as sim:
        assert httpx.get(sim.url("/jobs?run_id=7")).status_code == 405
        assert httpx.get(sim.url("/jobs/projects/p/operations/o")).status_code == 404
    shaped = parse_script(f'[server]\njob_query = "run_id"\npath_ids = true\n{jobs}')
    with run_in_thread(shaped) as sim:
        assert httpx.get(sim.url("/jobs?run_id=7")).json()["status"] == "running"
        assert httpx.get(sim.url("/jobs?other=7")).status_code == 405
        named = httpx.get(sim.url("/jobs/projects/p/operations/o"))
        assert named.json()["status"] == "queued"
        assert httpx.get(sim.url("/jobs/projects/p/operations/x")).status_code == 404
        assert httpx.post(sim.url("/jobs/7/cancel")).status_code == 202
        assert [r.job_id for r in sim.requests(kind="status")] == [
            "7",
            "projects/p/operations/o",
            "projects/p/operations/x",
        ]
