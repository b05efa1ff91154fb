"""Provider profiles: one TOML file per provider, validated before anything loads.

A profile has the daemon's half (how to call the provider) and the model's half (the
``[contract]`` table: how to read what comes back, as :class:`replay.contract.Contract`).
The provider's name is the file's stem (``acme.toml`` is provider ``acme``).

Example (``profiles/acme.toml``)::

    [status]
    url = "https://api.acme.example/v1/exports/{job_id}"   # job id is percent-encoded in
    method = "GET"                                         # GET or HEAD (S19, S34); POST only
                                                           # with body and read_only_post
    timeout_seconds = 10
    max_body_bytes = 65536
    request_id_header = "X-Request-Id"

    [credential]                 # optional; read at request time, never logged
    file = "acme.token"          # under credentials_dir or $CREDENTIALS_DIRECTORY, or instead
                                 # command = ["/abs/prog", ...] (see daemon.credentials)
    header = "Authorization"
    scheme = "Bearer"

    [quota]                      # shared by every request of this provider (GCRA)
    requests_per_second = 10     # no 1 s window at the provider holds more than this
    burst = 1                    # default 1; B lets B go at once after a quiet spell
    max_in_flight = 4

    [contract]
    state_pointer = "/status"
    job_id_pointer = "/id"
    results = [{ name = "result_url", pointer = "/result_url", kind = "https_url" }]
    backoff_base_seconds = 2
    backoff_cap_seconds = 60
    rate_limited_delay_seconds = 120

    [contract.states]
    pending = ["queued", "running"]
    success = ["succeeded"]
    failure = ["failed"]
    canceled = ["canceled"]
    expired = ["expired"]

The quota: ``[quota]`` is one budget for every request bide sends to the provider (status
polls, submits, fetches, cancels), kept by GCRA (the generic cell rate algorithm). With the
default ``burst = 1`` requests leave at least ``1.05 / requests_per_second`` seconds apart, so
no window of L seconds at the provider holds more than ``ceil(requests_per_second * L)`` of
them: "10 per second" means no second carries an 11th. ``burst = B`` lets B go at once after a
quiet spell (at most ``B - 1`` more in any window), for providers that document bursts. A poll
the quota holds back is recorded as a ``local_quota`` delay, never sent in a wave.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin
from urllib.parse import quote, urlsplit

import msgspec
from msgspec import Meta

from daemon import readpost
from daemon.awssign import AwsSigning, botocore_missing
from daemon.errors import ConfigError
from daemon.tomllines import (
    KeyPath,
    dotted,
    fields_at,
    key_lines,
    line_of,
    nearest,
    type_at,
    type_in_words,
)
from replay.actions import SubmitSpec, origin
from replay.contract import Contract, ResultField, StateTable, contract_digest

SAFE_METHODS = ("GET", "HEAD")
_PLACEHOLDER = "{job_id}"
#: RFC 6570 reserved expansion: the job id is a path whose slashes are kept.
_PATH_PLACEHOLDER = "{+job_id}"


class StatusCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    method: Literal["GET", "HEAD", "POST"] = "GET"
    timeout_seconds: Annotated[float, Meta(gt=0, le=300)] = 10.0
    max_body_bytes: Annotated[int, Meta(ge=256, le=16 * 1024 * 1024)] = 64 * 1024
    request_id_header: str = "X-Request-Id"
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    #: A POST read (daemon/readpost.py): the fixed JSON body, and the operator's word.
    body: str | None = None
    read_only_post: bool = False

    def __post_init__(self) -> None:
        if self.method == "POST" and not (self.read_only_post and self.body is not None):
            raise ValueError("a POST status read needs read_only_post = true and a body (S19)")


class CredentialRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Exactly one of ``file`` (a static token, re-read on change) or ``command`` (a program
    that prints a token and its expiry: :mod:`daemon.credentials`); the rest is the command's."""

    file: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")] | None = None
    command: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=64)] | None = (
        None
    )
    header: Annotated[str, Meta(pattern=r"^[A-Za-z0-9-]{1,64}$")] = "Authorization"
    scheme: Annotated[str, Meta(max_length=32)] = "Bearer"
    timeout_seconds: Annotated[float, Meta(gt=0, le=300)] = 10.0
    expiry_skew_seconds: Annotated[float, Meta(ge=0, le=3600)] = 60.0
    cache_seconds: Annotated[float, Meta(gt=0, le=3600)] = 300.0
    env: dict[str, Annotated[str, Meta(max_length=4096)]] = msgspec.field(default_factory=dict)


class Quota(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Shared by every status request, submit, fetch and cancel of the provider (GCRA)."""

    requests_per_second: Annotated[float, Meta(gt=0, le=100_000)] = 10.0
    burst: Annotated[int, Meta(ge=1, le=100_000)] = 1
    max_in_flight: Annotated[int, Meta(ge=1, le=10_000)] = 8


StatusPathPrefix = Annotated[str, Meta(pattern=r"^/[\x21-\x7e]*$", max_length=512)]


class SubmitCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How to submit a job (S22, S29); how the answer names the job is the provider's contract."""

    url: str
    method: Literal["POST", "PUT"] = "POST"
    content_type: str = "application/json"
    timeout_seconds: Annotated[float, Meta(gt=0, le=600)] = 30.0
    idempotency_header: str = ""  # sent only when contract.idempotent_submit
    job_id_from: Literal["location", "operation-location", "body"] = "location"
    job_id_pointer: str | None = None
    status_from: Literal["template", "location", "operation-location"] = "template"
    max_attempts: Annotated[int, Meta(ge=1, le=10)] = 3
    max_body_bytes: Annotated[int, Meta(ge=1, le=256 * 1024)] = 64 * 1024
    #: Where a status resource named by a header may be (S22); default: the status URL's path
    #: up to ``{job_id}``. Always on the status URL's origin.
    status_path_prefix: StatusPathPrefix | None = None


class FetchCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Downloading a succeeded job's result: bounded in size and time."""

    max_bytes: Annotated[int, Meta(ge=1, le=64 * 1024**3)] = 100 * 1024 * 1024
    timeout_seconds: Annotated[float, Meta(gt=0, le=3600)] = 300.0


class CancelCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The provider's documented cancel call; only a human's decision ever makes it."""

    url: str
    method: Literal["POST", "DELETE", "PUT"] = "POST"
    timeout_seconds: Annotated[float, Meta(gt=0, le=600)] = 30.0


class ProfileFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    status: StatusCall
    contract: dict[str, object]
    credential: CredentialRef | None = None
    quota: Quota = msgspec.field(default_factory=Quota)
    submit: SubmitCall | None = None
    fetch: FetchCall = msgspec.field(default_factory=FetchCall)
    cancel: CancelCall | None = None
    aws: AwsSigning | None = None


@dataclass(frozen=True)
class Profile:
    """A validated profile: the call, the credential reference, the quota and the contract."""

    name: str
    path: Path
    status: StatusCall
    credential: CredentialRef | None
    quota: Quota
    contract: Contract
    digest: str
    submit: SubmitCall | None = None
    fetch: FetchCall = field(default_factory=FetchCall)
    cancel: CancelCall | None = None
    aws: AwsSigning | None = None

    def status_body(self, job_id: str) -> bytes | None:
        """The body of a POST status read for ``job_id`` (None for GET and HEAD)."""
        if self.status.body is None:
            return None
        return readpost.status_body(self.status.body, job_id)

    @functools.cached_property
    def origin(self) -> str:
        """The provider's origin: credentials are sent to it and nowhere else. (Computed once:
        every status request asks, and a profile never changes.)"""
        return origin(self.status_url("x"))

    @property
    def submit_spec(self) -> SubmitSpec | None:
        if self.submit is None:
            return None
        return SubmitSpec(
            job_id_from=self.submit.job_id_from,
            job_id_pointer=self.submit.job_id_pointer,
            status_from=self.submit.status_from,
            idempotent=self.contract.idempotent_submit,
            max_attempts=self.submit.max_attempts,
            status_path_prefix=self.status_path_prefix,
        )

    @functools.cached_property
    def status_path_prefix(self) -> str:
        """The path under which a provider-named status resource may lie (S22)."""
        if self.submit is not None and self.submit.status_path_prefix is not None:
            return self.submit.status_path_prefix
        before = re.split(r"\{\+?job_id\}", self.status.url, maxsplit=1)[0]
        return urlsplit(before).path or "/"

    def cancel_url(self, job_id: str) -> str:
        assert self.cancel is not None
        return expand(self.cancel.url, job_id)

    def status_url(self, job_id: str) -> str:
        """The status URL for ``job_id``, percent-encoded so it cannot change the path."""
        return expand(self.status.url, job_id)


def expand(template: str, job_id: str) -> str:
    """``template`` with its job id placeholder filled in: ``{job_id}`` as one segment (or one
    query value), ``{+job_id}`` as a path (RFC 6570 reserved expansion, see
    :func:`encode_path_id`)."""
    if _PATH_PLACEHOLDER in template:
        return template.replace(_PATH_PLACEHOLDER, encode_path_id(job_id))
    return template.replace(_PLACEHOLDER, _encode_id(job_id))


def encode_path_id(job_id: str) -> str:
    """A job id that is a path (Google's ``projects/p/operations/o``): slashes kept, every
    other character outside RFC 3986's unreserved set percent-encoded, so the id can neither
    add a query or fragment nor climb out of the template's path.

    Raises:
        ValueError: The id has an empty segment or a dot segment (``.``, ``..``), which a
            client or server would normalise away, leaving the template's path prefix.
    """
    segments = job_id.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError(
                f"job id {job_id!r} has an empty or dot segment, which would leave the status "
                f"URL's path; a {_PATH_PLACEHOLDER} id is segments joined by single slashes"
            )
    return "/".join(quote(segment, safe="") for segment in segments)


def _encode_id(job_id: str) -> str:
    """A job id as one path segment: ``/``, ``?``, ``#`` and ``%`` cannot change the URL."""
    encoded = quote(job_id, safe="")
    if encoded in (".", ".."):
        encoded = encoded.replace(".", "%2E")  # a bare dot segment would be normalised away
    return encoded


_CONTRACT_FIELDS = frozenset(Contract.__struct_fields__)


def load_profile(path: Path) -> Profile:
    """Load and validate one profile; every problem is a :class:`ConfigError` with key and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"profile {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read profile {path}: {exc}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r" \(at line (\d+), column \d+\)", str(exc))
        where = f"{path}:{m.group(1)}" if m else str(path)
        what = str(exc)[: m.start()] if m else str(exc)
        raise ConfigError(f"{where}: not valid TOML: {what}") from None
    name = path.stem
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise ConfigError(
            f"{path}: the file name is the provider's name and must be letters, digits, "
            f"'_', '.', '-' (at most 64)"
        )
    readpost.check_status_table(
        path, table.get("status"), {k: _line_of(text, ("status",), k) for k in _STATUS_KEYS}
    )
    try:
        raw = msgspec.convert(table, ProfileFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(path, text, str(exc))) from None
    unknown = sorted(set(raw.contract) - _CONTRACT_FIELDS - {"provider"})
    if unknown:
        line = _line_of(text, ("contract",), unknown[0])
        known = tuple(sorted(_CONTRACT_FIELDS - {"provider"}))
        raise ConfigError(
            f"{path}:{line}: contract.{unknown[0]}: unknown key{nearest(unknown[0], known)}"
        )
    if raw.contract.get("provider", name) != name:
        raise ConfigError(
            f"{_at(path, text, 'contract', 'provider')}: contract.provider is "
            f"{raw.contract['provider']!r} but the file is named "
            f"for provider {name!r}; drop the key or rename the file"
        )
    _unknown_nested_keys(path, text, raw.contract)
    contract_table = dict(raw.contract)
    if "state_rules" in contract_table:
        contract_table["state_rules"] = _rules_from_toml(path, text, contract_table["state_rules"])
    try:
        contract = msgspec.convert({**contract_table, "provider": name}, Contract)
    except msgspec.ValidationError as exc:
        message = str(exc).replace("$.", "$.contract.", 1)
        if re.match(r"rule \d+ |documented state ", message):
            # The rules' own analysis (replay.rules.rule_problems), raised by the contract.
            line = _rules_problem_line(text, message)
            key = "documented_states" if message.startswith("documented") else "state_rules"
            raise ConfigError(f"{path}:{line}: contract.{key}: {message}") from None
        raise ConfigError(_explain(path, text, message)) from None
    _check_url(path, text, raw.status.url, "status", job_id_in_body=raw.status.body is not None)
    if raw.credential is not None:
        _check_credential(path, text, raw.credential)
    if raw.aws is not None and (missing := botocore_missing()) is not None:
        raise ConfigError(f"{path}:{_line_of(text, (), 'aws')}: [aws]: {missing}")
    if raw.cancel is not None:
        _check_url(path, text, raw.cancel.url, "cancel")
    if contract.cancel_documented != (raw.cancel is not None):
        where = (
            _at(path, text, "contract", "cancel_documented")
            if "cancel_documented" in raw.contract
            else _at(path, text, "cancel")
        )
        raise ConfigError(
            f"{where}: contract.cancel_documented is {str(contract.cancel_documented).lower()} "
            f"but the profile {'has no' if raw.cancel is None else 'has a'} [cancel] section; "
            f"a cancel is offered only where the provider documents one, so make them agree"
        )
    if raw.submit is not None:
        _check_submit(path, text, raw.submit, contract)
    return Profile(
        name,
        path,
        raw.status,
        raw.credential,
        raw.quota,
        contract,
        contract_digest(contract),
        raw.submit,
        raw.fetch,
        raw.cancel,
        raw.aws,
    )


_STATUS_KEYS = ("method", "body", "read_only_post", "url")
_CATEGORIES = ("pending", "success", "failure", "canceled", "expired")
_RULE_KEYS = ("state", "category", "when", "some", "fallback")
_CONDITION_KEYS = ("equals", "present", "absent", "null", "min", "max")
_SOME_KEYS = ("pointer", "when")


def pointer_problem(pointer: str) -> str | None:
    """Why ``pointer`` is not an RFC 6901 JSON pointer, in words (None when it is one)."""
    if pointer and not pointer.startswith("/"):
        return (
            f'{pointer!r} is not a JSON pointer: it must start with "/" '
            f'(write "/{pointer}"; "" is the whole body)'
        )
    if re.search(r"~(?![01])", pointer):
        return (
            f'{pointer!r} is not a JSON pointer: "~" is written "~0" and a "/" inside a name '
            f'"~1" (RFC 6901)'
        )
    if len(pointer) > 512:
        return "a JSON pointer is at most 512 characters"
    return None


def _rules_problem_line(text: str, message: str) -> int:
    """The line of what :func:`replay.rules.rule_problems` names first: the rule (``rule N
    (...)``), or the documented state's pointer."""
    if rule := re.match(r"rule (\d+) ", message):
        return line_of(_key_lines(text), ("contract", "state_rules", int(rule.group(1)) - 1))
    if state := re.match(r"documented state .+? at (\S*) is classified by no rule", message):
        return line_of(_key_lines(text), ("contract", "documented_states", state.group(1)))
    return _line_of(text, ("contract",), "state_rules")


def _unknown_nested_keys(path: Path, text: str, contract: dict[str, object]) -> None:
    """``[contract.states]`` and each result are checked for keys they do not have: a
    misspelt ``canceld = [...]`` would otherwise be dropped, its states read as unknown."""
    tables: list[tuple[KeyPath, object, tuple[str, ...]]] = [
        (("contract", "states"), contract.get("states"), StateTable.__struct_fields__)
    ]
    results = contract.get("results")
    if isinstance(results, list):
        tables += [
            (("contract", "results", n), result, ResultField.__struct_fields__)
            for n, result in enumerate(results)
        ]
    for where, table, known in tables:
        if not isinstance(table, dict):
            continue
        for key in table:
            if key not in known:
                keys = (*where, key)
                line = line_of(_key_lines(text), keys)
                raise ConfigError(
                    f"{path}:{line}: {dotted(keys)}: unknown key{nearest(key, known)}"
                )


def _rules_from_toml(path: Path, text: str, raw: object) -> list[dict[str, object]]:
    """``[[contract.state_rules]]`` as written (``when`` a table of pointer -> condition, ``some``
    a table or a list of tables) to :class:`replay.rules.StateRule` 's stored form."""
    lines = _key_lines(text)

    def fail(index: int, key: str, why: str, at: KeyPath = ()) -> ConfigError:
        line = line_of(lines, ("contract", "state_rules", index, *at))
        return ConfigError(f"{path}:{line}: contract.state_rules[{index + 1}]{key}: {why}")

    if not isinstance(raw, list):
        raise ConfigError(
            f"{_at(path, text, 'contract', 'state_rules')}: contract.state_rules must be an "
            f"array of tables ([[contract.state_rules]])"
        )
    rules: list[dict[str, object]] = []
    for index, rule in enumerate(raw):
        if not isinstance(rule, dict):
            raise fail(index, "", "a rule is a table")
        for key in rule:
            if key not in _RULE_KEYS:
                raise fail(index, f".{key}", f"unknown key{nearest(key, _RULE_KEYS)}", (key,))
        category = rule.get("category")
        if not isinstance(category, str) or category not in _CATEGORIES:
            raise fail(
                index,
                ".category",
                f"{category!r} is not a category{nearest(str(category), _CATEGORIES)}",
                ("category",),
            )
        conditions = _conditions(
            rule.get("when", {}), ".when", ("when",), functools.partial(fail, index)
        )
        somes = rule.get("some", [])
        for n, some in enumerate(somes if isinstance(somes, list) else [somes]):
            where = f".some[{n + 1}]" if isinstance(somes, list) else ".some"
            at: KeyPath = ("some", n) if isinstance(somes, list) else ("some",)
            if not isinstance(some, dict):
                raise fail(index, where, "a table with pointer and when", at)
            for key in some:
                if key not in _SOME_KEYS:
                    raise fail(
                        index,
                        f"{where}.{key}",
                        f"unknown key{nearest(key, _SOME_KEYS)}",
                        (*at, key),
                    )
            if not isinstance(some.get("pointer"), str) or not some.get("when"):
                raise fail(index, where, "needs pointer (an array's) and when (on one element)", at)
            if problem := pointer_problem(some["pointer"]):
                raise fail(index, f"{where}.pointer", problem, (*at, "pointer"))
            inner = _conditions(
                some["when"], f"{where}.when", (*at, "when"), functools.partial(fail, index)
            )
            conditions.append({"pointer": some["pointer"], "test": "some", "where": inner})
        if not conditions:
            raise fail(
                index, "", "a rule needs when or some (a rule with no condition matches any body)"
            )
        out: dict[str, object] = {
            "state": rule.get("state"),
            "category": category,
            "when": conditions,
        }
        if "fallback" in rule:
            out["fallback"] = rule["fallback"]
        rules.append(out)
    return rules


def _conditions(
    table: object, prefix: str, at: KeyPath, fail_at: Callable[[str, str, KeyPath], ConfigError]
) -> list[dict[str, object]]:
    """``{pointer = condition}``: a value or a list of values (equals one of them), or a table
    ``{ equals = [...] }``, ``{ present = true }``, ``{ absent = true }``, ``{ null = true }``,
    ``{ min = A, max = B }`` (a number in that range)."""

    def fail(key: str, why: str, *inner: str) -> ConfigError:
        return fail_at(f"{prefix}.{key}" if key else prefix, why, (*at, *inner))

    if not isinstance(table, dict):
        raise fail("", "a table of JSON pointer = condition")
    out: list[dict[str, object]] = []
    for pointer, spec in table.items():
        key = f'"{pointer}"'
        if problem := pointer_problem(pointer):
            raise fail(key, problem, pointer)
        if isinstance(spec, list):
            out.append({"pointer": pointer, "test": "equals", "values": spec})
        elif not isinstance(spec, dict):
            out.append({"pointer": pointer, "test": "equals", "values": [spec]})
        else:
            for word in spec:
                if word not in _CONDITION_KEYS:
                    raise fail(
                        f"{key}.{word}",
                        f"unknown condition{nearest(word, _CONDITION_KEYS)}",
                        pointer,
                        word,
                    )
            tests = [w for w in ("equals", "present", "absent", "null") if w in spec]
            ranged = "min" in spec or "max" in spec
            if len(tests) + ranged != 1:
                raise fail(
                    key,
                    "one condition per pointer: equals, present, absent, null, or min/max",
                    pointer,
                )
            if ranged:
                out.append(
                    {
                        "pointer": pointer,
                        "test": "range",
                        "minimum": spec.get("min"),
                        "maximum": spec.get("max"),
                    }
                )
            elif tests[0] == "equals":
                values = spec["equals"]
                out.append(
                    {
                        "pointer": pointer,
                        "test": "equals",
                        "values": values if isinstance(values, list) else [values],
                    }
                )
            elif spec[tests[0]] is not True:
                raise fail(
                    f"{key}.{tests[0]}",
                    f"write {tests[0]} = true (for the opposite of present use absent or null)",
                    pointer,
                    tests[0],
                )
            else:
                out.append({"pointer": pointer, "test": tests[0]})
    return out


def _check_submit(path: Path, text: str, submit: SubmitCall, contract: Contract) -> None:
    line = _line_of(text, ("submit",), "url")
    if problem := _url_problem(submit.url):
        raise ConfigError(f"{path}:{line}: submit.url: {problem}")
    if submit.job_id_from == "body" and not submit.job_id_pointer:
        raise ConfigError(
            f'{_at(path, text, "submit", "job_id_from")}: submit.job_id_from is "body" but '
            f"submit.job_id_pointer is not set"
        )
    if contract.idempotent_submit and not submit.idempotency_header:
        raise ConfigError(
            f"{_at(path, text, 'contract', 'idempotent_submit')}: contract.idempotent_submit "
            f"is true but submit.idempotency_header is not set"
        )


def _check_credential(path: Path, text: str, ref: CredentialRef) -> None:
    """Exactly one source of the token; a command is an absolute program path, no NUL bytes."""

    def where(key: str) -> str:
        line = _line_of(text, ("credential",), key) or _line_of(text, (), "credential")
        return f"{path}:{line}" if line else str(path)

    if (ref.file is None) == (ref.command is None):
        key = "file" if ref.file is not None else "credential"
        raise ConfigError(
            f"{where(key)}: credential: give exactly one of file (a token file) or command "
            f"(a program printing a token and its expiry as JSON), "
            f"({'both are' if ref.file is not None else 'neither is'} set)"
        )
    if ref.command is None:
        return
    if not ref.command or not ref.command[0].startswith("/"):
        raise ConfigError(
            f"{where('command')}: credential.command: the program must be an absolute path "
            f'(command = ["/usr/local/bin/get-token", "arg", ...]); bide runs it without a '
            f"shell and without searching PATH"
        )
    if any("\0" in arg for arg in ref.command):
        raise ConfigError(f"{where('command')}: credential.command: an argument holds a NUL byte")
    for name, value in ref.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) or "\0" in value:
            raise ConfigError(
                f"{where('env')}: credential.env: {name!r} is not an environment variable name "
                f"(letters, digits, '_', not starting with a digit) or its value holds a NUL byte"
            )


def _check_url(path: Path, text: str, url: str, table: str, job_id_in_body: bool = False) -> None:
    line = _line_of(text, (table,), "url")
    simple, reserved = url.count(_PLACEHOLDER), url.count(_PATH_PLACEHOLDER)
    if simple + reserved != (0 if job_id_in_body else 1):
        raise ConfigError(
            f"{path}:{line}: {table}.url: must contain {_PLACEHOLDER} (one path segment or "
            f"query value) or {_PATH_PLACEHOLDER} (a path) exactly once, got {_shown_url(url)}"
        )
    filled = url.replace(_PLACEHOLDER, "x").replace(_PATH_PLACEHOLDER, "x")
    if problem := _url_problem(filled, shown=url):
        raise ConfigError(f"{path}:{line}: {table}.url: {problem}")
    if "job_id}" in url.split("//", 1)[1].split("/", 1)[0].split("?", 1)[0]:
        raise ConfigError(
            f"{path}:{line}: {table}.url: {_PLACEHOLDER} may not be in the host, got "
            f"{_shown_url(url)}"
        )
    if reserved and _PATH_PLACEHOLDER not in urlsplit(url).path:
        raise ConfigError(
            f"{path}:{line}: {table}.url: {_PATH_PLACEHOLDER} is a path and belongs in the "
            f"URL's path; use {_PLACEHOLDER} in a query"
        )


def _url_problem(url: str, shown: str | None = None) -> str | None:
    """Why ``url`` is not an absolute http(s) URL, in words (None when it is one); the
    message shows ``shown`` (the URL as written, placeholders and all) instead."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("https", "http") or not host:
        written = url if shown is None else shown
        return f"must be an http:// or https:// URL with a host, got {_shown_url(written)}"
    return None


def _shown_url(url: str) -> str:
    """``url`` for a message: without userinfo or query (either may hold a secret)."""
    shown = url.split("?", 1)[0].split("#", 1)[0]
    if "@" in shown.split("//", 1)[-1].split("/", 1)[0]:
        scheme, _, rest = shown.rpartition("//")
        shown = (scheme + "//" if scheme or shown.startswith("//") else "") + rest.split("@", 1)[1]
    return repr(shown + ("?..." if "?" in url else ""))


_PATH_RE = re.compile(r"(?: - )?at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`")
_STEP_RE = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]")
#: The patterns a profile's strings are checked against, in words.
_PATTERN_WORDS = {
    r"^(/([^~/]|~[01])*)*$": 'a JSON pointer: "" (the whole body) or "/"-separated names, '
    'with "~" written "~0" and a "/" inside a name "~1" (RFC 6901)',
    r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$": "a name: a letter or '_', then letters, digits, "
    "'_', '.', '-' (at most 64)",
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$": "a file name in the credentials directory: "
    "a letter or digit, then letters, digits, '_', '.', '-' (no slashes)",
    r"^[A-Za-z0-9-]{1,64}$": "an HTTP header name: letters, digits and '-'",
    r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$": "an HTTP header name: letters, digits and "
    "!#$%&'*+.^_`|~- (no spaces or ':')",
    r"^/[\x21-\x7e]*$": 'a URL path: starts with "/", no spaces or non-ASCII characters',
    r"^[a-z]{2}(-[a-z]+)+-\d+$": 'an AWS region, e.g. "us-east-1"',
    r"^[a-z0-9-]{1,64}$": "an AWS signing name: lowercase letters, digits and '-' "
    '(e.g. "states")',
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$": "a name: a letter or digit, then letters, digits, "
    "'_', '.', '-' (at most 64)",
}


def _explain(path: Path, text: str, message: str) -> str:
    """Turn msgspec's ``... - at `$.a[0].b` `` into ``FILE:LINE: a[1].b: ...``, the line
    being the key's own, with the nearest valid word for an unknown key or value."""
    if dict_key := _DICT_KEY_RE.search(message):
        return _explain_dict_key(path, text, message[: dict_key.start()], dict_key.group(1))
    m = _PATH_RE.search(message)
    if not m and not message.startswith("Object "):
        return _explain_unplaced(path, text, message)
    # msgspec names no place for the profile's top level.
    keys: KeyPath = tuple(
        name if name else int(index) for name, index in _STEP_RE.findall(m.group(1) if m else "")
    )
    detail = message[: m.start()] if m else message
    if found := re.match(r"Object contains unknown field `([^`]+)`", detail):
        keys = (*keys, found.group(1))
        detail = f"unknown key{nearest(found.group(1), _fields_at(keys[:-1]))}"
    elif found := re.match(r"Object missing required field `([^`]+)`", detail):
        keys = (*keys, found.group(1))
        detail = "missing (this key is required)"
    elif found := re.match(r"Invalid enum value (.+)", detail):
        choices = _literal_at(keys)
        value = found.group(1)
        close = nearest(value.strip("'"), choices) if choices else ""
        detail = f"{value} is not valid{close}"
    elif found := re.match(r"Expected `str` matching regex (['\"])(.+)\1$", detail):
        value = _value_at(text, keys)
        pattern = found.group(2).replace("\\\\", "\\")
        if pattern == _POINTER_PATTERN and isinstance(value, str) and pointer_problem(value):
            detail = str(pointer_problem(value))
        elif words := _PATTERN_WORDS.get(pattern):
            detail = f"must be {words}, got {value!r}"
    elif words := type_in_words(detail, repr(_value_at(text, keys))):
        detail = words
    named = dotted(keys)
    where = keys
    if keys[:2] == ("contract", "state_rules") and "when" in keys:
        # The rules were rewritten before msgspec saw them: their "when" is a list there.
        where = keys[: keys.index("when") + 1]
    line = line_of(_key_lines(text), where)
    return f"{path}:{line}: {named}: {detail}" if line else f"{path}: {named}: {detail}"


_POINTER_PATTERN = r"^(/([^~/]|~[01])*)*$"


def _value_at(text: str, keys: KeyPath) -> object:
    """The value written at ``keys`` (None where there is none)."""
    value: object = tomllib.loads(text)
    for key in keys:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        else:
            return None
    return value


_DICT_KEY_RE = re.compile(r" - at `key` in `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`$")


def _explain_dict_key(path: Path, text: str, detail: str, where: str) -> str:
    """A table's key that fails its pattern (``documented_states = { "status" = [...] }``):
    the first such key, on its own line, in words."""
    keys: KeyPath = tuple(name if name else int(index) for name, index in _STEP_RE.findall(where))
    table = _value_at(text, keys)
    found = re.match(r"Expected `str` matching regex (['\"])(.+)\1$", detail)
    pattern = found.group(2).replace("\\\\", "\\") if found else ""
    if isinstance(table, dict) and pattern == _POINTER_PATTERN:
        for key in table:
            if problem := pointer_problem(str(key)):
                line = line_of(_key_lines(text), (*keys, str(key)))
                return f"{path}:{line}: {dotted(keys)}: {problem}"
    line = line_of(_key_lines(text), keys)
    return f"{path}:{line}: {dotted(keys)}: a key {detail[0].lower()}{detail[1:]}"


def _explain_unplaced(path: Path, text: str, message: str) -> str:
    """A contract's own check names no place: put it on the line of the first contract key
    it names that the file writes (``backoff_cap_seconds must be at least ...``)."""
    lines = _key_lines(text)
    named = sorted(
        (message.find(key), key)
        for key in _CONTRACT_FIELDS
        if re.search(rf"\b{key}\b", message) and ("contract", key) in lines
    )
    if not named:
        line = lines.get(("contract",), 0)
        return f"{path}:{line}: contract: {message}" if line else f"{path}: {message}"
    key = named[0][1]
    return f"{path}:{lines[('contract', key)]}: contract.{key}: {message}"


def _type_at(keys: KeyPath) -> object:
    """The declared type of the value at ``keys`` in a profile (None when not declared)."""
    return type_at(ProfileFile, keys, {"contract": Contract})


def _fields_at(keys: KeyPath) -> tuple[str, ...]:
    return tuple(f for f in fields_at(ProfileFile, keys, {"contract": Contract}) if f != "provider")


def _literal_at(keys: KeyPath) -> tuple[str, ...]:
    tp = _type_at(keys)
    return tuple(str(a) for a in get_args(tp)) if get_origin(tp) is Literal else ()


_key_lines = functools.lru_cache(maxsize=4)(key_lines)


def _at(path: Path, text: str, *keys: str) -> str:
    """``FILE:LINE`` of ``keys`` (or of the nearest enclosing key written), else ``FILE``."""
    line = line_of(_key_lines(text), keys)
    return f"{path}:{line}" if line else str(path)


def _line_of(text: str, table: tuple[str, ...], key: str) -> int:
    """The line of ``key`` inside ``[table]``, else of the nearest enclosing key (0: none)."""
    return line_of(_key_lines(text), (*table, key))


def load_profiles(directory: Path) -> tuple[dict[str, Profile], dict[Path, str]]:
    """Every ``*.toml`` in ``directory``: the valid profiles, and an error per invalid file."""
    good: dict[str, Profile] = {}
    bad: dict[Path, str] = {}
    if not directory.is_dir():
        raise ConfigError(
            f"profiles directory {directory} does not exist; create it and put "
            f"one TOML profile per provider in it (see `bide check-profile -h`)"
        )
    for path in sorted(directory.glob("*.toml")):
        try:
            good[path.stem] = load_profile(path)
        except ConfigError as exc:
            bad[path] = str(exc)
    return good, bad


def too_long_for_lease(profiles: dict[str, Profile], longest: float) -> dict[str, str]:
    """With the log in PostgreSQL, a request is sent only while the node's lease has its
    timeout plus ``request_margin_seconds`` left; a profile whose status, submit or cancel
    timeout exceeds ``longest`` (:attr:`daemon.lease.Lease.longest_request`) would stall or
    never send. Returns the message for each such profile, by name."""
    out: dict[str, str] = {}
    for name, p in profiles.items():
        calls = [("status", p.status.timeout_seconds)]
        calls += [
            (section, call.timeout_seconds)
            for section, call in (("submit", p.submit), ("cancel", p.cancel))
            if call is not None
        ]
        too_long = [f"[{section}] timeout_seconds = {t:g}" for section, t in calls if t > longest]
        if too_long:
            out[name] = (
                f"{', '.join(too_long)} does not fit in the log's lease: a request "
                f"is sent only while the lease has its timeout plus "
                f"request_margin_seconds left, and just before a renewal "
                f"lease_seconds - renew_seconds is left, so at most {longest:g} s; "
                f"lower timeout_seconds to {max(longest, 0):g} or less, or raise "
                f"[postgres] lease_seconds (a [fetch] download is cut to that instead)"
            )
    return out
