"""The provider profile's key reference, generated from the structs that read a profile, so
the document cannot drift from the code: ``python -m daemon.profile_reference`` prints it, and
``deploy/profiles/REFERENCE.md`` is its output (a test compares them).

The contract's keys are described by :class:`replay.contract.Contract`'s own docstring; the
call tables' keys by :data:`MEANINGS` below, which a test holds complete.
"""

from __future__ import annotations

import re
import sys

import msgspec

from daemon.awssign import AwsSigning
from daemon.profile import (
    CancelCall,
    CredentialRef,
    FetchCall,
    Quota,
    StatusCall,
    SubmitCall,
)
from replay.contract import Contract, ResultField
from replay.rules import Condition, StateRule

#: What each key of the call tables means (the contract's keys are in Contract's docstring).
MEANINGS: dict[str, dict[str, str]] = {
    "status": {
        "url": "the status URL: `{job_id}` (percent-encoded, one segment or query value) or "
        "`{+job_id}` (a path: slashes kept); none in a POST read's URL",
        "method": "`GET` or `HEAD`; `POST` only with `body` and `read_only_post = true` (S19)",
        "timeout_seconds": "the whole request's time limit",
        "max_body_bytes": "a longer answer is cut here and read as truncated",
        "request_id_header": "the provider's request id header, kept in the story (S25)",
        "headers": "static headers sent with every request (e.g. `X-GitHub-Api-Version`)",
        "body": "a POST read's fixed JSON body, `{job_id}` once as a whole string value",
        "read_only_post": "the operator's word that the POST only reads",
    },
    "credential": {
        "file": "a token file under `credentials_dir` or `$CREDENTIALS_DIRECTORY` (0600)",
        "command": "instead of `file`: an absolute program printing a token and its expiry",
        "header": "the header the token goes in (only to the status URL's origin)",
        "scheme": 'the value is `SCHEME TOKEN`; `""` sends the bare token',
        "timeout_seconds": "the command is killed (its process group) after this long",
        "expiry_skew_seconds": "the command runs again this long before the token expires",
        "cache_seconds": "how long a token without an expiry is kept",
        "env": "environment variables for the command (nothing else of the daemon's)",
    },
    "quota": {
        "requests_per_second": "GCRA rate for every request to the provider",
        "burst": "how many may go at once after a quiet spell",
        "max_in_flight": "requests to the provider open at once",
    },
    "submit": {
        "url": "where `bide submit` sends the job",
        "method": "`POST` or `PUT`",
        "content_type": "the body's content type",
        "timeout_seconds": "the submit call's time limit",
        "idempotency_header": "the idempotency key's header (with `idempotent_submit`)",
        "job_id_from": "where the answer names the job: `location`, `operation-location`, `body`",
        "job_id_pointer": 'with `job_id_from = "body"`: the job id\'s pointer',
        "status_from": "the status URL: `template`, or the answer's `location` / "
        "`operation-location`",
        "max_attempts": "submit attempts under one idempotency key",
        "max_body_bytes": "the largest submit body",
        "status_path_prefix": "where a status resource named by a header may be (S22)",
    },
    "fetch": {
        "max_bytes": "the largest result downloaded",
        "timeout_seconds": "the download's time limit",
    },
    "cancel": {
        "url": "the provider's documented cancel call (offered to a human only, S27)",
        "method": "`POST`, `DELETE` or `PUT`",
        "timeout_seconds": "the cancel call's time limit",
    },
    "aws": {
        "region": "the AWS region signed for",
        "service": "the signing name (`states`, `batch`, ...)",
        "credentials_file": "the key pair (JSON, 0600) under `credentials_dir`",
    },
}

TABLES: list[tuple[str, type[msgspec.Struct]]] = [
    ("status", StatusCall),
    ("credential", CredentialRef),
    ("quota", Quota),
    ("submit", SubmitCall),
    ("fetch", FetchCall),
    ("cancel", CancelCall),
    ("aws", AwsSigning),
]


def _default(field: msgspec.structs.FieldInfo) -> str:
    if field.required:
        return "required"
    if field.default is not msgspec.NODEFAULT:
        value = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        value = field.default_factory()
    else:
        return ""
    if value is None or value == () or value == {}:
        return "unset"
    return f"`{msgspec.json.encode(value).decode()}`"


def docstring_attributes(cls: type) -> dict[str, str]:
    """``name: text`` of a Google-style docstring's Attributes section, joined onto one line."""
    doc = cls.__doc__ or ""
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    out: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        m = re.match(r"^\s{8}(\w+): (.*)$", line)
        if m:
            name, out[m[1]] = m[1], m[2]
        elif name and line.strip():
            out[name] += " " + line.strip()
    return {k: _markdown(v) for k, v in out.items()}


def _markdown(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown, safe in a table cell."""
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _table(title: str, cls: type[msgspec.Struct], meanings: dict[str, str]) -> list[str]:
    rows = [f"### {title}", "", "| key | default | meaning |", "|---|---|---|"]
    for field in msgspec.structs.fields(cls):
        rows.append(f"| `{field.name}` | {_default(field)} | {meanings.get(field.name, '')} |")
    return [*rows, ""]


def reference() -> str:
    lines = [
        "# Provider profile reference",
        "",
        "Every key a profile may hold, with its default. Generated from the structs that read a",
        "profile (`python -m daemon.profile_reference > deploy/profiles/REFERENCE.md`); a test",
        "fails when this file and the code disagree. How to write a profile, the rule language and",
        "the nine shipped profiles: [the operator's guide](../README.md#8-provider-profiles).",
        "",
    ]
    for name, cls in TABLES:
        lines += _table(f"[{name}]", cls, MEANINGS[name])
    lines += _table("[contract]", Contract, docstring_attributes(Contract))
    lines += _table("[[contract.results]] entries", ResultField, docstring_attributes(ResultField))
    lines += [
        "Result kinds: `https_url` (an absolute https URL), `url` (the same with http or https),",
        "`non_empty` (a string with a non-blank character), `present` (any JSON value but null).",
        "A success whose required result fails its kind is a `contradiction` (S4) that stops the",
        "wait: a provider answering with `http://` URLs (a local simulator, a test server) needs",
        "`url`, not `https_url`.",
        "",
    ]
    lines += _table("[[contract.state_rules]] entries", StateRule, docstring_attributes(StateRule))
    lines += _table("conditions (in `when` and `some`)", Condition, docstring_attributes(Condition))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    del argv
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
