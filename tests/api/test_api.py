"""The local API end to end: the real daemon, its real Unix socket, the simulator on loopback.

Each test asserts what a caller of the API sees (answers, codes, the story) and what the
provider sees (requests made, or not made).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import msgspec
import pytest

from daemon.api.client import ApiCallError, ApiClient
from daemon.api.listener import _bind
from daemon.errors import ConfigError
from daemon.spool import DecisionFile, Spool, new_request_id
from replay.story import for_people
from tests.e2e.harness import Workspace, until, workspace
from tests.faults.support import metrics_url, scrape

FOREVER = ["running"]


def sock(ws: Workspace) -> Path:
    return ws.root / "state" / "api.sock"


@contextmanager
def api(ws: Workspace) -> Iterator[ApiClient]:
    with ApiClient(sock(ws), timeout=30) as client:
        yield client


def watch(client: ApiClient, op: str, job: str, **extra: object) -> dict[str, object]:
    answer: dict[str, object] = client.call(
        "POST",
        "/v1/operations",
        body={"provider": "sim", "job_id": job, "operation_id": op, **extra},
    )
    return answer


def test_register_retry_wait_and_story(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"j1": "running x2, succeeded with result"}) as ws:
        ws.start_daemon()
        with api(ws) as client:
            first = watch(client, "op-1", "j1", deadline_seconds=60)
            assert first["created"] is True
            assert isinstance(first["sequence"], int)
            again = watch(client, "op-1", "j1", deadline_seconds=60)
            assert again == {**first, "created": False}  # the same receipt, nothing new
            with pytest.raises(ApiCallError) as conflict:
                watch(client, "op-1", "another-job")
            assert (conflict.value.status, conflict.value.error) == (409, "operation_id_in_use")
            view = client.call("GET", "/v1/operations/op-1", params={"wait": "30s"}, timeout=60)
            assert view["done"] is True
            assert view["phase"] == "succeeded", view["escalation"]["detail"]
            assert view["provider_results"]["result_url"].endswith("/results/j1")
            story = client.call("GET", "/v1/operations/op-1/story")
            assert any("succeeded" in line["text"] for line in story["lines"])
            # The job id is the provider's word: named in bide's text, given beside it.
            assert "registered job ⟨provider_text[0]⟩ at sim" in story["text"]
            assert story["lines"][0]["provider_text"] == ["j1"]
            text = client.call("GET", "/v1/operations/op-1/story", params={"format": "text"})
            assert text == story["text"]
        assert len(ws.sim.requests(kind="status", job_id="j1")) == 3
        assert sum(1 for _ in ws.log().ops) == 1  # the retry registered nothing
        assert ws.bide("wait", "op-1", "--timeout", "5s").returncode == 0
        status = ws.bide("status", "op-1")
        assert status.returncode == 0
        assert "succeeded" in status.stdout
        assert ws.bide("story", "op-1").stdout == for_people(story["lines"])
        assert "registered job j1 at sim" in ws.bide("story", "op-1").stdout


def test_a_wait_that_elapses_says_not_done_and_when_to_ask_again(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"slow": FOREVER}) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-slow", "slow")
            started = time.monotonic()
            view = client.call("GET", "/v1/operations/op-slow", params={"wait": "0.5s"})
            assert time.monotonic() - started >= 0.5
            assert view["done"] is False
            assert view["phase"] == "live"
            assert view["next_news_at"] is not None
            assert view["retry_after_seconds"] >= 1
            # The server caps a wait at 60 s whatever is asked: a bad duration is a 400.
            with pytest.raises(ApiCallError) as bad:
                client.call("GET", "/v1/operations/op-slow", params={"wait": "soon"})
            assert (bad.value.status, bad.value.field) == (400, "wait")
        assert ws.bide("wait", "op-slow", "--timeout", "1s").returncode == 124


def test_withdraw_stops_the_wait_with_no_further_request(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"w": FOREVER, "other": FOREVER}) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-w", "w")
            watch(client, "op-other", "other")
            ws.sim.wait_for_requests(2, kind="status", job_id="w", timeout=10)
            answer = client.call(
                "POST", "/v1/operations/op-w/withdrawal", body={"note": "not needed any more"}
            )
            assert answer == {"operation_id": "op-w", "phase": "closed", "withdrawn": True}
            polled = len(ws.sim.requests(kind="status", job_id="w"))
            seen = len(ws.sim.requests(kind="status", job_id="other"))
            ws.sim.wait_for_requests(seen + 4, kind="status", job_id="other", timeout=10)
            # A poll already in flight when the withdrawal landed may still be answered.
            assert len(ws.sim.requests(kind="status", job_id="w")) <= polled + 1
            view = client.call("GET", "/v1/operations/op-w")
            assert (view["phase"], view["stop_reason"]) == ("closed", "withdrawn_by_owner")
            again = client.call("POST", "/v1/operations/op-w/withdrawal", body={})
            assert again["withdrawn"] is False
            story = client.call("GET", "/v1/operations/op-w/story")["text"]
            assert "withdrawn by its owner" in story
            assert "not needed any more" in story
        check = ws.bide("replay", "--check")
        assert check.returncode == 0, check.stdout + check.stderr


def test_an_escalation_is_answered_over_the_api_and_the_story_names_the_approver(
    tmp_path: Path,
) -> None:
    with workspace(tmp_path, jobs={"odd": "mystery, succeeded with result"}) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-odd", "odd")
            view = client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
            assert view["phase"] == "escalated"
            assert view["stop_reason"] == "unknown_state"
            escalation = view["escalation"]
            options = {o["id"]: o for o in escalation["options"]}
            assert "extend" in options
            assert options["extend"]["number"] >= 1
            assert "--escalation 1" in escalation["decide_command"]
            listed = client.call("GET", "/v1/escalations")["escalations"]
            assert [e["operation_id"] for e in listed] == ["op-odd"]
            with pytest.raises(ApiCallError) as unnumbered:
                client.call("POST", "/v1/operations/op-odd/decision", body={"option": "extend"})
            assert unnumbered.value.error == "escalation_number_required"
            answer = client.call(
                "POST",
                "/v1/operations/op-odd/decision",
                body={"option": "extend", "escalation_id": 1, "note": "checked the console"},
            )
            assert answer["resumes"] is True
            assert answer["self_approved"] is True
            done = client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
            assert done["phase"] == "succeeded"
            story = client.call("GET", "/v1/operations/op-odd/story")["text"]
            assert "decision by root: extend (checked the console) (self-approved" in story
        check = ws.bide("replay", "--check")
        assert check.returncode == 0, check.stdout + check.stderr


def test_self_approval_is_refused_unless_the_config_allows_it(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"odd": "mystery"}, api="") as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-odd", "odd")
            client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
            with pytest.raises(ApiCallError) as refused:
                client.call(
                    "POST",
                    "/v1/operations/op-odd/decision",
                    body={"option": "abandon", "escalation_id": 1},
                )
            assert (refused.value.status, refused.value.error) == (403, "self_approval")
        cli = ws.bide("decide", "op-odd", "abandon", "--escalation", "1")
        assert cli.returncode == 1
        assert "allow_self_approval" in cli.stdout
        assert ws.log().ops["op-odd"].phase == "escalated"


def test_per_user_registration_rate_answers_429_with_retry_after(tmp_path: Path) -> None:
    with workspace(
        tmp_path,
        jobs={"a": FOREVER, "b": FOREVER},
        api="registrations_per_second = 0.2\nregistrations_burst = 1\n",
    ) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-a", "a")
            with pytest.raises(ApiCallError) as limited:
                watch(client, "op-b", "b")
            assert (limited.value.status, limited.value.error) == (429, "rate_limited")
            watch(client, "op-a", "a")  # a retry of a recorded registration is not throttled
        raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock(ws))), base_url="http://bide")
        answer = raw.post("/v1/operations", json={"provider": "sim", "job_id": "b"})
        assert answer.status_code == 429
        assert int(answer.headers["Retry-After"]) >= 1
        raw.close()
        cli = ws.watch("b", "op-b")
        assert cli.returncode == 1
        assert "registrations_per_second" in cli.stdout


def _raw(path: Path, data: bytes, *, read: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_hostile_requests_get_clear_errors_and_polling_goes_on(tmp_path: Path) -> None:
    with workspace(
        tmp_path,
        jobs={"keep": FOREVER},
        config_extra='\n[metrics]\nlisten = "127.0.0.1:0"\n',
        api="request_timeout_seconds = 1\nmax_connections_per_user = 2000\n",
    ) as ws:
        daemon = ws.start_daemon()
        path = sock(ws)
        with api(ws) as client:
            watch(client, "op-keep", "keep")
        ws.sim.wait_for_requests(1, kind="status", job_id="keep", timeout=10)

        big = b"{" + b" " * (65 * 1024) + b"}"
        answer = _raw(
            path,
            b"POST /v1/operations HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(big)).encode()
            + b"\r\n\r\n"
            + big,
        )
        assert _status(answer) == 413
        assert b'"body_too_large"' in answer

        answer = _raw(
            path,
            b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (17 * 1024) + b"\r\n\r\n",
        )
        assert _status(answer) == 431

        malformed = b'{"provider": "sim", '
        answer = _raw(
            path,
            b"POST /v1/operations HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(malformed)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + malformed,
        )
        assert _status(answer) == 400
        assert b'"malformed_json"' in answer

        with api(ws) as client:
            with pytest.raises(ApiCallError) as unknown:
                client.call(
                    "POST",
                    "/v1/operations",
                    body={"provider": "sim", "job_id": "x", "colour": "red"},
                )
            assert (unknown.value.status, unknown.value.field) == (422, "colour")
            with pytest.raises(ApiCallError) as provider:
                watch(client, "op-x", "x", provider="nobody")
            assert (provider.value.status, provider.value.error) == (422, "unknown_provider")

        answer = _raw(
            path, b"GET /v1/operations/%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert _status(answer) == 400
        assert b'"bad_path"' in answer

        # Slow headers: one byte a second never completes a request; the daemon gives up.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
            slow.settimeout(10)
            slow.connect(str(path))
            started = time.monotonic()
            closed = False
            for byte in b"GET /v1/health HTTP/1.1\r\n":
                try:
                    slow.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                time.sleep(0.3)
                if time.monotonic() - started > 3:
                    break
            rest = b"" if closed else slow.recv(65536)
            assert closed or rest.startswith(b"HTTP/1.1 408") or rest == b""
            assert time.monotonic() - started < 5

        # A thousand idle connections cost the daemon nothing it needs to poll.
        idle = []
        try:
            for _ in range(1000):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(path))
                idle.append(s)
            before = len(ws.sim.requests(kind="status", job_id="keep"))
            ws.sim.wait_for_requests(before + 3, kind="status", job_id="keep", timeout=15)
            with api(ws) as client:
                assert client.call("GET", "/v1/health")["status"] == "ok"
        finally:
            for s in idle:
                s.close()

        # A client that leaves mid-wait takes its waiter with it.
        url = metrics_url(daemon)
        leaving = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        leaving.connect(str(path))
        leaving.sendall(b"GET /v1/operations/op-keep?wait=60s HTTP/1.1\r\nHost: x\r\n\r\n")
        until(lambda: scrape(url).get("bide_api_waiters") == 1, 10, "the waiter to start")
        leaving.close()
        until(lambda: scrape(url).get("bide_api_waiters") == 0, 10, "the waiter to go away")
        samples = scrape(url)
        for reason in (
            "body_too_large",
            "header_too_large",
            "malformed_json",
            "bad_path",
            "invalid_field",
            "unknown_provider",
            "client_left",
        ):
            assert samples.get(f'bide_api_rejections_total{{reason="{reason}"}}', 0) >= 1, reason
        assert daemon.proc.poll() is None


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"j": FOREVER}) as ws:
        first = ws.start_daemon()
        first.kill()  # SIGKILL: the socket file stays behind
        assert sock(ws).exists()
        second = ws.start_daemon()
        assert "replaced a stale API socket" in second.output()
        with api(ws) as client:
            assert client.call("GET", "/v1/health")["status"] == "ok"


def test_a_socket_another_process_answers_on_is_never_taken(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)
        with pytest.raises(ConfigError, match="answered by another process"):
            _bind(path, 0o660, "")
        assert path.exists()
    plain = tmp_path / "not-a-socket"
    plain.write_text("x")
    with pytest.raises(ConfigError, match="not a socket"):
        _bind(plain, 0o660, "")


def test_a_story_recorded_before_a_restart_is_told_whole(tmp_path: Path) -> None:
    with workspace(
        tmp_path, jobs={"early": "running x2, succeeded with result", "late": FOREVER}
    ) as ws:
        first = ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-early", "early")
            assert (
                client.call("GET", "/v1/operations/op-early", params={"wait": "20s"})["phase"]
                == "succeeded"
            )
            before = for_people(client.call("GET", "/v1/operations/op-early/story")["lines"])
        assert first.stop() == 0
        ws.start_daemon()  # from the snapshot: op-early's events are not replayed
        with api(ws) as client:
            watch(client, "op-late", "late")
            after = for_people(client.call("GET", "/v1/operations/op-early/story")["lines"])
            assert after == before == ws.bide("story", "op-early", "--offline").stdout
            assert "registered job late" in for_people(
                client.call("GET", "/v1/operations/op-late/story")["lines"]
            )


def test_live_operations_per_user_are_capped_and_freed_as_they_end(tmp_path: Path) -> None:
    jobs = {f"c{i}": FOREVER for i in range(3)}
    with workspace(tmp_path, jobs=jobs, api="max_live_per_principal = 2\n") as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-c0", "c0")
            watch(client, "op-c1", "c1")
            with pytest.raises(ApiCallError) as full:
                watch(client, "op-c2", "c2")
            assert (full.value.status, full.value.error) == (429, "rate_limited")
            assert "max_live_per_principal" in full.value.detail
            client.call("POST", "/v1/operations/op-c0/withdrawal", body={})
            assert watch(client, "op-c2", "c2")["created"] is True


def test_a_long_story_says_what_it_leaves_out(tmp_path: Path) -> None:
    with workspace(
        tmp_path,
        jobs={"long": "running x20, succeeded with result"},
        api="story_events_kept = 16\n",
    ) as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-long", "long", max_status_requests=40)
            assert (
                client.call("GET", "/v1/operations/op-long", params={"wait": "30s"})["phase"]
                == "succeeded"
            )
            text = for_people(client.call("GET", "/v1/operations/op-long/story")["lines"])
        lines = text.splitlines()
        assert "registered job long" in lines[0]
        assert "succeeded" in lines[-1]
        assert any("bide story op-long --offline shows every one" in line for line in lines)
        assert len(lines) < len(ws.bide("story", "op-long", "--offline").stdout.splitlines())


def test_the_same_registration_sent_at_once_is_recorded_once(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"j1": FOREVER}) as ws:
        ws.start_daemon()
        answers: list[dict[str, object]] = []
        errors: list[BaseException] = []

        def send() -> None:
            try:
                with api(ws) as client:
                    answers.append(watch(client, "dup", "j1"))
            except BaseException as exc:  # collected and asserted on below
                errors.append(exc)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert sum(1 for a in answers if a["created"]) == 1
        assert len({a["sequence"] for a in answers}) == 1
        registered = [e for _, e in ws.log().events if type(e).__name__ == "OperationRegistered"]
        assert len(registered) == 1


def test_ids_are_one_namespace_and_may_hold_a_slash(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"j1": FOREVER, "j2": FOREVER}) as ws:
        ws.start_daemon()
        with api(ws) as client:
            with pytest.raises(ApiCallError) as like_an_action:
                watch(client, "x.fetch.1", "j1")
            assert (like_an_action.value.status, like_an_action.value.field) == (
                422,
                "operation_id",
            )
            watch(client, "team/nightly", "j2")
            view = client.call("GET", "/v1/operations/team%2Fnightly")
            assert view["operation_id"] == "team/nightly"
        assert ws.bide("status", "team/nightly").returncode == 0


def test_a_spool_decision_cannot_self_approve_either(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"odd": "mystery"}, api="") as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-odd", "odd")
            client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
        spool = Spool(tmp_path / "state" / "spool")
        decision = DecisionFile(1, new_request_id(), "op-odd", "abandon", "", 1)
        spool.drop(spool.decisions, decision.request_id, msgspec.json.encode(decision))
        until(
            lambda: any(
                "allow_self_approval" in p.read_text() for p in spool.rejected.glob("*.reason")
            ),
            what="the refusal",
        )
        assert ws.log().ops["op-odd"].phase == "escalated"


def test_one_user_cannot_take_every_connection(tmp_path: Path) -> None:
    with workspace(tmp_path, api="max_connections_per_user = 5\n") as ws:
        ws.start_daemon()
        held = []
        try:
            for _ in range(5):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(sock(ws)))
                held.append(s)
            until(
                lambda: (
                    b"this user's limit"
                    in _raw(sock(ws), b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                ),
                what="the cap",
            )
        finally:
            for s in held:
                s.close()
        with api(ws) as client:
            assert client.call("GET", "/v1/health")["status"] == "ok"


def test_with_an_agents_group_and_no_approvers_group_nobody_approves(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"odd": "mystery"}, api='agents_group = "root"\n') as ws:
        ws.start_daemon()
        with api(ws) as client:
            watch(client, "op-odd", "odd")
            client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
            with pytest.raises(ApiCallError) as refused:
                client.call(
                    "POST",
                    "/v1/operations/op-odd/decision",
                    body={"option": "abandon", "escalation_id": 1},
                )
            assert refused.value.status == 403
            assert "approvers_group" in refused.value.detail


def test_a_submit_retry_is_the_same_receipt_and_a_changed_one_a_conflict(tmp_path: Path) -> None:
    from tests.e2e.test_actions import submit_profile

    with workspace(tmp_path, server={"submit_steps": [{"delay": 0}]}) as ws:
        submit_profile(ws)
        ws.start_daemon()
        body = {
            "provider": "sim",
            "operation_id": "sub",
            "deadline_seconds": 60,
            "body": "eyJleHBvcnQiOiAiYWxsIn0=",
        }
        with api(ws) as client:
            first = client.call("POST", "/v1/submissions", body=body)
            assert first["created"] is True
            again = client.call("POST", "/v1/submissions", body=body)
            assert again["created"] is False
            with pytest.raises(ApiCallError) as changed:
                client.call("POST", "/v1/submissions", body={**body, "deadline_seconds": 90})
            assert (changed.value.status, changed.value.error) == (409, "operation_id_in_use")
        assert len(ws.sim.requests(kind="submit")) == 1
