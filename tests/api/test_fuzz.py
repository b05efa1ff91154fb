"""Fuzz the local API from its own OpenAPI document, against a real ``bide run``.

Schemathesis (``schemathesis.openapi.from_dict`` on the checked-in ``daemon/api/openapi.json``)
generates the requests: valid and invalid ones for each operation (stateless), and chains of
calls that follow the links it infers between operations (``as_state_machine``: register, then
read, story, withdraw, decide on what was registered). Schemathesis' own transport speaks TCP,
so every request is sent by httpx over the daemon's Unix socket, and the httpx response is handed
back to schemathesis' checks. Raw requests the document does not generate (wrong methods,
malformed and oversized bodies, unknown paths) are sent by hand.

Every response must:

* not be a server error: no 500, and no 5xx at all except a documented 503 ``loading``;
* carry a status code the document lists for the operation, with the documented content type,
  and a JSON body that validates against the listed schema (schemathesis'
  ``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``);

and the daemon must be alive and answer ``GET /v1/health`` after every test.

Runs in about 8 s (250 stateless examples, 30 stateful scenarios of up to 8 calls, 120 raw
requests, and the HEAD check on a daemon of its own). Skips only when schemathesis is not
installed (it is in the ``test`` extra: ``pip install -e '.[test]'``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition

import daemon.api
from tests.e2e.harness import Daemon, Workspace, until, workspace

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed (it is in the `test` extra)"
)

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

DOCUMENT: dict[str, Any] = json.loads(
    (Path(daemon.api.__file__).parent / "openapi.json").read_text()
)
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
BASE = "http://bide"

# The jobs the simulator knows: one that succeeds, one still running for the whole run, two that
# escalate (a 401 and a state the contract has never seen), so escalations and decisions exist.
JOBS: dict[str, str | list[object]] = {
    "ok-1": "queued, succeeded with result",
    "long-1": "running x100000",
    "deny-1": [{"status": 401}],
    "odd-1": "queued, manual_review",
}
KNOWN_OPS = ["fz-ok", "fz-long", "fz-deny", "fz-odd"]

_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
_SETTINGS = settings(
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Api:
    ws: Workspace
    daemon: Daemon
    client: httpx.Client


def _client(sock: Path) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)), base_url=BASE, timeout=httpx.Timeout(30.0)
    )


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with workspace(tmp_path_factory.mktemp("fuzz"), JOBS) as ws:
        d = ws.start_daemon()
        sock = ws.root / "state" / "api.sock"
        until(sock.exists, 10, "the api socket")
        for job, op in zip(JOBS, KNOWN_OPS, strict=True):
            watched = ws.watch(job, op)
            assert watched.returncode == 0, watched.stdout + watched.stderr
        with _client(sock) as client:
            # The first story read loads the history (a documented 503 ``loading`` until then):
            # load it now so the fuzz sees the steady state, and let both escalations happen.
            until(
                lambda: client.get("/v1/operations/fz-ok/story").status_code == 200,
                30,
                "the story history to load",
            )
            until(
                lambda: len(client.get("/v1/escalations").json()["escalations"]) >= 2,
                30,
                "two escalations",
            )
            yield Api(ws, d, client)
        _assert_alive(Api(ws, d, client))


def _assert_alive(api: Api) -> None:
    assert api.daemon.proc.poll() is None, f"the daemon died:\n{api.daemon.output()[-4000:]}"
    try:
        with _client(api.ws.root / "state" / "api.sock") as fresh:
            health = fresh.get("/v1/health")
    except httpx.TransportError as exc:
        raise AssertionError(
            f"the API stopped answering ({exc!r}); the daemon's output:\n"
            f"{api.daemon.output()[-4000:]}"
        ) from exc
    assert health.status_code == 200, health.text
    assert "Traceback" not in api.daemon.output(), api.daemon.output()[-4000:]


def _not_a_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx, except a 503 ``loading`` (the history still loading), and only where documented
    (``status_code_conformance`` checks that)."""
    if response.status_code >= 500:
        try:
            code = json.loads(response.content).get("error")
        except (ValueError, AttributeError):
            code = None
        if not (response.status_code == 503 and code == "loading"):
            raise AssertionError(f"server error {response.status_code}: {response.content!r}")
    return None


CHECKS = [
    _not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _zero_wait(case: Any) -> None:
    """Keep the fuzzed ``wait`` strings' shape but make every duration zero: a valid wait on a
    live operation would otherwise hold the request for up to 60 s."""
    if case.query and isinstance(case.query.get("wait"), str):
        case.query["wait"] = re.sub(r"[1-9]", "0", case.query["wait"])


def _send(client: httpx.Client, case: Any) -> httpx.Response:
    _zero_wait(case)
    kw = case.as_transport_kwargs(base_url=BASE)
    headers = {k: v for k, v in kw.get("headers", {}).items() if k != "Connection"}
    content = kw.get("data")
    if "json" in kw:
        content = json.dumps(kw["json"]).encode()
        headers["Content-Type"] = "application/json"
    if isinstance(content, str):
        content = content.encode()
    return client.request(
        kw["method"], kw["url"], params=kw.get("params") or None, headers=headers, content=content
    )


def _validate(case: Any, response: httpx.Response) -> None:
    __tracebackhide__ = True
    case.validate_response(response, checks=CHECKS)


# -- stateless: every operation, valid and invalid input ------------------------------------


@st.composite
def _steered(draw: st.DrawFn) -> Any:
    """A generated case, now and then aimed at what exists: a known operation id in the path,
    the ``sim`` provider in a registration, so the fuzz reaches past the 404s and 422s."""
    mode = draw(st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]))
    case = draw(SCHEMA.as_strategy(generation_mode=mode))
    if case.path_parameters and "operation_id" in case.path_parameters and draw(st.booleans()):
        case.path_parameters["operation_id"] = draw(st.sampled_from(KNOWN_OPS))
    if (
        isinstance(case.body, dict)
        and "provider" in case.body
        and isinstance(case.body["provider"], str)
        and draw(st.booleans())
    ):
        case.body["provider"] = "sim"
    return case


def test_every_operation_answers_as_documented(api: Api) -> None:
    @settings(_SETTINGS, max_examples=250)
    @given(case=_steered())
    def fuzz(case: Any) -> None:
        response = _send(api.client, case)
        statuses.append(response.status_code)
        _validate(case, response)

    statuses: list[int] = []
    fuzz()
    assert any(200 <= s < 300 for s in statuses), statuses
    assert any(s >= 400 for s in statuses), statuses
    _assert_alive(api)


# -- stateful: chains along the links schemathesis infers -----------------------------------


def test_workflows_answer_as_documented(api: Api) -> None:
    sent: list[tuple[str, int]] = []
    failures: list[str] = []

    class Workflow(SCHEMA.as_state_machine()):  # type: ignore[misc]
        def call(self, case: Any, **kwargs: Any) -> Any:
            try:
                response = _send(api.client, case)
            except httpx.HTTPError as exc:
                failures.append(f"{case.operation.label}: no answer ({exc!r})")
                raise
            sent.append((case.operation.label, response.status_code))
            return schemathesis.Response.from_any(response)

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            __tracebackhide__ = True
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as exc:
                failures.append(
                    f"{case.operation.label} -> {response.status_code} "
                    f"{response.content[:500]!r}: {exc}"
                )
                raise

    try:
        Workflow.run(
            settings=settings(_SETTINGS, max_examples=30, stateful_step_count=8, phases=_NO_SHRINK)
        )
    except Exception as exc:
        # Schemathesis draws a chain's later steps from what the live daemon answered (the
        # operations listed, their states), and that changes from one example to the next, so
        # hypothesis may stop with FlakyStrategyDefinition: an artifact of generation, which
        # also hides any failure behind it. The responses checked until then stand, and a
        # failing one is named here.
        if failures:
            raise AssertionError("\n".join(failures[:5])) from exc
        if not isinstance(exc, FlakyStrategyDefinition):
            raise
    # The chains did reach past their first step into what they registered.
    assert len({label for label, _ in sent}) >= 4, sent
    assert any(200 <= status < 300 for _, status in sent), sent
    _assert_alive(api)


# -- raw: what the document does not generate -----------------------------------------------

ERROR_SCHEMA = DOCUMENT["components"]["schemas"]["ApiError"]
_PATHS = [p.replace("{operation_id}", "fz-ok") for p in DOCUMENT["paths"]]


def _documented(path: str, method: str) -> dict[str, Any] | None:
    for template, item in DOCUMENT["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
            operation: dict[str, Any] = item.get(method.lower()) or next(iter(item.values()))
            return operation
    return None


def _check_raw(request: httpx.Request, response: httpx.Response) -> None:
    __tracebackhide__ = True
    where = f"{request.method} {request.url.raw_path!r} {request.content[:200]!r}"
    assert response.status_code < 500, f"{where} -> {response.status_code} {response.text}"
    operation = _documented(request.url.path, request.method)
    if operation is not None:
        assert str(response.status_code) in operation["responses"], (
            f"{where} -> undocumented {response.status_code} {response.text}"
        )
    if response.status_code >= 400:
        assert response.headers.get("content-type", "").startswith("application/json"), where
        body = response.json()
        assert isinstance(body, dict), f"{where} -> {response.text}"
        assert set(body) <= set(ERROR_SCHEMA["properties"]), f"{where} -> {response.text}"
        assert isinstance(body.get("error"), str), f"{where} -> {response.text}"
        assert isinstance(body.get("detail"), str), f"{where} -> {response.text}"
        assert body.get("field") is None or isinstance(body["field"], str), where


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_bodies = (
    st.binary(max_size=64)
    | _json_values.map(lambda v: json.dumps(v).encode())
    | st.sampled_from(
        [
            b"",
            b"{",
            b"null",
            b"[]",
            b"{}",
            b'{"provider": "sim"}',
            b"\xff\xfe",
            b'{"a": ' * 200,
            b'{"job_id": "x"}' + b" " * 70000,
        ]
    )
)


def test_raw_requests_answer_as_documented(api: Api) -> None:
    @settings(_SETTINGS, max_examples=120)
    # HEAD is left to test_head_is_answered_and_the_daemon_goes_on, on a daemon of its own:
    # today it kills the daemon (see there), which would take every later example down with it.
    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
        path=st.sampled_from(
            [
                *_PATHS,
                "/",
                "/v1",
                "/v1/nope",
                "/v1/operations/fz-ok/x",
                "/v1/operations/%00",
                "/v1/operations/%2F..%2F",
            ]
        ),
        body=_bodies,
        json_type=st.booleans(),
    )
    def fuzz(method: str, path: str, body: bytes, json_type: bool) -> None:
        headers = {"Content-Type": "application/json"} if json_type else {}
        request = api.client.build_request(
            method, path, content=body if body else None, headers=headers
        )
        _check_raw(request, api.client.send(request))

    fuzz()
    _assert_alive(api)


# BUG (found by this fuzz; daemon/api/server.py, not fixed here): any HEAD request, e.g.
# ``HEAD /v1/health HTTP/1.1`` with no body, kills the daemon. The handler answers 405 with a
# JSON body; ``ApiServer._write`` sends the h11.Response (Content-Length: 67), then h11.Data with
# the body, which h11 refuses for a HEAD ("Too much data for declared Content-Length"). That
# h11.LocalProtocolError escapes ``_connection`` (which only swallows transport errors), tears
# down ``ApiServer.serve``'s task group and ``Supervisor._serve_api``; the socket is removed and
# ``bide run`` exits 1 a few seconds later. This test fails until that is fixed.
def test_head_is_answered_and_the_daemon_goes_on(tmp_path: Path) -> None:
    with workspace(tmp_path, {}) as ws:
        d = ws.start_daemon()
        sock = ws.root / "state" / "api.sock"
        until(sock.exists, 10, "the api socket")
        with _client(sock) as client:
            for path in ["/v1/health", *_PATHS]:
                for body in (b"", b"{}"):
                    request = client.build_request("HEAD", path, content=body or None)
                    response = client.send(request)
                    assert response.status_code < 500, f"HEAD {path} -> {response.status_code}"
                    assert response.content == b"", f"HEAD {path}: a body after a HEAD"
                    operation = _documented(path, "HEAD")
                    assert operation is not None
                    assert str(response.status_code) in operation["responses"], (
                        f"HEAD {path} -> undocumented {response.status_code}"
                    )
                    _assert_alive(Api(ws, d, client))
