"""Simulator scripts: jobs as sequences of steps, one step consumed per status call.

A script is TOML (or the same structure built in code). Each job answers its status calls
with its steps in order, one step per call; a step with ``times = N`` answers N calls; the
last step repeats forever. Scenarios are job templates that ``POST /jobs`` instantiates.

Full example::

    [server]                     # every key is optional
    state_field = "status"       # JSON key that carries the job state
    request_id_header = "X-Request-Id"   # on every response ("" to omit)
    submit = "location"          # location | absolute-location | operation-location | body
    idempotency = true           # honour Idempotency-Key on POST /jobs
    id_prefix = "job-"           # ids of submitted jobs: job-1, job-2, ...
    default_scenario = "quick"   # POST /jobs with no body (or no "scenario"/"steps")
    result_size = 1024           # bytes served by GET /results/{id}
    oversize_bytes = 2097152     # body size of `fault = "oversize"` steps without `size`
    cancel = true                # POST /jobs/{id}/cancel exists
    submit_steps = [{ delay = 5 }, { fault = "reset" }, { status = 500 }]  # 1st, 2nd, 3rd submit
    headers = { RateLimit-Policy = "10;w=60" }   # on every response
    job_query = "run_id"          # GET /jobs?run_id=ID reads job ID (default: none)
    path_ids = false             # true: GET /jobs/a/b/c reads job "a/b/c"

    [jobs.export-1]              # GET /jobs/export-1
    steps = "queued x2, running x3, succeeded with result"

    [jobs.throttled]
    steps = [
      { status = 404, times = 2 },                    # eventual consistency after submit
      { status = 503, retry_after = 120 },            # Retry-After: 120
      { status = 503, retry_after_date = 30 },        # Retry-After: <HTTP-date now+30 s>
      { status = 429 },                               # no Retry-After
      { state = "running", poll_after_seconds = -5, next_check_in = 3600 },
      { state = "running", expires_in = -60 },        # expires_at already past
      { fault = "reset" },                            # RST, no response
      { delay = 5.0, state = "running" },             # slow: sleeps 5 s, then answers
      { fault = "oversize", size = 5000000, chunked = true },
      { fault = "malformed" },                        # truncated JSON
      { state = "running", headers = { RateLimit = "limit=10, remaining=0, reset=30" } },
      { status = 302, redirect = "http://localhost:{port}/jobs/{id}" },  # another origin
      "manual_review",                                # a state never seen before
    ]

    [scenarios.quick]            # POST /jobs {"scenario": "quick"} -> 202, Location: /jobs/job-1
    steps = ["running", "succeeded with result"]

    [scenarios.no-result]
    steps = "queued, succeeded"   # success without result_url
    result_size = 10

Compact steps. ``steps`` is a list whose items are tables or strings, or one string of
comma-separated items. A string item is ``WORD [xN] [with result]``: a WORD of three digits
is an HTTP status (``"404 x3"``), anything else a state (``"queued x2"``,
``"succeeded with result"``).

Step keys (all optional):

- ``times`` (>= 1): how many status calls this step answers.
- ``state``: the job state in the JSON body (a 200 step without it omits the field).
- ``status``: HTTP status (default 200, or 302 with ``redirect``).
- ``result = true``: adds ``result_url`` pointing at ``/results/{id}``; ``result_url``
  sends a literal one instead. ``error`` adds ``error``.
- ``expires_in``: ``expires_at`` = job creation + N seconds (negative: already past);
  ``expires_at`` sends a literal string (for unparseable values).
- ``next_check_in``: ``next_check_at`` = request time + N seconds; ``next_check_at``
  sends a literal string. ``poll_after_seconds`` is sent as given (number or string).
- ``retry_after``: ``Retry-After`` sent as given (``120`` or a string such as ``"soon"``);
  ``retry_after_date``: ``Retry-After`` as an HTTP-date, request time + N seconds,
  rounded up to the whole second so it never comes earlier than asked.
- ``delay``: seconds to sleep before answering (past the client's read timeout).
- ``fault``: ``"reset"`` (RST, no response), ``"close"`` (clean close, no response),
  ``"malformed"`` (truncated JSON), ``"oversize"`` (a JSON body of ``size`` bytes, streamed).
- ``chunked = true``: send the body chunked, without Content-Length.
- ``redirect``: ``Location`` of a 3xx; ``{port}``, ``{id}`` (percent-encoded) and ``{base}``
  are substituted (``localhost`` is a different origin from ``127.0.0.1``).
- ``body``: a literal body, sent instead of the JSON.
- ``headers``: extra response headers. ``fields``: extra JSON fields, merged last (they may
  override ``id`` or the state, e.g. ``fields = { status = 7 }``).

Non-2xx steps without ``state`` answer ``{"error": "<reason>"}``. A canceled job answers
``{"id": ..., "status": "canceled"}`` from then on. Job keys: ``steps`` (required) and
``result_size``.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import msgspec

from daemon.errors import UsageError
from daemon.simulator.awsjson import AwsJson

__all__ = [
    "FORMAT_HELP",
    "Job",
    "NewJob",
    "Script",
    "ScriptError",
    "ServerConfig",
    "Step",
    "load_script",
    "parse_script",
    "parse_steps",
    "script_from_dict",
]

#: The format reference and example above, shown by ``bide simulate --help``.
FORMAT_HELP: Final[str] = __doc__ or ""

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 §5.6.2 field-name
_COMPACT = re.compile(r"^(?P<word>[^\s,]+)(?:\s+x(?P<times>[0-9]+))?(?P<result>\s+with\s+result)?$")

_T = TypeVar("_T")

Fault = Literal["reset", "close", "malformed", "oversize"]


class ScriptError(UsageError):
    """A script that does not validate; the message names the source, the key and the fix."""


def _check_headers(headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if not _TOKEN.match(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP field name")
        _check_value(f"header {name!r}", value)


def _check_value(what: str, value: str) -> None:
    if not value.isascii() or any(c in value for c in "\r\n\0"):
        raise ValueError(f"{what} must be ASCII without CR, LF or NUL (percent-encode the rest)")


def _check_seconds(name: str, value: float | None, *, negative_ok: bool) -> None:
    if value is None:
        return
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number of seconds")
    if not negative_ok and value < 0:
        raise ValueError(f"`{name}` must be >= 0 seconds")


class Step(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One scripted answer to a status call (see the module docstring for each key)."""

    times: int = 1
    state: str | None = None
    status: int | None = None
    result: bool = False
    result_url: str | None = None
    error: str | None = None
    expires_in: float | None = None
    expires_at: str | None = None
    next_check_in: float | None = None
    next_check_at: str | None = None
    poll_after_seconds: int | float | str | None = None
    retry_after: int | str | None = None
    retry_after_date: float | None = None
    delay: float = 0.0
    fault: Fault | None = None
    size: int | None = None
    chunked: bool = False
    redirect: str | None = None
    body: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    fields: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.times < 1:
            raise ValueError("`times` must be >= 1")
        if self.status is not None and not 200 <= self.status <= 599:
            raise ValueError("`status` must be an HTTP status from 200 to 599")
        _check_seconds("delay", self.delay, negative_ok=False)
        for name in ("expires_in", "next_check_in", "retry_after_date"):
            _check_seconds(name, getattr(self, name), negative_ok=True)
        if self.size is not None and self.size < 0:
            raise ValueError("`size` must be >= 0 bytes")
        if self.size is not None and self.fault != "oversize":
            raise ValueError('`size` only applies to `fault = "oversize"`')
        if self.redirect is not None and not 300 <= self.http_status <= 399:
            raise ValueError("`redirect` needs a 3xx `status` (or none: 302)")
        if self.body is not None and self.fault in ("malformed", "oversize"):
            raise ValueError(f'`body` and `fault = "{self.fault}"` both set the body; keep one')
        if isinstance(self.retry_after, str):
            _check_value("`retry_after`", self.retry_after)
        if self.redirect is not None:
            _check_value("`redirect`", self.redirect)
        if self.retry_after is not None and self.retry_after_date is not None:
            raise ValueError("set `retry_after` or `retry_after_date`, not both")
        _check_headers(self.headers)

    @property
    def http_status(self) -> int:
        """The status this step answers with."""
        if self.status is not None:
            return self.status
        return 302 if self.redirect is not None else 200

    def label(self) -> str:
        """A short human name: the state, the fault, or the status."""
        if self.fault is not None:
            return self.fault
        if self.state is not None:
            return self.state
        return str(self.http_status)


def _parse_compact(item: str) -> Step:
    match = _COMPACT.match(item.strip())
    if match is None:
        raise ValueError(
            f"step {item!r} is not `WORD [xN] [with result]` "
            '(e.g. "queued x2", "404 x3", "succeeded with result")'
        )
    word = match["word"]
    times = int(match["times"]) if match["times"] else 1
    result = match["result"] is not None
    if len(word) == 3 and word.isdigit():
        return Step(status=int(word), times=times, result=result)
    return Step(state=word, times=times, result=result)


def parse_steps(steps: list[Step | str] | str) -> tuple[Step, ...]:
    """Resolve compact string steps into :class:`Step` values.

    Raises:
        ValueError: a compact step does not parse, or the list is empty.
    """
    items: list[Step | str] = (
        [part for part in steps.split(",")] if isinstance(steps, str) else list(steps)
    )
    resolved: list[Step] = []
    for index, item in enumerate(items):
        try:
            resolved.append(item if isinstance(item, Step) else _parse_compact(item))
        except ValueError as exc:
            raise ValueError(f"steps[{index}]: {exc}") from None
    if not resolved:
        raise ValueError("`steps` needs at least one step")
    return tuple(resolved)


class Job(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A job (or scenario template): its steps and the size of its result file."""

    steps: list[Step | str] | str
    result_size: int | None = None

    def __post_init__(self) -> None:
        parse_steps(self.steps)
        if self.result_size is not None and self.result_size < 0:
            raise ValueError("`result_size` must be >= 0 bytes")

    def resolved_steps(self) -> tuple[Step, ...]:
        """The steps, compact strings resolved."""
        return parse_steps(self.steps)


class NewJob(Job, forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /_sim/jobs``: a job, with an optional id."""

    id: str | None = None


class SubmitStep(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """How one ``POST /jobs`` call misbehaves (``[server] submit_steps``, one per call).

    ``delay`` and ``fault`` still create the job (the provider did the work; the answer is
    lost or late: the ambiguity S29 is about); ``status`` answers with that status and
    creates nothing.
    """

    delay: float = 0.0
    fault: Literal["reset", "close"] | None = None
    status: int | None = None


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Provider-wide behaviour (see the ``[server]`` table in the module docstring)."""

    state_field: str = "status"
    request_id_header: str = "X-Request-Id"
    submit: Literal["location", "absolute-location", "operation-location", "body"] = "location"
    idempotency: bool = True
    id_prefix: str = "job-"
    default_scenario: str | None = None
    result_size: int = 1024
    oversize_bytes: int = 2 * 1024 * 1024
    cancel: bool = True
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    submit_steps: tuple[SubmitStep, ...] = ()
    #: ``POST /`` as AWS's JSON protocol (daemon/simulator/awsjson.py), if set.
    aws_json: AwsJson | None = None
    #: ``GET /jobs?NAME=ID`` reads job ID (Databricks' ``runs/get?run_id=``), if set.
    job_query: str | None = None
    #: Job ids may span path segments: ``GET /jobs/projects/p/operations/o`` reads job
    #: ``projects/p/operations/o`` (Google's resource names, ``{+job_id}`` templates).
    path_ids: bool = False

    def __post_init__(self) -> None:
        if self.request_id_header:
            _check_headers({self.request_id_header: ""})
        _check_headers(self.headers)
        if self.result_size < 0 or self.oversize_bytes < 0:
            raise ValueError("`result_size` and `oversize_bytes` must be >= 0 bytes")
        if not self.state_field:
            raise ValueError("`state_field` must not be empty")


class Script(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A whole script: server behaviour, jobs by id, and scenarios for ``POST /jobs``."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    jobs: dict[str, Job] = msgspec.field(default_factory=dict)
    scenarios: dict[str, Job] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if "" in self.jobs:
            raise ValueError("a job id must not be empty")
        default = self.server.default_scenario
        if default is not None and default not in self.scenarios:
            raise ValueError(
                f"`server.default_scenario` names {default!r}, which is not under [scenarios]"
            )


_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "step": Step.__struct_fields__,
    "job": Job.__struct_fields__,
    "server": ServerConfig.__struct_fields__,
    "script": Script.__struct_fields__,
}
_LOCATED = re.compile(r"^(?P<what>.*) - at `\$(?P<at>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")


def _explain(message: str, kind: str, where: str) -> str:
    """Rewrite a msgspec error with the full key path, and a fix for an unknown key."""
    at = where
    located = _LOCATED.match(message)
    if located is not None:
        message, at = located["what"], where + located["at"]
    if kind == "job" and re.match(r"^\.steps\[\d+\]", at[len(where) :]):
        kind = "step"
    unknown = _UNKNOWN.match(message)
    if unknown is None:
        return f"{message} at `{at or '(top level)'}`"
    key = unknown["key"]
    known = _FIELDS[kind]
    hint = difflib.get_close_matches(key, known, n=1)
    fix = f"did you mean `{hint[0]}`?" if hint else f"valid {kind} keys: {', '.join(known)}"
    return f"unknown key `{key}` at `{at or '(top level)'}`; {fix}"


def _convert(obj: object, type_: type[_T], kind: str, where: str, source: str) -> _T:
    try:
        return msgspec.convert(obj, type_)
    except msgspec.ValidationError as exc:
        raise ScriptError(
            f"{source}: {_explain(str(exc), kind, where)} (the format: `bide simulate --help`)"
        ) from None


def script_from_dict(raw: dict[str, Any], *, source: str = "<script>") -> Script:
    """Validate a script given as plain data (as decoded from TOML or JSON).

    Jobs are validated one by one so an error names the job id, which msgspec's own
    locations leave out for dictionary keys.

    Raises:
        ScriptError: the script does not validate; the message names the source, the key
            and the fix.
    """
    for key in raw:
        if key not in _FIELDS["script"]:
            raise ScriptError(
                f"{source}: {_explain(f'Object contains unknown field `{key}`', 'script', '')}"
                " (the format: `bide simulate --help`)"
            )
    server = _convert(raw.get("server", {}), ServerConfig, "server", "server", source)
    tables: dict[str, dict[str, Job]] = {"jobs": {}, "scenarios": {}}
    for table, into in tables.items():
        entries = raw.get(table, {})
        if not isinstance(entries, dict):
            raise ScriptError(f"{source}: `{table}` must be a table of jobs by id")
        for job_id, spec in entries.items():
            into[job_id] = _convert(spec, Job, "job", f"{table}.{job_id}", source)
    try:
        return Script(server=server, jobs=tables["jobs"], scenarios=tables["scenarios"])
    except ValueError as exc:
        raise ScriptError(f"{source}: {exc}") from None


def parse_script(text: str | bytes, *, source: str = "<script>") -> Script:
    """Decode and validate a TOML script.

    Args:
        text: the TOML document.
        source: what to call it in error messages (usually the file name).

    Raises:
        ScriptError: the TOML is malformed or does not validate; the message names the source,
            the key (as a dotted path) and the fix.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ScriptError(f"{source}: not UTF-8 text; save the script as UTF-8") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScriptError(f"{source}: not valid TOML: {exc}") from None
    return script_from_dict(raw, source=source)


def load_script(path: str | Path) -> Script:
    """Read and validate a script file.

    Raises:
        ScriptError: the file cannot be read or does not validate.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read the script: {exc.strerror}") from None
    return parse_script(data, source=str(path))
