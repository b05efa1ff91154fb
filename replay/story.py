"""The audit trail as a story (S38, S39).

:func:`story` renders a log (one or many operations) as the timeline the source article shows,
one line per observation, times in ISO-8601 UTC::

    2025-04-18T10:20:00Z registered job exp_71c at acme, deadline 2025-04-18T11:00:00Z, budget 12
    2025-04-18T10:20:05Z polled (request 1 of 12), state queued, next poll ... from local backoff
    2025-04-18T10:20:31Z received 503, Retry-After 120, next poll ... from provider guidance
    2025-04-18T10:58:00Z polled (request 12 of 12), state running, request budget exhausted, ...

A line starts at a registration, a response, a transport failure, a wake-up decision, a human
decision or a takeover by another node (``node_took_over``); the decisions taken on it (``at``
equal to the first of them) continue the line.
:func:`story_json` gives the same lines as JSON-ready dicts, each with the events it tells.

No secret is printed: result URLs lose their query and fragment (signed URLs carry tokens);
bodies are not printed; the provider's error is (it is the provider's message, S3).

Words a provider chose (job states, its error, header values, hint values, result values,
transport failure details, job ids it assigned) are kept apart from bide's own words: a line's
``text`` names each by a placeholder, ``⟨provider_text[i]⟩``, and the value is the line's
``provider_text[i]``, cut at :data:`PROVIDER_TEXT_LIMIT` characters. An agent's model reading
the JSON story can then tell bide's account from what a (possibly hostile) provider wrote.
:func:`inline` puts the values back, quoted where they are more than one plain word, for
people (``bide story``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlsplit

import msgspec

from replay.decide import format_time
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    DelaySource,
    EscalationRaised,
    Event,
    HintRejected,
    NodeTookOver,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    OperationWithdrawn,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    ResponseClassified,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
)

__all__ = [
    "PROVIDER_LONG_TEXT_LIMIT",
    "PROVIDER_TEXT_LIMIT",
    "StoryLine",
    "bounded",
    "for_people",
    "inline",
    "story",
    "story_json",
]

#: The most characters of one piece of provider text an agent is shown (story values, and
#: the API's ``provider_*`` fields): room for any job state (the model keeps 128), header
#: value or job id, while 10 KB of prose crafted to steer a model is cut to a twentieth.
PROVIDER_TEXT_LIMIT = 512
#: A provider's error, and a result value: the contract's default ``error_cap_bytes``, so the
#: error a person decides from arrives whole as the default contract keeps it (issue 14),
#: and any URL a browser or CDN accepts, signed query and all (a link cut short is useless).
#: Whole values stay in the log (``bide story --offline``, ``bide status --offline``).
PROVIDER_LONG_TEXT_LIMIT = 2048

_PLACEHOLDER = re.compile(r"⟨provider_text\[(\d+)\]⟩")
_PLAIN = re.compile(r"[\w.:/@+%=&~?…-]{1,200}")


def bounded(text: str, limit: int = PROVIDER_TEXT_LIMIT) -> str:
    """``text`` cut at ``limit`` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[cut by bide: {len(text) - limit} more characters]"


def inline(text: str, provider_text: Sequence[str]) -> str:
    """A line for people: each placeholder replaced by its value, quoted unless it is one
    plain word (a state like ``running`` reads as before)."""

    def value(m: re.Match[str]) -> str:
        i = int(m.group(1))
        if i >= len(provider_text):
            return m.group(0)
        said = provider_text[i]
        return said if _PLAIN.fullmatch(said) else repr(said)

    return _PLACEHOLDER.sub(value, text)


def for_people(lines: Iterable[Mapping[str, object]]) -> str:
    """JSON story lines (:func:`story_json`, the API's) as ``bide story`` prints them: one
    per line, time first, the provider's words inline (:func:`inline`)."""
    out = []
    for line in lines:
        said = line.get("provider_text") or []
        assert isinstance(said, list)
        out.append(f"{line['time']} {inline(str(line['text']), [str(v) for v in said])}\n")
    return "".join(out)


class _Said(msgspec.Struct, frozen=True):
    """A value the provider chose, inside a line's text; shown to agents cut at ``limit``."""

    value: str
    limit: int = PROVIDER_TEXT_LIMIT


_Part = str | _Said

#: How a delay source reads in a story (S38, S39).
SOURCE_PHRASES: dict[DelaySource, str] = {
    "provider_retry_after": "provider guidance (Retry-After)",
    "provider_poll_hint": "provider hint",
    "local_backoff": "local backoff",
    "rate_limit_policy": "rate-limit policy",
    "manual_extension": "manual extension",
    "local_quota": "local quota",
}


class StoryLine(msgspec.Struct, kw_only=True):
    """One line of the story.

    Attributes:
        at: When (POSIX seconds).
        time: ``at`` in ISO-8601 UTC.
        operation_id: The operation.
        text: The line's text, without its time.
        events: The tags of the events the line tells.
    """

    at: float
    time: str
    operation_id: str
    text: str
    events: list[str] = []
    group_at: float | None = None
    provider_text: list[str] = []
    provider_limits: list[int] = []

    def add(self, parts: Sequence[_Part]) -> str:
        """``parts`` as text, each provider value a placeholder for one appended here."""
        out = []
        for part in parts:
            if isinstance(part, _Said):
                out.append(f"⟨provider_text[{len(self.provider_text)}]⟩")
                self.provider_text.append(part.value)
                self.provider_limits.append(part.limit)
            else:
                out.append(part)
        return "".join(out)


def _said_in(text: str, *values: str | None) -> list[_Part]:
    """``text`` (bide's, recorded) with each quoted value the provider chose (as the model
    quotes it: ``repr``) marked as the provider's."""
    parts: list[_Part] = [text]
    for value in values:
        if not value:
            continue
        quoted = repr(value)
        split: list[_Part] = []
        for part in parts:
            if isinstance(part, _Said):
                split.append(part)
                continue
            for i, piece in enumerate(part.split(quoted)):
                if i:
                    split.append(_Said(value))
                if piece:
                    split.append(piece)
        parts = split
    return parts


def _redact_url(value: str) -> str:
    try:
        parts = urlsplit(value)
    except ValueError:
        return "<unparseable>"
    if not parts.scheme or not parts.hostname:
        return value if len(value) <= 80 else value[:80] + "…"
    port = f":{parts.port}" if parts.port else ""
    tail = "?…" if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}{tail}"


def _tag(event: Event) -> str:
    return str(event.__struct_config__.tag)


def _lines(events: Iterable[Event]) -> list[StoryLine]:
    lines: list[StoryLine] = []
    open_line: dict[str, StoryLine] = {}
    intents: dict[str, StatusRequestIntended] = {}
    states: dict[str, str] = {}  # the last job state each operation's provider reported
    job_ids: dict[str, str] = {}  # the job id each operation's provider knows its job by

    def start(event: Event, *parts: _Part) -> None:
        line = StoryLine(
            at=event.at,
            time=format_time(event.at),
            operation_id=event.operation_id,
            text="",
            events=[_tag(event)],
        )
        line.text = line.add(parts)
        lines.append(line)
        open_line[event.operation_id] = line

    def extend(event: Event, *parts: _Part) -> None:
        """Continue the line of this decision's group, or start a line of its own."""
        line = open_line.get(event.operation_id)
        if line is not None and line.group_at in (None, event.at):
            line.group_at = event.at
            text = line.add(parts)
            line.text = f"{line.text}, {text}" if text else line.text
            line.events.append(_tag(event))
        else:
            start(event, *parts)
            open_line[event.operation_id].group_at = event.at

    def of_budget(op: str, number: int) -> str:
        intent = intents.get(op)
        if intent is not None and intent.request_number == number:
            return f"request {number} of {intent.max_status_requests}"
        return f"request {number}"

    for event in events:
        op = event.operation_id
        match event:
            case OperationRegistered():
                who = f" for {event.registered_by}" if event.registered_by else ""
                text = f" at {event.provider}{who}, deadline {format_time(event.deadline_at)}"
                if event.business_deadline_at is not None:
                    text += f", business deadline {format_time(event.business_deadline_at)}"
                text += (
                    f", budget {event.max_status_requests} status requests, "
                    f"{event.max_transport_failures} transport failures, "
                    f"{event.max_rate_limited} rate-limited responses; "
                    f"first poll {format_time(event.first_poll_at)}"
                )
                job_ids[op] = event.provider_job_id
                start(event, "registered job ", _Said(event.provider_job_id), text)
                open_line.pop(op)  # what follows a registration is a wake-up, not a reply
            case RegistrationRejected():
                start(event, f"registration rejected: {event.reason} ({event.detail})")
                open_line.pop(op, None)
            case StatusRequestIntended():
                intents[op] = event
                open_line.pop(op, None)
            case StatusResponseReceived():
                head = "polled" if 200 <= event.status_code < 300 else "received"
                text = f"{head} ({of_budget(op, event.request_number)})"
                if head == "received":
                    text = f"received {event.status_code} ({of_budget(op, event.request_number)})"
                h = event.headers
                parts: list[_Part] = [text]
                for label, value in (
                    ("Retry-After", h.retry_after),
                    ("RateLimit", h.ratelimit),
                    ("RateLimit-Policy", h.ratelimit_policy),
                    ("provider request id", h.request_id),
                    ("Location", None if h.location is None else _redact_url(h.location)),
                ):
                    if value is not None:
                        parts += [f", {label} ", _Said(value[:120])]
                if event.body_truncated:
                    parts.append(", body over the size cap")
                start(event, *parts)
            case TransportFailed():
                failed = f"{of_budget(op, event.request_number)} failed: {event.kind}"
                if event.detail:
                    start(event, failed, " (", _Said(event.detail[:120]), ")")
                else:
                    start(event, failed)
            case RequestOutcomeUnknown():
                start(
                    event,
                    f"{of_budget(op, event.request_number)}: outcome unknown after a restart "
                    "(counted; delivery ambiguous)",
                )
            case ResponseClassified():
                if event.job_state is None:
                    extend(event, "")
                else:
                    states[op] = event.job_state
                    extend(event, "state ", _Said(event.job_state))
            case HintRejected():
                extend(
                    event, f"{event.hint} ", _Said(event.value[:60]), f" rejected ({event.reason})"
                )
            case PollScheduled():
                text = (
                    f"next poll {format_time(event.next_poll_at)} from "
                    f"{SOURCE_PHRASES[event.delay_source]}"
                )
                if event.clamped_to_deadline:
                    text += " (the deadline)"
                extend(event, text)
            case OperationSucceeded():
                shown: list[_Part] = []
                for k, v in event.results.items():
                    shown += [
                        ", " if shown else ", results ",
                        f"{k}=",
                        _Said(_redact_url(v), PROVIDER_LONG_TEXT_LIMIT),
                    ]
                extend(event, "succeeded", *shown)
            case OperationStopped():
                stopped: list[_Part] = [
                    f"stopped: {event.reason} (",
                    *_said_in(event.detail, states.get(op), job_ids.get(op)),
                    ")",
                ]
                if event.provider_error is not None:
                    # Whole, as recorded (bounded by the contract's error_cap_bytes), quoted.
                    cut = " (cut at the contract's error_cap_bytes)" * (
                        event.provider_error_truncated
                    )
                    stopped += [
                        f", provider error{cut} ",
                        _Said(event.provider_error, PROVIDER_LONG_TEXT_LIMIT),
                    ]
                extend(event, *stopped)
            case EscalationRaised():
                options = " | ".join(f"{o.label} [{o.id}]" for o in event.options)
                extend(event, f"escalated (#{event.escalation_id}), options: {options}")
            case DecisionRecorded():
                note = f" ({event.note[:200]})" if event.note else ""
                if event.self_approved:
                    note += " (self-approved: the approver registered the operation)"
                if event.resumes:
                    text = (
                        f"decision by {event.approver}: {event.option_id}{note}; new deadline "
                        f"{format_time(event.new_deadline_at)}, budget "
                        f"{event.new_max_status_requests} status requests"
                    )
                else:
                    text = (
                        f"decision by {event.approver}: {event.option_id}{note}; bide stops waiting"
                    )
                start(event, text)
                open_line[op].group_at = event.at
            case DecisionRejected():
                start(
                    event,
                    f"decision by {event.approver} rejected: {event.reason}",
                )
                open_line[op].group_at = event.at
            case OperationWithdrawn():
                note = f" ({event.note[:200]})" if event.note else ""
                start(
                    event,
                    f"withdrawn by its owner {event.by}{note}: bide stops waiting, "
                    "no provider call",
                )
                open_line[op].group_at = event.at
            case NodeTookOver():
                start(event, f"taken over by node {event.node} (epoch {event.epoch})")
                open_line.pop(op)  # what follows is the new node's own decision
    return lines


def story(events: Iterable[Event]) -> str:
    """Render a log as the audit story (S39), one line per observation.

    Args:
        events: Events in log order (one or many operations).

    Returns:
        The story, lines ending in newlines; each line starts with its ISO-8601 UTC time, and
        with ``[operation id]`` if the log holds more than one operation.
    """
    lines = _lines(events)
    many = len({line.operation_id for line in lines}) > 1
    out = []
    for line in lines:
        prefix = f"[{line.operation_id}] " if many else ""
        out.append(f"{line.time} {prefix}{inline(line.text, line.provider_text)}\n")
    return "".join(out)


def story_json(events: Iterable[Event]) -> list[dict[str, object]]:
    """The story as JSON-ready dicts: ``at``, ``time``, ``operation_id``, ``text``, ``events``,
    ``provider_text`` (the provider's words the text's placeholders name, each
    :func:`bounded`).

    Args:
        events: Events in log order.

    Returns:
        One dict per story line.
    """
    return [
        {
            "at": line.at,
            "time": line.time,
            "operation_id": line.operation_id,
            "text": line.text,
            "events": list(line.events),
            "provider_text": [
                bounded(said, limit)
                for said, limit in zip(line.provider_text, line.provider_limits, strict=True)
            ],
        }
        for line in _lines(events)
    ]
