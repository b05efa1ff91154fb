"""The HTTP shell alone (``StatusClient.call``) against the raw server: the bounds that live
in it, without a daemon around them.

* A provider that trickles its response head a byte at a time never trips httpx's timeouts
  (they bound each socket read): the exchange as a whole must still end within its budget.
* When one request's budget runs out the client is rebuilt (a cancelled request may keep its
  pool slot); another operation's request in flight on the old client must still get its
  answer, not a "connection reset" charged to its transport budget.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio

from daemon.http import Answer, NoAnswer, StatusClient
from daemon.profile import load_profile
from daemon.simulator import run_in_thread, script_from_dict
from tests.e2e.harness import DEFAULT_CONTRACT, STATES
from tests.faults.rawserver import RawServer


def _client(tmp_path: Path, raw: RawServer) -> StatusClient:
    path = tmp_path / "raw.toml"
    path.write_text(
        f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\n\n'
        f"[contract]\n{DEFAULT_CONTRACT}\n{STATES}"
    )
    return StatusClient(load_profile(path), None)


def test_slowloris_head_ends_within_the_budget(tmp_path: Path) -> None:
    raw = RawServer()
    try:

        async def run() -> tuple[Answer | NoAnswer, float]:
            client = _client(tmp_path, raw)
            started = time.monotonic()
            try:
                result = await client.call(
                    "GET", f"{raw.base_url}/jobs/slow-head", seconds=1.0, cap=4096
                )
            finally:
                await client.aclose()
            return result, time.monotonic() - started

        result, took = anyio.run(run)
    finally:
        raw.close()
    assert isinstance(result, NoAnswer)
    assert result.kind == "read_timeout"
    assert "head" in result.detail
    assert took < 1.0 + 0.5


def test_one_timeout_does_not_cut_another_request_in_flight(tmp_path: Path) -> None:
    raw = RawServer()
    results: dict[str, Answer | NoAnswer] = {}
    try:

        async def run() -> None:
            client = _client(tmp_path, raw)

            async def one(name: str, seconds: float) -> None:
                results[name] = await client.call(
                    "GET", f"{raw.base_url}/jobs/{name}", seconds=seconds, cap=4096
                )

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, "late", 3.0)  # answers after 1.5 s
                    tg.start_soon(one, "slow-body", 0.5)  # times out at 0.5 s: a rebuild
            finally:
                await client.aclose()

        anyio.run(run)
    finally:
        raw.close()
    slow = results["slow-body"]
    assert isinstance(slow, NoAnswer)
    assert slow.kind == "read_timeout"
    late = results["late"]
    assert isinstance(late, Answer), late
    assert late.status == 200
    assert late.body == b'{"status": "running"}'


def test_a_rotated_or_removed_credential_is_seen_on_the_next_request(tmp_path: Path) -> None:
    """The credential file is re-read whenever it changes (same size included): rotation needs
    no restart, a removed file stops the request before it is sent, and the error names the
    file, never the secret."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    token = creds / "sim.token"
    right, wrong = "rotation-test-token-1", "rotation-test-token-2"
    script = script_from_dict({"jobs": {"j": {"steps": "running"}}})
    with run_in_thread(script, token=right) as sim:
        path = tmp_path / "sim.toml"
        path.write_text(
            f'[status]\nurl = "{sim.base_url}/jobs/{{job_id}}"\n\n'
            f'[credential]\nfile = "sim.token"\n\n'
            f"[contract]\n{DEFAULT_CONTRACT}\n{STATES}"
        )

        async def run() -> list[Answer | NoAnswer]:
            client = StatusClient(load_profile(path), creds)
            out: list[Answer | NoAnswer] = []
            try:
                for step, secret in enumerate((right, wrong, right, None), start=1):
                    if secret is None:
                        token.unlink()
                    else:
                        token.write_text(secret + "\n")
                        token.chmod(0o600)  # a credential open to others is refused
                        # Distinct mtimes whatever the file system's timestamp resolution.
                        os.utime(token, ns=(step * 10**9, step * 10**9))
                    out.append(
                        await client.call("GET", f"{sim.base_url}/jobs/j", seconds=2, cap=4096)
                    )
            finally:
                await client.aclose()
            return out

        ok, denied, again, missing = anyio.run(run)
    assert isinstance(ok, Answer)
    assert ok.status == 200
    assert isinstance(denied, Answer)
    assert denied.status == 401
    assert isinstance(again, Answer)
    assert again.status == 200
    assert isinstance(missing, NoAnswer)
    assert missing.kind == "not_sent"  # never left: no credential to send
    assert "not sent" in missing.detail
    assert str(token) in missing.detail
    assert right not in missing.detail


def test_urls_that_are_not_the_profiles_are_not_sent_and_never_raise(tmp_path: Path) -> None:
    """Issue 20: a bad port, a broken IPv6 literal, a TAB, another origin, another path: each
    a ``not_sent`` failure the model reads, the raw server untouched."""
    raw = RawServer()
    try:

        async def run() -> list[tuple[str, str]]:
            client = _client(tmp_path, raw)
            out = []
            try:
                for url in (
                    f"http://127.0.0.1:{raw.port + 70000}/jobs/x",
                    "http://[::1/jobs/x",
                    f"{raw.base_url}/jobs/a\tb",
                    "http://127.0.0.2:1/jobs/x",
                    f"{raw.base_url}/admin/users",
                    f"{raw.base_url}/jobs/../admin",
                ):
                    fact = await client.fetch(
                        operation_id="op", url=url, request_number=1, time_left=5.0, clock=time.time
                    )
                    out.append((getattr(fact, "kind", ""), getattr(fact, "detail", "")))
            finally:
                await client.aclose()
            return out

        results = anyio.run(run)
        assert [kind for kind, _ in results] == ["not_sent"] * 6, results
        assert raw.seen == []
    finally:
        raw.close()


def test_a_status_outside_100_to_599_is_a_protocol_error(tmp_path: Path) -> None:
    raw = RawServer()
    try:

        async def run() -> Answer | NoAnswer:
            client = _client(tmp_path, raw)
            try:
                return await client.call(
                    "GET", f"{raw.base_url}/jobs/status-999", seconds=2.0, cap=4096
                )
            finally:
                await client.aclose()

        result = anyio.run(run)
    finally:
        raw.close()
    assert isinstance(result, NoAnswer)
    assert result.kind == "protocol_error"
    assert "999" in result.detail


def test_a_providers_cookies_are_never_kept_or_sent_back(tmp_path: Path) -> None:
    """Each response sets a new cookie: none rides on a later request (a status request
    carries only the profile's headers), and the jar does not grow with them."""
    raw = RawServer()
    body = b'{"status": "running"}'
    for i in range(20):
        raw.replies[f"c{i}"] = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Set-Cookie: s%d=v%d; Path=/\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % (i, i, len(body))
        ) + body
    try:

        async def run() -> list[Answer | NoAnswer]:
            client = _client(tmp_path, raw)
            try:
                return [
                    await client.call("GET", f"{raw.base_url}/jobs/c{i}", seconds=5.0, cap=4096)
                    for i in range(20)
                ]
            finally:
                await client.aclose()

        answers = anyio.run(run)
    finally:
        raw.close()
    assert all(isinstance(a, Answer) and a.status == 200 for a in answers)
    assert len(raw.seen) == 20
    assert not [s.path for s in raw.seen if b"\r\ncookie:" in s.head.lower()]


def test_a_urls_userinfo_never_replaces_the_profiles_credential(tmp_path: Path) -> None:
    """A status location a provider names may carry ``user:password@`` (it is on the provider's
    origin, so it passes the URL checks). The request must carry the profile's credential and
    nothing built from the URL: no Basic authorization the provider chose, and no userinfo on
    the wire."""
    raw = RawServer()
    raw.replies["u"] = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: 2\r\n\r\n{}"
    )
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    token = creds / "raw.token"
    token.write_text("profile-credential-5e1\n")
    token.chmod(0o600)
    path = tmp_path / "raw.toml"
    path.write_text(
        f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\n\n'
        f'[credential]\nfile = "raw.token"\n\n'
        f"[contract]\n{DEFAULT_CONTRACT}\n{STATES}"
    )
    try:

        async def run() -> object:
            client = StatusClient(load_profile(path), creds)
            try:
                return await client.fetch(
                    operation_id="op",
                    url=f"http://mallory:chosen@127.0.0.1:{raw.port}/jobs/u",
                    request_number=1,
                    time_left=5.0,
                    clock=time.time,
                )
            finally:
                await client.aclose()

        fact = anyio.run(run)
    finally:
        raw.close()
    assert getattr(fact, "status_code", None) == 200, fact
    [seen] = raw.seen
    head = seen.head.lower()
    assert b"\r\nauthorization: bearer profile-credential-5e1\r\n" in head
    assert b"basic" not in head
    assert b"mallory" not in head


def test_the_providers_own_rate_limit_headers_are_recorded_only_when_named(
    tmp_path: Path,
) -> None:
    """A profile naming ``x-ratelimit-remaining`` / ``x-ratelimit-reset`` gets them in the
    response (matched without regard to case); a profile that names none records neither."""
    raw = RawServer()
    body = b'{"message": "API rate limit exceeded"}'
    raw.replies["limited"] = (
        b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
        b"x-ratelimit-remaining: 0\r\nx-ratelimit-reset: 1800000600\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    named = tmp_path / "named.toml"
    named.write_text(
        f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\n\n'
        f'[contract]\nrate_limit_remaining_header = "X-RateLimit-Remaining"\n'
        f'rate_limit_reset_header = "x-ratelimit-reset"\n{DEFAULT_CONTRACT}\n{STATES}'
    )
    try:

        async def run() -> list[Answer | NoAnswer]:
            answers: list[Answer | NoAnswer] = []
            for client in (StatusClient(load_profile(named), None), _client(tmp_path, raw)):
                try:
                    url = f"{raw.base_url}/jobs/limited"
                    answers.append(await client.call("GET", url, seconds=5.0, cap=4096))
                finally:
                    await client.aclose()
            return answers

        with_names, without = anyio.run(run)
    finally:
        raw.close()
    assert isinstance(with_names, Answer)
    assert isinstance(without, Answer)
    assert with_names.status == 403
    assert with_names.headers.ratelimit_remaining == "0"
    assert with_names.headers.ratelimit_reset == "1800000600"
    assert (without.headers.ratelimit_remaining, without.headers.ratelimit_reset) == (None, None)
