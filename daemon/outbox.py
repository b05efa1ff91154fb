"""Escalations as messages a human reads: one text file per escalation in the outbox (S27).

The same text goes to the daemon's log output. It carries ids, states, counts and times; never
a credential (the event it renders holds none).
"""

from __future__ import annotations

import os
from pathlib import Path

from replay.decide import format_time
from replay.events import EscalationRaised, Option
from replay.state import Operation


def provider_error_text(error: str, truncated: bool, indent: str = "  ") -> str:
    """The provider's own error, whole as stored, quoted line by line; says where it was cut."""
    head = (
        f"{indent}provider error (cut at the contract's error_cap_bytes; the rest is in no record):"
        if truncated
        else f"{indent}provider error:"
    )
    body = [f"{indent}  | {line}" for line in error.splitlines() or [""]]
    return "\n".join([head, *body])


def escalation_text(ev: EscalationRaised, op: Operation | None = None) -> str:
    """The message a human decides from (S27, S37), with the provider's error when ``op`` (the
    operation's state as of the escalation) holds one."""
    c = ev.context
    last_http = (
        f"HTTP {c.last_http_status} at {format_time(c.last_http_at)}"
        if c.last_http_status is not None and c.last_http_at is not None
        else "no HTTP response yet"
    )
    lines = [
        f"bide escalation {c.operation_id} #{ev.escalation_id}: {ev.reason}",
        f"  operation:     {c.operation_id} (provider {c.provider}, job {c.provider_job_id})",
        f"  reason:        {ev.reason}" + (f" ({c.detail})" if c.detail else ""),
        f"  last state:    {c.last_state or 'none observed'}"
        + (f" at {format_time(c.last_state_at)}" if c.last_state_at is not None else ""),
        f"  elapsed:       {c.elapsed_seconds:.0f}s since {format_time(c.started_at)}",
        f"  deadline:      {format_time(c.deadline_at)}"
        + (
            f" (business deadline {format_time(c.business_deadline_at)})"
            if c.business_deadline_at is not None
            else ""
        ),
        f"  requests:      {c.status_requests_used} of {c.max_status_requests} used; "
        f"transport failures {c.transport_failures_used} of {c.max_transport_failures}; "
        f"rate-limited {c.rate_limited_used} of {c.max_rate_limited}",
        f"  last HTTP:     {last_http}"
        + (
            f", provider request id {c.last_provider_request_id}"
            if c.last_provider_request_id
            else ""
        ),
    ]
    if op is not None and op.provider_error is not None:
        lines.append(provider_error_text(op.provider_error, op.provider_error_truncated))
    lines.append("  options:")
    for n, option in enumerate(ev.options, start=1):
        lines.append(f"    {n}. {_option_text(option)}")
    lines.append(
        f"  decide with:   bide decide {c.operation_id} OPTION --escalation "
        f"{ev.escalation_id} [--note TEXT]"
    )
    return "\n".join(lines) + "\n"


def _option_text(option: Option) -> str:
    """``ID: LABEL [params]``; a label that starts with ``ID:`` is shown alone: it names its
    id already, and an extension's states the values it puts in force, params included."""
    if option.label.startswith(f"{option.id}:"):
        return option.label
    params = ", ".join(f"{k}={v}" for k, v in sorted(option.params.items()))
    return f"{option.id}: {option.label}" + (f" [{params}]" if params else "")


def write_escalation(outbox: Path, ev: EscalationRaised, op: Operation | None = None) -> Path:
    return write_text(outbox, f"{ev.operation_id}.{ev.escalation_id}", escalation_text(ev, op))


def write_text(outbox: Path, name: str, text: str) -> Path:
    """Write ``NAME.txt`` atomically; an existing one (a replayed escalation) is kept."""
    outbox.mkdir(mode=0o750, parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    path = outbox / f"{safe}.txt"
    if path.exists():
        return path
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.rename(tmp, path)
    return path
