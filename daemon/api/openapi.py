"""The OpenAPI 3.1 document of the local API, generated from its msgspec structs.

``daemon/api/openapi.json`` is this document, checked in (``tests/api/test_openapi.py``
fails when the two differ; ``python -m daemon.api.openapi > daemon/api/openapi.json``
writes it again).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec

from daemon.api import schema

_REF = "#/components/schemas/{name}"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    answers: dict[int, type[msgspec.Struct]]  # JSON answers (none for a binary one)
    body: type[msgspec.Struct] | None = None
    query: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    errors: tuple[int, ...] = (403, 404)
    text: bool = False  # also answers text/plain
    binary: bool = False  # the 200 answer is application/octet-stream (a fetched result)
    tags: list[str] = field(default_factory=list)


_OP = ("operation_id", "the operation id", {"type": "string", "minLength": 1})
_ACTION = ("action_id", "the fetch's id (OP.fetch.N)", {"type": "string", "minLength": 1})
_WAIT = (
    "wait",
    "how long to wait for the end, e.g. 30s (capped at 60 s)",
    {"type": "string", "pattern": "^[0-9smhd.]{1,16}$"},
)

ROUTES: tuple[Route, ...] = (
    Route(
        "get",
        "/v1/health",
        "The daemon's health, the log head, and who you are.",
        {200: schema.Health},
        errors=(403,),
    ),
    Route(
        "post",
        "/v1/operations",
        "Register a job already submitted (bide watch). Answered "
        "once the registration is durable; the same operation id and request again answers "
        "the same receipt (200), a different request 409.",
        {201: schema.Receipt, 200: schema.Receipt},
        body=schema.WatchRequest,
        errors=(400, 403, 409, 422, 429, 503),
    ),
    Route(
        "get",
        "/v1/operations",
        "Your operations (approvers and operators: everyone's with all=true), oldest first, paged.",
        {200: schema.OperationPage},
        query=(
            (
                "phase",
                "only this phase",
                {"type": "string", "enum": ["live", "succeeded", "escalated", "closed"]},
            ),
            (
                "limit",
                "at most this many (1-500, default 100)",
                {"type": "string", "pattern": "^[0-9]{1,3}$"},
            ),
            ("cursor", "next_cursor of the previous page", {"type": "string"}),
            (
                "all",
                "everyone's operations (approvers, operators)",
                {"type": "string", "enum": ["true", "false", "1", "0"]},
            ),
        ),
        errors=(400, 403),
    ),
    Route(
        "post",
        "/v1/submissions",
        "Let bide make the submit call, then wait on the job it "
        "starts (bide submit). Answered once the intent is durable.",
        {202: schema.Receipt, 200: schema.Receipt},
        body=schema.SubmitRequest,
        errors=(400, 403, 409, 422, 429, 503),
    ),
    Route(
        "get",
        "/v1/operations/{operation_id}",
        "One operation. With wait=DURATION (at most "
        "60 s), answers as soon as it succeeds, escalates or closes, or when the wait ends "
        "(done: false, and when to ask again). Waiting costs no provider request.",
        {200: schema.OperationView},
        query=(
            (
                "wait",
                "how long to wait for the end, e.g. 30s (capped at 60 s)",
                {"type": "string", "pattern": "^[0-9smhd.]{1,16}$"},
            ),
            (
                "until",
                "done (default): succeeded, escalated or closed; registered: a submit was answered",
                {"type": "string", "enum": ["done", "registered"]},
            ),
        ),
        errors=(400, 403, 404),
    ),
    Route(
        "get",
        "/v1/operations/{operation_id}/story",
        "The operation's audit story, from "
        "the daemon's memory; format=text for the lines as bide story prints them.",
        {200: schema.Story},
        query=(("format", "json (default) or text", {"type": "string", "enum": ["json", "text"]}),),
        errors=(403, 404, 410, 503),
        text=True,
    ),
    Route(
        "post",
        "/v1/operations/{operation_id}/withdrawal",
        "Stop waiting on your own operation (recorded as withdrawn_by_owner; no provider call).",
        {200: schema.WithdrawAnswer},
        body=schema.WithdrawRequest,
        errors=(400, 403, 404, 409, 422, 503),
    ),
    Route(
        "get",
        "/v1/escalations",
        "Open escalations: your own (agents), everyone's "
        "(approvers, operators), each with its numbered options.",
        {200: schema.EscalationList},
        errors=(403,),
    ),
    Route(
        "post",
        "/v1/operations/{operation_id}/decision",
        "Answer an open escalation with "
        "one of its options (approvers; never your own operation's unless the config "
        "allows self-approval).",
        {200: schema.DecisionAnswer},
        body=schema.DecisionRequest,
        errors=(400, 403, 404, 409, 422, 503),
    ),
    Route(
        "post",
        "/v1/operations/{operation_id}/fetch",
        "Download your own succeeded "
        "operation's result through the daemon, with the provider's credential, as a "
        "recorded action (operators: anyone's; for anyone else the operation does not "
        "exist). Answers 200 once it ends within wait, else 202 (ask GET /v1/fetches/"
        "{action_id}). Limited per user by [fetch] per_principal_per_minute (429).",
        {200: schema.FetchAnswer, 202: schema.FetchAnswer},
        body=schema.FetchRequest,
        query=(_WAIT,),
        errors=(400, 403, 404, 409, 422, 429, 503),
    ),
    Route(
        "get",
        "/v1/fetches/{action_id}",
        "Where your fetch is; with wait=DURATION, answers as soon as it ends.",
        {200: schema.FetchAnswer},
        query=(_WAIT,),
        errors=(400, 403, 404),
    ),
    Route(
        "get",
        "/v1/fetches/{action_id}/content",
        "The fetched bytes "
        "(application/octet-stream; X-Bide-SHA256 is the recorded SHA-256: check it).",
        {},
        errors=(403, 404, 409, 410, 503),
        binary=True,
    ),
)


def _content(kind: type[msgspec.Struct]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(name=kind.__name__)}}}


def build() -> dict[str, Any]:
    kinds: set[type[msgspec.Struct]] = {schema.ApiError}
    for route in ROUTES:
        kinds.update(route.answers.values())
        if route.body is not None:
            kinds.add(route.body)
    ordered = sorted(kinds, key=lambda k: k.__name__)
    _, components = msgspec.json.schema_components(ordered, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method}_{route.path.strip('/').replace('/', '_')}".replace(
                "{", ""
            )
            .replace("}", "")
            .replace(".", "_"),
            "responses": {},
        }
        params = [
            {"name": name, "in": "query", "required": False, "description": text, "schema": sch}
            for name, text, sch in route.query
        ]
        for name, text, sch in (_OP, _ACTION):
            if "{" + name + "}" in route.path:
                params.insert(
                    0,
                    {
                        "name": name,
                        "in": "path",
                        "required": True,
                        "description": text,
                        "schema": sch,
                    },
                )
        if params:
            operation["parameters"] = params
        if route.body is not None:
            operation["requestBody"] = {"required": True, "content": _content(route.body)}
        if route.binary:
            operation["responses"]["200"] = {
                "description": "the bytes as downloaded",
                "headers": {"X-Bide-SHA256": {"schema": {"type": "string"}}},
                "content": {
                    "application/octet-stream": {
                        "schema": {"type": "string", "contentMediaType": "application/octet-stream"}
                    }
                },
            }
        for status, kind in sorted(route.answers.items()):
            content = _content(kind)
            if route.text:
                content["text/plain"] = {"schema": {"type": "string"}}
            operation["responses"][str(status)] = {
                "description": kind.__doc__.split("\n")[0] if kind.__doc__ else kind.__name__,
                "content": content,
            }
        for status in (*route.errors, 405, 413, 500):
            headers = (
                {"Retry-After": {"schema": {"type": "string"}}} if status in (429, 503) else {}
            )
            answer: dict[str, Any] = {
                "description": _ERRORS.get(status, "error"),
                "content": _content(schema.ApiError),
            }
            if headers:
                answer["headers"] = headers
            operation["responses"][str(status)] = answer
        paths.setdefault(route.path, {})[route.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bide local API",
            "version": "1",
            "description": "HTTP/1.1 + JSON over the daemon's Unix socket. Who you are "
            "comes from the kernel (SO_PEERCRED), never from the request.",
        },
        "servers": [{"url": "http://localhost"}],
        "paths": paths,
        "components": {"schemas": components},
    }


_ERRORS = {
    400: "malformed request",
    403: "not allowed for this user",
    404: "no such operation (or not yours)",
    405: "method not allowed",
    409: "conflicts with what is recorded",
    410: "no longer kept",
    413: "body over 64 KiB",
    422: "does not validate",
    429: "over a per-user limit",
    500: "bide failed (a bug); the daemon goes on",
    503: "not ready yet; ask again after Retry-After",
}


@functools.cache
def openapi_document() -> bytes:
    return (json.dumps(build(), indent=2, sort_keys=True) + "\n").encode()


if __name__ == "__main__":
    sys.stdout.write(openapi_document().decode())
