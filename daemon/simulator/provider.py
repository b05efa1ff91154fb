"""The simulated provider's logic, without I/O.

Theory of operation: :meth:`Provider.handle` is fed one complete request together with the
time it arrived, and returns a :class:`Reply` that says exactly what to put on the wire (or
that the connection must be reset). It routes the request, checks the bearer token,
advances the job's step by one for a status call, and appends one
:class:`~daemon.simulator.requestlog.RequestRecord` to the request log before returning, so
a request is logged even when its answer is a reset or never finishes sending. Times come
in as arguments; the provider reads no clock and touches no socket, which keeps the server
in :mod:`daemon.simulator.server` a thin shell.

Routes::

    GET|HEAD /jobs/{id}          status: the job's next step
    POST     /jobs               submit a scenario -> 202 + Location (per `server.submit`)
    POST     /jobs/{id}/cancel   the job answers "canceled" from then on
    GET|HEAD /results/{id}       a result file of the job's `result_size` bytes
    GET|HEAD /jobs?NAME={id}     with `server.job_query = NAME`: status, the id in the query
    GET|HEAD /jobs/{a}/{b}/...   with `server.path_ids`: status of job `a/b/...`
    POST     /_sim/jobs          admin: add a job (no token needed): {"id"?, "steps",
                                 "result_size"?}, or a bare JSON list of steps
    GET      /_sim/requests      admin: the request log as a JSON array
    POST     /                   with [server.aws_json]: status as AWS's JSON protocol, the
                                 job named in the body, SigV4 verified (simulator/awsjson.py)

Job ids are single path segments, percent-decoded (``/jobs/a%2Fb`` is job ``a/b``); a path
with a ``.`` or ``..`` segment is answered 404 and logged as ``path_escape``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any, Final, Literal
from urllib.parse import parse_qs, quote, unquote

import msgspec

import daemon.simulator.awsjson as awsjson
from daemon.simulator.requestlog import (
    RequestLog,
    RequestRecord,
    redact_headers,
    redact_target,
)
from daemon.simulator.script import Job, NewJob, Script, Step, parse_steps

__all__ = ["Provider", "Reply", "Request", "Stream"]

_JSON: Final = ("Content-Type", "application/json")
_encoder: Final = msgspec.json.Encoder()


@dataclass(frozen=True)
class Request:
    """A complete request as read off the wire."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of a header (case-insensitive), or None."""
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


@dataclass(frozen=True)
class Stream:
    """A body generated while sending: ``prefix``, ``fill`` repeated, ``suffix``; ``size`` bytes."""

    size: int
    prefix: bytes = b""
    suffix: bytes = b""
    fill: bytes = b"x"

    def chunks(self, chunk_size: int = 64 * 1024) -> Iterator[bytes]:
        """The body in chunks of at most ``chunk_size`` bytes."""
        head, tail = self.prefix, self.suffix
        if len(head) + len(tail) > self.size:
            head, tail = (head + tail)[: self.size], b""
        middle = self.size - len(head) - len(tail)
        if head:
            yield head
        block = (self.fill * (chunk_size // len(self.fill) + 1))[:chunk_size]
        while middle > 0:
            piece = block[: min(middle, chunk_size)]
            middle -= len(piece)
            yield piece
        if tail:
            yield tail


@dataclass(frozen=True)
class Reply:
    """What the server must do: a response, or a reset/close without one."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    stream: Stream | None = None
    chunked: bool = False
    delay: float = 0.0
    fault: Literal["reset", "close"] | None = None

    @property
    def length(self) -> int:
        """The body length in bytes."""
        return self.stream.size if self.stream is not None else len(self.body)


@dataclass
class _JobState:
    id: str
    timeline: tuple[tuple[int, Step], ...]
    result_size: int
    created: float
    calls: int = 0
    canceled: bool = False


@dataclass(frozen=True)
class _Routed:
    kind: str
    job_id: str | None = None
    step: int | None = None
    step_label: str | None = None
    call: int | None = None


class _SubmitBody(msgspec.Struct, kw_only=True):
    """The fields of a submit body the simulator reads; anything else is the job's payload."""

    scenario: str | None = None
    steps: list[Step | str] | str | None = None
    result_size: int | None = None


def _iso(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Status " + str(status)


def _json_reply(status: int, doc: Any, *headers: tuple[str, str]) -> Reply:
    return Reply(status, (_JSON, *headers), _encoder.encode(doc))


def _error(status: int, message: str | None = None, *headers: tuple[str, str]) -> Reply:
    return _json_reply(status, {"error": message or _phrase(status)}, *headers)


def _timeline(steps: tuple[Step, ...]) -> tuple[tuple[int, Step], ...]:
    # One entry per status call; a step with `times = N` covers N calls. The last one repeats.
    return tuple((index, step) for index, step in enumerate(steps) for _ in range(step.times))


class Provider:
    """The simulated provider: jobs, submits, cancels, results and the request log.

    Args:
        script: jobs, scenarios and server behaviour.
        log: where every request is recorded.
        now: wall-clock POSIX seconds at creation (the creation time of the script's jobs).
        token: if set, every non-admin request needs ``Authorization: Bearer <token>``.
        base_url: this provider's origin, for absolute URLs (set once the port is known).
    """

    def __init__(
        self,
        script: Script,
        *,
        log: RequestLog,
        now: float,
        token: str | None = None,
        base_url: str = "http://127.0.0.1",
    ) -> None:
        self.script = script
        self.log = log
        self.base_url = base_url
        self._token = token
        self._secrets: tuple[str, ...] = (token,) if token else ()
        aws = script.server.aws_json
        if aws is not None and aws.secret_access_key:
            self._secrets += (aws.secret_access_key,)
        self._seq = 0
        self._submitted = 0
        self._jobs: dict[str, _JobState] = {}
        self._idempotency: dict[str, tuple[str, str]] = {}
        self._submits = 0
        for job_id, job in script.jobs.items():
            self.add_job(job, job_id=job_id, now=now)

    # -- jobs ------------------------------------------------------------------------------

    def add_job(self, job: Job, *, job_id: str | None = None, now: float) -> str:
        """Add a job; returns its id (a fresh ``{id_prefix}{n}`` when ``job_id`` is None).

        Raises:
            ValueError: ``job_id`` is empty or already taken.
        """
        if job_id is None:
            job_id = self._fresh_id()
        elif not job_id or job_id in self._jobs:
            raise ValueError(f"job id {job_id!r} is empty or already taken")
        size = job.result_size if job.result_size is not None else self.script.server.result_size
        steps = parse_steps(job.steps)
        self._jobs[job_id] = _JobState(job_id, _timeline(steps), size, now)
        return job_id

    def job_calls(self, job_id: str) -> int:
        """How many status calls reached a job (0 for an unknown job)."""
        state = self._jobs.get(job_id)
        return state.calls if state is not None else 0

    def _fresh_id(self) -> str:
        while True:
            self._submitted += 1
            candidate = f"{self.script.server.id_prefix}{self._submitted}"
            if candidate not in self._jobs:
                return candidate

    def _job_url(self, job_id: str) -> str:
        return f"/jobs/{quote(job_id, safe='')}"

    # -- requests --------------------------------------------------------------------------

    def handle(self, request: Request, *, wall: float, monotonic: float) -> Reply:
        """Answer one request and log it."""
        self._seq += 1
        reply, routed = self._route(request, wall)
        return self._record(request, reply, routed, wall=wall, monotonic=monotonic)

    def reject(self, request: Request, status: int, *, wall: float, monotonic: float) -> Reply:
        """Answer a request the server could not take in (e.g. a body over the limit); logged."""
        self._seq += 1
        reply = _error(status)
        return self._record(request, reply, _Routed("bad_request"), wall=wall, monotonic=monotonic)

    def _record(
        self, request: Request, reply: Reply, routed: _Routed, *, wall: float, monotonic: float
    ) -> Reply:
        self.log.append(
            RequestRecord(
                seq=self._seq,
                wall=wall,
                monotonic=monotonic,
                method=request.method,
                target=redact_target(request.target, self._secrets),
                headers=redact_headers(request.headers, self._secrets),
                kind=routed.kind,
                job_id=routed.job_id,
                step=routed.step,
                step_label=routed.step_label,
                call=routed.call,
                status=None if reply.fault else reply.status,
                fault=reply.fault,
                delay=reply.delay,
            )
        )
        return self._with_common_headers(reply, wall)

    def _with_common_headers(self, reply: Reply, wall: float) -> Reply:
        server = self.script.server
        own = {name.lower() for name, _ in reply.headers}
        headers = [("Date", formatdate(wall, usegmt=True)), ("Server", "bide-simulator")]
        headers += [(k, v) for k, v in server.headers.items() if k.lower() not in own]
        if server.request_id_header and server.request_id_header.lower() not in own:
            headers.append((server.request_id_header, f"sim-{self._seq}"))
        headers += reply.headers
        return Reply(
            reply.status,
            tuple(headers),
            reply.body,
            reply.stream,
            reply.chunked,
            reply.delay,
            reply.fault,
        )

    def _authorized(self, request: Request) -> bool:
        if self._token is None:
            return True
        given = request.header("Authorization") or ""
        return hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode())

    def _route(self, request: Request, wall: float) -> tuple[Reply, _Routed]:
        raw_path = request.target.partition("?")[0]
        if not raw_path.startswith("/"):
            return _error(400, "request target must be a path"), _Routed("bad_request")
        segments = [unquote(part) for part in raw_path[1:].split("/")]
        if any(part in (".", "..") for part in segments):
            return _error(404), _Routed("path_escape")
        method = request.method
        server = self.script.server
        if raw_path == "/" and server.aws_json is not None:
            return self._aws_json(request, server.aws_json, wall)
        queried = _query_id(request.target, server.job_query) if method != "POST" else None
        if segments == ["jobs"] and queried:
            segments = ["jobs", queried]
        elif server.path_ids and segments[0] == "jobs" and segments[2:] not in ([], ["cancel"]):
            segments = ["jobs", "/".join(segments[1:])]  # /jobs/{id}/cancel stays a cancel
        match segments:
            case ["_sim", "requests"]:
                if method != "GET":
                    return _error(405, None, ("Allow", "GET")), _Routed("admin")
                return Reply(200, (_JSON,), self.log.encode()), _Routed("admin")
            case ["_sim", "jobs"]:
                if method != "POST":
                    return _error(405, None, ("Allow", "POST")), _Routed("admin")
                return self._admin_add(request, wall)
            case ["_sim", *_]:
                return _error(404), _Routed("admin")
            case ["jobs"]:
                routed, allow = _Routed("submit"), "POST"
            case ["jobs", job_id] if job_id:
                routed, allow = _Routed("status", job_id), "GET, HEAD"
            case ["jobs", job_id, "cancel"] if job_id:
                routed, allow = _Routed("cancel", job_id), "POST"
            case ["results", job_id] if job_id:
                routed, allow = _Routed("result", job_id), "GET, HEAD"
            case _:
                return _error(404), _Routed("not_found")
        if not self._authorized(request):
            # RFC 6750 §3: a missing or wrong token is 401 with a Bearer challenge.
            return _error(401, None, ("WWW-Authenticate", 'Bearer realm="simulator"')), routed
        if method not in allow.split(", "):
            return _error(405, None, ("Allow", allow)), routed
        if routed.kind == "submit":
            return self._submit(request, wall)
        assert routed.job_id is not None
        job = self._jobs.get(routed.job_id)
        if job is None:
            return _error(404, "no such job"), routed
        if routed.kind == "status":
            return self._status(job, wall)
        if routed.kind == "cancel":
            return self._cancel(job), routed
        return self._result(job), routed

    # -- endpoints -------------------------------------------------------------------------

    def _aws_json(
        self, request: Request, config: awsjson.AwsJson, wall: float
    ) -> tuple[Reply, _Routed]:
        """A status read in AWS's JSON protocol: the job named by the body's ``job_field``,
        errors as AWS gives them (``__type``, HTTP 400/403)."""

        def aws_error(status: int, kind: str, message: str) -> Reply:
            return _json_reply(status, {"__type": kind, "message": message})

        if request.method != "POST":
            return _error(405, None, ("Allow", "POST")), _Routed("status")
        try:
            doc = msgspec.json.decode(request.body)
            job_id = doc[config.job_field] if isinstance(doc, dict) else None
        except msgspec.DecodeError:
            job_id = None
        if not isinstance(job_id, str):
            message = f"the body must be a JSON object with a string {config.job_field!r}"
            return aws_error(400, "SerializationException", message), _Routed("status")
        routed = _Routed("status", job_id)
        if config.secret_access_key:
            problem = awsjson.signature_problem(
                config,
                method=request.method,
                url=f"http://{request.header('Host') or ''}{request.target}",
                headers=request.headers,
                body=request.body,
                wall=wall,
            )
            if problem is not None:
                return aws_error(403, "InvalidSignatureException", problem), routed
        elif not self._authorized(request):
            return _error(401, None, ("WWW-Authenticate", 'Bearer realm="simulator"')), routed
        job = self._jobs.get(job_id)
        if job is None:
            return aws_error(400, "ExecutionDoesNotExist", "Execution Does Not Exist"), routed
        return self._status(job, wall)

    def _status(self, job: _JobState, wall: float) -> tuple[Reply, _Routed]:
        job.calls += 1
        state_field = self.script.server.state_field
        if job.canceled:
            reply = _json_reply(200, {"id": job.id, state_field: "canceled"})
            return reply, _Routed("status", job.id, None, "canceled", job.calls)
        index, step = job.timeline[min(job.calls - 1, len(job.timeline) - 1)]
        routed = _Routed("status", job.id, index, step.label(), job.calls)
        return self._step_reply(job, step, wall), routed

    def _step_reply(self, job: _JobState, step: Step, wall: float) -> Reply:
        status = step.http_status
        headers: list[tuple[str, str]] = []
        if step.retry_after is not None:
            headers.append(("Retry-After", str(step.retry_after)))
        if step.retry_after_date is not None:
            # RFC 9110 §10.2.3: an HTTP-date has whole seconds; round up, never earlier.
            when = math.ceil(wall + step.retry_after_date)
            headers.append(("Retry-After", formatdate(when, usegmt=True)))
        if step.redirect is not None:
            headers.append(("Location", self._substitute(step.redirect, job.id)))
        if step.fault in ("reset", "close"):
            return Reply(
                status, delay=step.delay, fault="reset" if step.fault == "reset" else "close"
            )
        if not any(name.lower() == "content-type" for name in step.headers):
            headers.append(_JSON)
        headers += step.headers.items()
        body, stream = b"", None
        state_field = self.script.server.state_field
        if step.body is not None:
            body = step.body.encode()
        elif step.fault == "malformed":
            body = b'{"id": ' + _encoder.encode(job.id) + b', "' + state_field.encode() + b'": "ru'
        elif step.fault == "oversize":
            size = step.size if step.size is not None else self.script.server.oversize_bytes
            head = {"id": job.id, state_field: step.state or "running"}
            prefix = _encoder.encode(head)[:-1] + b', "padding": "'
            stream = Stream(size, prefix=prefix, suffix=b'"}')
        else:
            body = _encoder.encode(self._document(job, step, wall))
        return Reply(status, tuple(headers), body, stream, step.chunked, step.delay)

    def _document(self, job: _JobState, step: Step, wall: float) -> dict[str, Any]:
        if step.state is None and not 200 <= step.http_status <= 299:
            return {"error": step.error or _phrase(step.http_status), **step.fields}
        doc: dict[str, Any] = {"id": job.id}
        if step.state is not None:
            doc[self.script.server.state_field] = step.state
        if step.result_url is not None:
            doc["result_url"] = step.result_url
        elif step.result:
            doc["result_url"] = f"{self.base_url}/results/{quote(job.id, safe='')}"
        if step.error is not None:
            doc["error"] = step.error
        if step.expires_at is not None:
            doc["expires_at"] = step.expires_at
        elif step.expires_in is not None:
            doc["expires_at"] = _iso(job.created + step.expires_in)
        if step.next_check_at is not None:
            doc["next_check_at"] = step.next_check_at
        elif step.next_check_in is not None:
            doc["next_check_at"] = _iso(wall + step.next_check_in)
        if step.poll_after_seconds is not None:
            doc["poll_after_seconds"] = step.poll_after_seconds
        doc.update(step.fields)
        return doc

    def _substitute(self, template: str, job_id: str) -> str:
        port = self.base_url.rsplit(":", 1)[-1]
        return (
            template.replace("{port}", port)
            .replace("{id}", quote(job_id, safe=""))
            .replace("{base}", self.base_url)
        )

    def _cancel(self, job: _JobState) -> Reply:
        if not self.script.server.cancel:
            return _error(404, "this provider has no cancel call")
        job.canceled = True
        return _json_reply(202, {"id": job.id, self.script.server.state_field: "canceled"})

    def _result(self, job: _JobState) -> Reply:
        stream = Stream(job.result_size, fill=f"result of {job.id}\n".encode())
        return Reply(200, (("Content-Type", "application/octet-stream"),), stream=stream)

    def _submit(self, request: Request, wall: float) -> tuple[Reply, _Routed]:
        server = self.script.server
        n = self._submits
        self._submits += 1
        misbehave = server.submit_steps[n] if n < len(server.submit_steps) else None
        if misbehave is not None and misbehave.status is not None:
            return _error(misbehave.status, "scripted submit failure"), _Routed("submit")
        reply, routed = self._submit_accepted(request, wall)
        if misbehave is not None:
            reply = dataclasses.replace(reply, delay=misbehave.delay, fault=misbehave.fault)
        return reply, routed

    def _submit_accepted(self, request: Request, wall: float) -> tuple[Reply, _Routed]:
        server = self.script.server
        try:
            body = (
                msgspec.json.decode(request.body, type=_SubmitBody)
                if request.body.strip()
                else _SubmitBody()
            )
        except msgspec.DecodeError as exc:
            return _error(400, f"submit body: {exc}"), _Routed("submit")
        key = request.header("Idempotency-Key") if server.idempotency else None
        fingerprint = hashlib.sha256(request.body).hexdigest()
        if key is not None and key in self._idempotency:
            job_id, seen = self._idempotency[key]
            if seen != fingerprint:
                # draft-ietf-httpapi-idempotency-key-header §2.7: key reused, payload differs.
                message = "Idempotency-Key reused with a different request body"
                return _error(422, message), _Routed("submit", job_id)
            replayed = (("Idempotent-Replayed", "true"),)
            return self._accepted(job_id, replayed), _Routed("submit", job_id)
        try:
            job = self._job_from_submit(body)
        except ValueError as exc:
            return _error(422, str(exc)), _Routed("submit")
        job_id = self.add_job(job, now=wall)
        if key is not None:
            self._idempotency[key] = (job_id, fingerprint)
        return self._accepted(job_id, ()), _Routed("submit", job_id)

    def _job_from_submit(self, body: _SubmitBody) -> Job:
        scenarios = self.script.scenarios
        if body.steps is not None:
            return Job(steps=body.steps, result_size=body.result_size)
        name = body.scenario or self.script.server.default_scenario
        if name is None or name not in scenarios:
            known = ", ".join(sorted(scenarios)) or "none"
            raise ValueError(f"unknown scenario {name!r}; known scenarios: {known}")
        return scenarios[name]

    def _accepted(self, job_id: str, extra: tuple[tuple[str, str], ...]) -> Reply:
        style = self.script.server.submit
        path = self._job_url(job_id)
        headers: tuple[tuple[str, str], ...] = extra
        if style == "location":
            headers += (("Location", path),)
        elif style == "absolute-location":
            headers += (("Location", self.base_url + path),)
        elif style == "operation-location":
            headers += (("Operation-Location", self.base_url + path),)
        return _json_reply(202, {"id": job_id}, *headers)

    def _admin_add(self, request: Request, wall: float) -> tuple[Reply, _Routed]:
        try:
            raw = msgspec.json.decode(request.body)
            if isinstance(raw, list | str):  # a bare step list (or compact string)
                raw = {"steps": raw}
            new = msgspec.convert(raw, NewJob)
        except msgspec.DecodeError as exc:
            return _error(422, f"job: {exc}"), _Routed("admin")
        try:
            job_id = self.add_job(new, job_id=new.id, now=wall)
        except ValueError as exc:
            return _error(409, str(exc)), _Routed("admin", new.id)
        url = self.base_url + self._job_url(job_id)
        return _json_reply(201, {"id": job_id, "url": url}), _Routed("admin", job_id)


def _query_id(target: str, name: str | None) -> str | None:
    """The job id a ``?NAME=ID`` query names, if the server reads ids from one."""
    if name is None:
        return None
    values = parse_qs(target.partition("?")[2]).get(name)
    return values[0] if values else None
