"""The policy's tables, as data (STYLE: tables are data; a miss is an error or "unknown").

* :data:`STATUS_OUTCOMES`: what an HTTP status code means for a status request (S20-S25).
  A code in no row is ``unexplained``: an integration failure (S23).
* :data:`TRANSPORT_KINDS`: what a transport failure says about delivery (STYLE 5, S18, S25).
* :data:`REASON_OPTIONS`: stop reason -> the options a human may be offered (S26, S27, S36),
  before the contract's filters (cancel only if documented; resubmission only with idempotency
  and a recorded key, S29).
* :data:`OPTION_EFFECTS`: whether choosing an option resumes polling.

Docs can be generated from these tables; tests iterate over them.
"""

from __future__ import annotations

from typing import Final, Literal

from replay.events import HttpOutcome, OptionKind, StopReason, TransportKind

__all__ = [
    "COUNTED_TRANSPORT_KINDS",
    "OPTION_EFFECTS",
    "REASON_OPTIONS",
    "STATUS_OUTCOMES",
    "TRANSPORT_KINDS",
    "http_outcome",
    "provider_rate_limited",
    "status_counts_as",
]

#: Status code ranges (inclusive) -> HTTP outcome. Ordered; the first match wins. A 2xx is
#: ``ok`` only if the contract lists it in ``ok_statuses``; otherwise it is ``unexplained``.
STATUS_OUTCOMES: Final[tuple[tuple[int, int, HttpOutcome], ...]] = (
    (200, 299, "ok"),  # read the body; the job outcome is a separate fact (S2)
    (300, 399, "redirect"),  # a status endpoint that redirects is not the contract (S22, S23)
    (401, 401, "auth_denied"),  # S24: stop at once
    (403, 403, "auth_denied"),  # S24
    (404, 404, "not_found"),  # S23: grace window, then not_found
    (429, 429, "rate_limited"),  # S21, RFC 6585 §4
    (500, 599, "server_error"),  # S25: transport-failure budget, the state stays unknown
)

#: Which budget a status code counts against, besides the status-request budget.
_COUNTS: Final[dict[HttpOutcome, Literal["transport", "rate_limited"]]] = {
    "server_error": "transport",  # S10: "5xx that hide the state"
    "rate_limited": "rate_limited",  # S21
}

TransportClass = Literal["never_delivered", "ambiguous", "integration"]

#: Transport failure kind -> what it says about delivery. ``never_delivered``: the request
#: never left (safe to repeat); ``ambiguous``: it may have reached the provider (S18); a status
#: GET is safe to repeat either way, but both count (S10). ``integration``: a response came but
#: broke the contract (over the size cap), an integration failure, not a transport failure.
TRANSPORT_KINDS: Final[dict[TransportKind, TransportClass]] = {
    "connect_refused": "never_delivered",
    "dns": "never_delivered",
    "tls": "never_delivered",
    "connect_timeout": "never_delivered",
    "pool_timeout": "never_delivered",
    "not_sent": "never_delivered",
    "read_timeout": "ambiguous",
    "write_timeout": "ambiguous",
    "connection_reset": "ambiguous",
    "protocol_error": "ambiguous",
    "body_too_large": "integration",
}

#: The kinds that count against the transport-failure budget (S10, S25).
COUNTED_TRANSPORT_KINDS: Final[frozenset[str]] = frozenset(
    kind for kind, cls in TRANSPORT_KINDS.items() if cls != "integration"
)

#: Stop reason -> options, in the order they are offered (S26, S27). ``authorization_denied``
#: never offers anything that polls again with the same credential (S24). Jobs that ended at the
#: provider (failure, canceled, expired) offer no cancel and no resubmission (S29).
REASON_OPTIONS: Final[dict[StopReason, tuple[OptionKind, ...]]] = {
    "deadline_exceeded": (
        "extend",
        "cancel_at_provider",
        "inspect_provider_console",
        "abandon",
    ),
    "business_deadline_exceeded": (
        "extend",
        "cancel_at_provider",
        "inspect_provider_console",
        "abandon",
    ),
    "request_budget_exhausted": (
        "extend",
        "cancel_at_provider",
        "inspect_provider_console",
        "abandon",
    ),
    "retry_after_past_deadline": (
        "extend",
        "cancel_at_provider",
        "inspect_provider_console",
        "abandon",
    ),
    "rate_limited": ("extend", "cancel_at_provider", "inspect_provider_console", "abandon"),
    "delivery_ambiguous": (
        "extend",
        "retry_same_idempotency_key",
        "cancel_at_provider",
        "inspect_provider_console",
        "abandon",
    ),
    "unknown_state": ("extend", "cancel_at_provider", "inspect_provider_console", "abandon"),
    "unparseable_response": ("inspect_provider_console", "extend", "abandon"),
    "integration_failure": ("inspect_provider_console", "abandon"),
    "contradiction": ("inspect_provider_console", "cancel_at_provider", "abandon"),
    "provider_failure": ("inspect_provider_console", "abandon"),
    "canceled": ("inspect_provider_console", "abandon"),
    "expired": ("inspect_provider_console", "abandon"),
    "not_found": (
        "retry_same_idempotency_key",
        "extend",
        "inspect_provider_console",
        "abandon",
    ),
    "authorization_denied": (
        "rotate_credential_and_resume",
        "inspect_provider_console",
        "abandon",
    ),
    # bide failed, not the provider: look at the job, resume once bide is fixed, or let go.
    "internal_error": ("inspect_provider_console", "extend", "abandon"),
}

#: Option -> whether choosing it resumes polling (a new authorization, S36). The others close
#: the operation and name a follow-up that is a separate operation (S34).
OPTION_EFFECTS: Final[dict[OptionKind, bool]] = {
    "extend": True,
    "rotate_credential_and_resume": True,
    "cancel_at_provider": False,
    "retry_same_idempotency_key": False,
    "inspect_provider_console": False,
    "abandon": False,
}


def http_outcome(status_code: int, ok_statuses: tuple[int, ...]) -> HttpOutcome:
    """Classify a status code under a contract (S2, S20-S25).

    Args:
        status_code: The HTTP status code.
        ok_statuses: The 2xx codes whose body the contract explains.

    Returns:
        The HTTP outcome; ``unexplained`` for a code the contract does not explain.
    """
    for low, high, outcome in STATUS_OUTCOMES:
        if low <= status_code <= high:
            if outcome == "ok" and status_code not in ok_statuses:
                return "unexplained"
            return outcome
    return "unexplained"


def status_counts_as(
    status_code: int, ratelimit_remaining: str | None = None
) -> Literal["transport", "rate_limited"] | None:
    """Which extra budget a response with this status counts against, if any (S21, S25)."""
    if provider_rate_limited(status_code, ratelimit_remaining):
        return "rate_limited"
    return _COUNTS.get(http_outcome(status_code, (status_code,)))


def provider_rate_limited(status_code: int, ratelimit_remaining: str | None) -> bool:
    """Whether a 403 or 429 is the provider's own rate limit: its remaining-requests header
    (recorded only when the contract names one) says ``0``. GitHub answers its primary rate
    limit so; a 403 without it stays a refused credential (S24)."""
    return (
        status_code in (403, 429)
        and ratelimit_remaining is not None
        and ratelimit_remaining.strip() == "0"
    )
