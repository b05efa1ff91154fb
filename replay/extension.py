"""What an approved extension does to an operation's deadline and budgets, and its label.

An ``extend`` (or ``rotate_credential_and_resume``) option carries its increments in
``params`` (``add_seconds``, ``add_status_requests``, ``add_transport_failures``,
``add_rate_limited``), computed when the escalation is raised. How they apply is the
operation's :data:`~replay.events.ExtendRule`, recorded at registration, so an old log replays
with the rule it was written under:

* ``add``: the time is added to the deadline in force, or to the approval time when the
  deadline has passed by then (the time a human took to answer is not the job's); the checks
  and failures are added to the budgets in force. A business-deadline stop moves the business
  deadline instead of the operation's. The label states the resulting values, computed at the
  raise: ``extend: deadline 10:40:00Z -> 10:55:00Z (+15 min), checks 20 -> 24 (+4), ...``.
* ``at_least`` (logs from before the rule was recorded): the deadline becomes at least
  approval + time and each budget at least used + added, which adds nothing to a deadline or a
  budget that was not reached. Its label stays the one it had: "extend 15 minutes and 4 more
  checks".

Pure: the approval or raise time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from replay.events import OptionKind, StopReason
from replay.state import Operation
from replay.text import format_time

__all__ = ["Extension", "extended", "extension_label"]


class Extension(msgspec.Struct, frozen=True, kw_only=True):
    """The deadline and budgets an approved extension puts in force.

    Attributes:
        deadline_at: The operation deadline.
        business_deadline_at: The business deadline, if any.
        max_status_requests: The status-request budget.
        max_transport_failures: The transport-failure budget.
        max_rate_limited: The rate-limited-response budget.
    """

    deadline_at: float
    business_deadline_at: float | None
    max_status_requests: int
    max_transport_failures: int
    max_rate_limited: int


def extended(op: Operation, params: Mapping[str, int], reason: StopReason, now: float) -> Extension:
    """The values in force once an extension with ``params`` is approved at ``now``.

    Args:
        op: The escalated operation.
        params: The option's increments.
        reason: The escalation's stop reason (a business-deadline stop moves that deadline).
        now: The approval time (or, for a label, the raise time).

    Returns:
        The new deadline and budgets, by the operation's extend rule.
    """
    add_seconds = params.get("add_seconds", 0)
    add_requests = params.get("add_status_requests", 0)
    add_failures = params.get("add_transport_failures", 0)
    add_limited = params.get("add_rate_limited", 0)
    business = op.business_deadline_at
    if op.extend_rule == "at_least":
        if reason == "business_deadline_exceeded" and business is not None:
            business = max(business, now + add_seconds)
        return Extension(
            deadline_at=max(op.deadline_at, now + add_seconds),
            business_deadline_at=business,
            max_status_requests=max(op.max_status_requests, op.status_requests_used + add_requests),
            max_transport_failures=max(
                op.max_transport_failures, op.transport_failures_used + add_failures
            ),
            max_rate_limited=max(op.max_rate_limited, op.rate_limited_used + add_limited),
        )
    deadline = op.deadline_at
    if reason == "business_deadline_exceeded" and business is not None:
        business = max(business, now) + add_seconds
    else:
        deadline = max(deadline, now) + add_seconds
    return Extension(
        deadline_at=deadline,
        business_deadline_at=business,
        max_status_requests=max(op.max_status_requests, op.status_requests_used) + add_requests,
        max_transport_failures=(
            max(op.max_transport_failures, op.transport_failures_used) + add_failures
        ),
        max_rate_limited=max(op.max_rate_limited, op.rate_limited_used) + add_limited,
    )


def _span(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _legacy_duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour" + ("s" if hours != 1 else "")
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute" + ("s" if minutes != 1 else "")
    return f"{seconds} seconds"


def _moved(name: str, before: float, after: float, add_seconds: int, now: float) -> str:
    span = _span(add_seconds)
    if before <= now:
        return f"{name} {format_time(before)} passed -> {span} after the approval"
    return (
        f"{name} {format_time(before)} -> {format_time(after)} "
        f"(+{span}, counted from the approval if the {name} has passed by then)"
    )


def extension_label(
    op: Operation, kind: OptionKind, params: Mapping[str, int], reason: StopReason, now: float
) -> str:
    """The label of a resuming option, with the values it puts in force if approved ``now``.

    Args:
        op: The operation being escalated.
        kind: ``extend`` or ``rotate_credential_and_resume``.
        params: The option's increments.
        reason: The stop reason.
        now: The raise time.

    Returns:
        The label; in the older wording for an operation under the ``at_least`` rule, so
        ``bide replay --check`` re-derives its escalations exactly.
    """
    add_seconds = params.get("add_seconds", 0)
    if op.extend_rule == "at_least":
        span = (
            f"{_legacy_duration(add_seconds)} and "
            f"{params.get('add_status_requests', 0)} more checks"
        )
        if kind == "extend":
            return f"extend {span}"
        return f"rotate the credential, then resume for {span}"
    new = extended(op, params, reason, now)
    business = op.business_deadline_at
    if reason == "business_deadline_exceeded" and business is not None:
        moved_to = new.business_deadline_at or business
        parts = [_moved("business deadline", business, moved_to, add_seconds, now)]
    else:
        parts = [_moved("deadline", op.deadline_at, new.deadline_at, add_seconds, now)]
        if business is not None and business < new.deadline_at:
            parts[0] += f" (the business deadline {format_time(business)} stays)"
    budgets = (
        ("checks", op.max_status_requests, new.max_status_requests),
        ("transport failures", op.max_transport_failures, new.max_transport_failures),
        ("rate-limited", op.max_rate_limited, new.max_rate_limited),
    )
    parts += [f"{name} {old} -> {after} (+{after - old})" for name, old, after in budgets]
    prefix = "extend" if kind == "extend" else "rotate the credential, then resume"
    return f"{prefix}: " + ", ".join(parts)
