"""Side-effecting actions — submit, fetch, cancel — as pure code (S22, S29, S34, S36).

Theory of operation
===================

The status endpoint is read-only; everything with a side effect is its own action with its
own record: an :class:`ActionIntended` made durable before the call, exactly one call, and
its outcome (:class:`ActionSucceeded` or :class:`ActionFailed`). An outcome that needs a
human carries a finite list of options; the human's answer is an :class:`ActionDecided`.
Like :mod:`replay.decide`, this module reads no clock and does no I/O: ``now`` and what came
back are arguments.

Rules:

* **Submit, answered** (S22). An accepted status (202, or 201/200 with the job already done)
  must name the job the way the profile says — the ``Location`` or ``Operation-Location``
  header, or a body field — and the status resource must be on the same origin as the
  provider's status endpoint (else a credential would cross origins). The URL is never guessed
  from the submit endpoint. Anything else accepted is ``submit_contradiction``. A 4xx is
  ``submit_rejected``; a 5xx may have created the job, so it is ambiguous.
* **Submit, unanswered** (S29). Never delivered (refused, DNS, TLS, connect timeout): the
  provider has nothing, and a retry is offered. Ambiguous (read timeout, reset, 5xx, the
  daemon died in between): retried automatically only when the provider is idempotent and the
  key was recorded before sending, and at most ``max_attempts`` times; otherwise it escalates
  ``submit_outcome_unknown`` with ``retry_same_idempotency_key`` (only when supported),
  ``inspect_provider_console`` and ``abandon``. Never a silent resubmit.
* **Cancel** happens only because a human chose ``cancel_at_provider`` (offered only where the
  profile documents a cancel call); never implicitly, e.g. on a deadline. Its ambiguous outcome
  escalates ``cancel_outcome_unknown``.
* **Fetch** (S1, S14, S34) happens only for an operation that succeeded with a validated result
  reference, and only for a result that is an ``http(s)`` URL (:func:`fetch_target`). It is
  one GET, never retried by itself; a download is a success only with a 2xx answer whose
  body fit under the profile's cap, and then its size and SHA-256 are recorded
  (:func:`judge_download`). Anything else is ``fetch_failed`` with its reason and no options
  (fetching again is a new request, by whoever asked), and leaves the status operation
  untouched. The credential goes only to the provider's own origin (the HTTP shell's rule).
* A decision names an offered option or is recorded as not accepted and changes nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Literal
from urllib.parse import unquote, urljoin, urlsplit

import msgspec

from replay.contract import JsonPointer
from replay.errors import ReplayOrderError
from replay.events import (
    ID_PATTERN,
    MAX_ID_LENGTH,
    ActionDecided,
    ActionEvent,
    ActionFailed,
    ActionIntended,
    ActionKind,
    ActionReason,
    ActionSucceeded,
    LogEvent,
    Option,
    OptionKind,
    ResponseHeaders,
    TransportKind,
)
from replay.observations import DecisionSubmitted
from replay.signals import check_provider_url, parse_json, resolve_pointer

__all__ = [
    "NEVER_DELIVERED",
    "Action",
    "ActionPhase",
    "SubmitSpec",
    "action_story",
    "decide_action",
    "evolve_action",
    "fetch_target",
    "fingerprint",
    "fold_actions",
    "judge_answer",
    "judge_download",
    "judge_unanswered",
    "origin",
]

ActionPhase = Literal["in_flight", "succeeded", "failed", "escalated", "closed"]

#: Transport failures where the request certainly never reached the provider.
NEVER_DELIVERED: frozenset[TransportKind] = frozenset(
    {"connect_refused", "dns", "tls", "connect_timeout", "pool_timeout", "not_sent"}
)
_DETAIL_CAP = 300


class SubmitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a provider answers a submit (from the profile's ``[submit]``).

    Attributes:
        job_id_from: Where the new job's id is: ``location``, ``operation-location`` (the
            last path segment of that header's URL) or ``body`` (``job_id_pointer``).
        status_path_prefix: A status resource named by a header must be on the status
            endpoint's origin and under this path (by default the status URL template's path
            up to ``{job_id}``): bide sends its credential nowhere else (S22).
        job_id_pointer: JSON pointer to the id in the body.
        status_from: Where the status resource is: ``template`` (the profile's status URL
            filled with the id) or the ``location`` / ``operation-location`` header.
        idempotent: The provider honours an idempotency key (S29).
        max_attempts: The most calls one submit may make, automatic retries included.
    """

    job_id_from: Literal["location", "operation-location", "body"] = "location"
    job_id_pointer: JsonPointer | None = None
    status_from: Literal["template", "location", "operation-location"] = "template"
    idempotent: bool = False
    max_attempts: int = 3
    status_path_prefix: str = "/"


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """One action's state: the fold of its events."""

    action_id: str
    kind: ActionKind
    operation_id: str
    provider: str
    intent: ActionIntended
    phase: ActionPhase
    attempts: int
    outcome: ActionSucceeded | ActionFailed | None = None
    decision: ActionDecided | None = None

    @property
    def options(self) -> tuple[Option, ...]:
        if self.phase == "escalated" and isinstance(self.outcome, ActionFailed):
            return self.outcome.options
        return ()


def fingerprint(method: str, url: str, body: bytes) -> str:
    """The request fingerprint of a submit: SHA-256 over method, URL and body."""
    h = hashlib.sha256(b"bide.submit.v1\n")
    h.update(method.upper().encode() + b"\n" + url.encode() + b"\n")
    h.update(body)
    return h.hexdigest()


def origin(url: str) -> str:
    """``scheme://host:port`` of a URL (default ports made explicit); ``""`` if it does not
    parse (a bad port or IPv6 literal), which is no one's origin."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, 0)
    except ValueError:
        return ""
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


# --- fetch ----------------------------------------------------------------------------------


def fetch_target(
    phase: str, results: Mapping[str, str], wanted: str | None
) -> tuple[str, str] | str:
    """``(result name, URL)`` a fetch may download, or the reason it may not (S1, S34).

    Only a succeeded operation has validated results; only a result that is an ``http(s)``
    URL can be downloaded; with several such results the caller must name one.
    """
    if phase != "succeeded":
        return (
            f"the operation has not succeeded (it is {phase}); only a validated result "
            f"can be fetched (S1)"
        )
    urls = {
        name: value for name, value in results.items() if value.startswith(("https://", "http://"))
    }
    name = wanted or (next(iter(urls)) if len(urls) == 1 else None)
    if name is None or name not in urls:
        return (
            f"name the result to fetch with --result (URL results: "
            f"{', '.join(sorted(urls)) or 'none'})"
        )
    return name, urls[name]


def judge_download(
    intent: ActionIntended,
    status: int,
    size: int,
    truncated: bool,
    sha256: str,
    stored_as: str,
    now: float,
) -> list[ActionEvent]:
    """A fetch that was answered: a success only for a 2xx whose whole body fit the cap."""
    if not 200 <= status < 300:
        problem = f"HTTP {status}"
    elif truncated:
        problem = f"larger than the cap of {intent.max_bytes} bytes"
    else:
        return [
            ActionSucceeded(
                operation_id=intent.operation_id,
                at=now,
                action_id=intent.action_id,
                http_status=status,
                size=size,
                sha256=sha256,
                stored_as=stored_as,
            )
        ]
    return [_failed(intent, now, "fetch_failed", http_status=status, detail=problem)]


# --- state by replay ------------------------------------------------------------------------


def evolve_action(state: Action | None, event: ActionEvent) -> Action:
    """Apply one action event. Raises :class:`ReplayOrderError` on an impossible order."""
    if isinstance(event, ActionIntended):
        if state is None:
            return Action(
                action_id=event.action_id,
                kind=event.kind,
                operation_id=event.operation_id,
                provider=event.provider,
                intent=event,
                phase="in_flight",
                attempts=event.attempt,
            )
        return msgspec.structs.replace(
            state, intent=event, phase="in_flight", attempts=event.attempt, outcome=None
        )
    if state is None:
        raise ReplayOrderError(
            f"{event.__struct_config__.tag} for action {event.action_id!r} precedes its intent"
        )
    match event:
        case ActionSucceeded():
            return msgspec.structs.replace(state, phase="succeeded", outcome=event)
        case ActionFailed():
            phase: ActionPhase = (
                "escalated" if event.options else "in_flight" if event.retry_scheduled else "failed"
            )
            return msgspec.structs.replace(state, phase=phase, outcome=event)
        case ActionDecided():
            if not event.accepted:
                return state
            return msgspec.structs.replace(state, phase="closed", decision=event)
    raise ReplayOrderError(  # pragma: no cover
        f"unhandled action event {event.__struct_config__.tag}"
    )


def fold_actions(events: Iterable[LogEvent]) -> dict[str, Action]:
    """Every action of a log, by action id (status-operation events are skipped)."""
    actions: dict[str, Action] = {}
    for ev in events:
        if isinstance(ev, ActionIntended | ActionSucceeded | ActionFailed | ActionDecided):
            actions[ev.action_id] = evolve_action(actions.get(ev.action_id), ev)
    return actions


# --- judging what came back -----------------------------------------------------------------


_CONSOLE = Option(
    id="inspect_provider_console", label="inspect the provider's console; bide does nothing more"
)
_ABANDON = Option(id="abandon", label="abandon: record that no result is expected")


def _option(kind: OptionKind, label: str) -> Option:
    return Option(id=kind, label=label)


def _escalation_options(
    intent: ActionIntended, spec: SubmitSpec | None, *, ambiguous: bool
) -> tuple[Option, ...]:
    if intent.kind == "submit":
        if not ambiguous:
            return (
                _option("retry_submit", "retry the submit (it never reached the provider)"),
                _ABANDON,
            )
        if spec is not None and spec.idempotent and intent.idempotency_key:
            return (
                _option(
                    "retry_same_idempotency_key",
                    "retry with the same idempotency key (the provider deduplicates)",
                ),
                _CONSOLE,
                _ABANDON,
            )
        return (_CONSOLE, _ABANDON)  # S29: no resubmit without idempotency
    if intent.kind == "cancel":
        return (_option("retry_cancel", "call cancel again"), _CONSOLE, _ABANDON)
    return ()


def _failed(
    intent: ActionIntended,
    now: float,
    reason: ActionReason,
    *,
    http_status: int | None = None,
    transport: TransportKind | None = None,
    ambiguous: bool = False,
    detail: str = "",
    options: tuple[Option, ...] = (),
    retry_scheduled: bool = False,
) -> ActionFailed:
    return ActionFailed(
        operation_id=intent.operation_id,
        at=now,
        action_id=intent.action_id,
        reason=reason,
        http_status=http_status,
        transport=transport,
        ambiguous=ambiguous,
        detail=detail[:_DETAIL_CAP],
        options=options,
        retry_scheduled=retry_scheduled,
    )


def judge_unanswered(
    intent: ActionIntended,
    kind: TransportKind | None,
    detail: str,
    spec: SubmitSpec | None,
    now: float,
) -> list[ActionEvent]:
    """No HTTP answer: ``kind`` is how delivery failed, or None when the daemon died between
    the intent and the outcome (ambiguous: the request may have been sent)."""
    never = kind in NEVER_DELIVERED
    detail = detail or (
        "the daemon stopped before the outcome was recorded" if kind is None else kind
    )
    if intent.kind == "fetch":
        return [
            _failed(intent, now, "fetch_failed", transport=kind, ambiguous=not never, detail=detail)
        ]
    options = _escalation_options(intent, spec, ambiguous=not never)
    if intent.kind == "cancel":
        return [
            _failed(
                intent,
                now,
                "cancel_outcome_unknown",
                transport=kind,
                ambiguous=not never,
                detail=detail,
                options=options,
            )
        ]
    if never:
        return [
            _failed(
                intent, now, "submit_not_delivered", transport=kind, detail=detail, options=options
            )
        ]
    return _ambiguous_submit(intent, spec, now, transport=kind, http_status=None, detail=detail)


def _ambiguous_submit(
    intent: ActionIntended,
    spec: SubmitSpec | None,
    now: float,
    *,
    transport: TransportKind | None,
    http_status: int | None,
    detail: str,
) -> list[ActionEvent]:
    if (
        spec is not None
        and spec.idempotent
        and intent.idempotency_key is not None
        and intent.attempt < spec.max_attempts
    ):
        # S29: idempotent and the key was recorded before sending: the same request again.
        return [
            _failed(
                intent,
                now,
                "submit_outcome_unknown",
                http_status=http_status,
                transport=transport,
                ambiguous=True,
                detail=detail,
                retry_scheduled=True,
            ),
            msgspec.structs.replace(intent, at=now, attempt=intent.attempt + 1),
        ]
    return [
        _failed(
            intent,
            now,
            "submit_outcome_unknown",
            http_status=http_status,
            transport=transport,
            ambiguous=True,
            detail=detail,
            options=_escalation_options(intent, spec, ambiguous=True),
        )
    ]


def judge_answer(
    intent: ActionIntended,
    status: int,
    headers: ResponseHeaders,
    operation_location: str | None,
    body: bytes,
    spec: SubmitSpec | None,
    status_url_origin: str,
    now: float,
) -> list[ActionEvent]:
    """An HTTP answer to a submit or a cancel (fetch answers are judged by the daemon, which
    streams the body to disk)."""
    if intent.kind == "cancel":
        if 200 <= status < 300:
            return [
                ActionSucceeded(
                    operation_id=intent.operation_id,
                    at=now,
                    action_id=intent.action_id,
                    http_status=status,
                )
            ]
        if status >= 500:
            return [
                _failed(
                    intent,
                    now,
                    "cancel_outcome_unknown",
                    http_status=status,
                    ambiguous=True,
                    detail=f"HTTP {status}",
                    options=_escalation_options(intent, spec, ambiguous=True),
                )
            ]
        return [
            _failed(
                intent,
                now,
                "cancel_rejected",
                http_status=status,
                detail=f"HTTP {status}",
                options=(_CONSOLE, _ABANDON),
            )
        ]
    if spec is None:
        raise ValueError("judging a submit needs the profile's SubmitSpec")
    if status >= 500:
        return _ambiguous_submit(
            intent,
            spec,
            now,
            transport=None,
            http_status=status,
            detail=f"HTTP {status}: the job may have been created",
        )
    if status not in (200, 201, 202):
        return [
            _failed(
                intent,
                now,
                "submit_rejected",
                http_status=status,
                detail=f"HTTP {status}",
                options=(_CONSOLE, _ABANDON),
            )
        ]
    found = _job_and_status(intent, headers, operation_location, body, spec, status_url_origin)
    if isinstance(found, str):
        return [
            _failed(
                intent,
                now,
                "submit_contradiction",
                http_status=status,
                detail=found,
                options=(_CONSOLE, _ABANDON),
            )
        ]
    job_id, status_location = found
    return [
        ActionSucceeded(
            operation_id=intent.operation_id,
            at=now,
            action_id=intent.action_id,
            http_status=status,
            provider_job_id=job_id,
            status_location=status_location,
            final_result=status in (200, 201),
        )
    ]


def _job_and_status(
    intent: ActionIntended,
    headers: ResponseHeaders,
    operation_location: str | None,
    body: bytes,
    spec: SubmitSpec,
    status_url_origin: str,
) -> tuple[str, str | None] | str:
    """(job id, status resource) as the profile says the provider returns them, or why not."""
    named = {"location": headers.location, "operation-location": operation_location}
    job_id: str | None = None
    if spec.job_id_from == "body":
        if spec.job_id_pointer is None:
            return "the profile reads the job id from the body but names no job_id_pointer"
        parsed, document = parse_json(body)  # bounded: never a RecursionError
        if not parsed:
            return f"the answer's body names no job id: {document}"
        ok, value = resolve_pointer(document, spec.job_id_pointer)
        if ok and isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            job_id = str(value)
    else:
        header = named[spec.job_id_from]
        if header:
            try:
                segment = urlsplit(urljoin(intent.url, header)).path.rstrip("/").rsplit("/", 1)[-1]
            except ValueError:
                return f"the {spec.job_id_from} header is not a URL"
            job_id = unquote(segment) or None
    if not job_id:
        return f"accepted, but no job id in the {spec.job_id_from} the profile names (S22)"
    if len(job_id) > MAX_ID_LENGTH or not re.fullmatch(ID_PATTERN, job_id):
        return (
            f"the job id in the {spec.job_id_from} is not a printable id of at most "
            f"{MAX_ID_LENGTH} characters"
        )
    status_location: str | None = None
    if spec.status_from != "template":
        header = named[spec.status_from]
        if not header:
            return f"accepted, but no {spec.status_from} header naming the status resource"
        try:
            status_location = urljoin(intent.url, header)
        except ValueError:
            return f"the {spec.status_from} header is not a URL"
        refused = check_provider_url(status_location, status_url_origin, spec.status_path_prefix)
        if refused is not None:
            return (
                f"the status resource it names is refused: {refused}; bide sends its "
                f"credential only to the profile's own status resources (S22)"
            )
    return job_id, status_location


# --- decisions ------------------------------------------------------------------------------


def decide_action(action: Action, decision: DecisionSubmitted, now: float) -> list[ActionEvent]:
    """A human's answer to an escalated action (S36): an offered option, or nothing changes."""

    def decided(accepted: bool, reason: str = "") -> ActionDecided:
        return ActionDecided(
            operation_id=action.operation_id,
            at=now,
            action_id=action.action_id,
            option_id=decision.option[:64],
            approver=decision.approver,
            note=decision.note,
            accepted=accepted,
            reason=reason,
        )

    offered = [o.id for o in action.options]
    if action.phase != "escalated":
        return [decided(False, f"action is {action.phase}, not awaiting a decision")]
    if decision.option not in offered:
        return [
            decided(
                False, f"option {decision.option!r} was not offered; offered: {', '.join(offered)}"
            )
        ]
    if decision.option in ("retry_submit", "retry_same_idempotency_key", "retry_cancel"):
        # The same request, the same key: a new attempt recorded before it is made.
        return [
            decided(True),
            msgspec.structs.replace(action.intent, at=now, attempt=action.attempts + 1),
        ]
    return [decided(True)]


# --- the story --------------------------------------------------------------------------------


def action_story(events: Iterable[ActionEvent]) -> list[dict[str, object]]:
    """Story lines for actions, in the shape of :func:`replay.story.story_json` (S39)."""
    from replay.decide import format_time
    from replay.story import PROVIDER_LONG_TEXT_LIMIT, bounded

    out: list[dict[str, object]] = []
    for ev in events:
        said: list[str] = []  # the provider's words, named in the text by placeholders
        match ev:
            case ActionIntended():
                key = ", idempotency key recorded" if ev.idempotency_key else ""
                size = f", at most {ev.max_bytes} bytes" if ev.max_bytes else ""
                text = (
                    f"{ev.kind} intended (attempt {ev.attempt}): {ev.method} {ev.url}"
                    f"{key}{size}, within {ev.timeout_seconds:g}s"
                )
                if ev.requested_by:
                    text += f", requested by {ev.requested_by}"
            case ActionSucceeded():
                if ev.provider_job_id is not None:
                    said.append(bounded(ev.provider_job_id))
                    where = ""
                    if ev.status_location:
                        said.append(bounded(ev.status_location, PROVIDER_LONG_TEXT_LIMIT))
                        where = ", status at ⟨provider_text[1]⟩"
                    text = f"submit accepted: HTTP {ev.http_status}, job ⟨provider_text[0]⟩{where}"
                elif ev.sha256 is not None:
                    text = f"fetched: HTTP {ev.http_status}, {ev.size} bytes, sha256 {ev.sha256}"
                else:
                    text = f"{ev.action_id.split('.')[-2]} done: HTTP {ev.http_status}"
            case ActionFailed():
                how = (
                    f"HTTP {ev.http_status}"
                    if ev.http_status is not None
                    else ev.transport or "no answer"
                )
                text = f"{ev.reason} ({how}: {ev.detail})"
                if ev.retry_scheduled:
                    text += "; retried with the same idempotency key"
                if ev.options:
                    text += ", escalated, options: " + " | ".join(
                        f"{o.label} [{o.id}]" for o in ev.options
                    )
            case ActionDecided():
                text = (
                    f"decision on {ev.action_id} by {ev.approver}: {ev.option_id}"
                    + ("" if ev.accepted else f" rejected ({ev.reason})")
                    + (f" ({ev.note})" if ev.note else "")
                )
        out.append(
            {
                "at": ev.at,
                "time": format_time(ev.at),
                "operation_id": ev.operation_id,
                "text": text,
                "events": [ev.__struct_config__.tag],
                "provider_text": said,
            }
        )
    return out
