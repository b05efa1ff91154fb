"""What ``decide`` and ``register`` are fed, besides the fact events of :mod:`replay.events`.

An observation is one of:

* a **stored fact** the daemon appended first (``StatusResponseReceived``, ``TransportFailed``,
  ``RequestOutcomeUnknown``): the daemon evolves the operation with it, then calls ``decide``;
* a **transient observation** that is not stored by itself, because the events ``decide``
  returns for it record it (``check`` rebuilds it from them): :class:`WakeUp` (a timer fired, or
  the daemon started), :class:`QuotaDeferred` (the daemon's per-provider quota held the poll
  back; recorded as ``PollScheduled.until``), :class:`DecisionSubmitted` (a human's choice;
  recorded as ``DecisionRecorded`` or ``DecisionRejected``).

:class:`Registration` is what ``register`` validates (from ``bide watch`` / ``bide submit``).
Its msgspec constraints make a malformed spool file fail decoding; ``register`` checks the same
bounds again and the ones that depend on ``now`` and the contract.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
from msgspec import Meta

from replay.events import RequestOutcomeUnknown, StatusResponseReceived, TransportFailed

__all__ = [
    "MAX_ID_LENGTH",
    "DecisionSubmitted",
    "Observation",
    "QuotaDeferred",
    "Registration",
    "WakeUp",
]

#: The longest operation id, provider job id, fingerprint or account context accepted.
MAX_ID_LENGTH: Final = 256
#: Ids are printable: no control characters, no whitespace at either end.
ID_PATTERN: Final = r"^[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"

Identifier = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]


class WakeUp(msgspec.Struct, frozen=True, tag="wake_up"):
    """A timer fired for the operation (or the daemon started): run the S32 checks."""


class QuotaDeferred(msgspec.Struct, frozen=True, kw_only=True, tag="quota_deferred"):
    """The daemon's per-provider quota held a due poll back until ``until``.

    Attributes:
        until: The earliest time the quota allows (POSIX seconds, UTC).
    """

    until: float


class DecisionSubmitted(msgspec.Struct, frozen=True, kw_only=True, tag="decision_submitted"):
    """A human's decision on an escalation (S36).

    Attributes:
        option: The option id chosen.
        approver: The decision file owner's user name (filled by the daemon, never claimed).
        note: Free text from the approver.
        escalation_id: The escalation decided; if given and not the open one, it is rejected.
    """

    option: str
    approver: str
    note: str = ""
    escalation_id: int | None = None


Observation = (
    WakeUp
    | QuotaDeferred
    | DecisionSubmitted
    | StatusResponseReceived
    | TransportFailed
    | RequestOutcomeUnknown
)


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """A request to watch one job at one provider (S5, S10, S12, S28).

    Attributes:
        operation_id: bide's id for the operation (unique in the log; the daemon checks).
        provider: The provider; must be the contract's.
        provider_job_id: The job id at the provider; non-empty, bounded, printable.
        account_context: The provider account context (a name, never a credential).
        request_fingerprint: Fingerprint of the original submit request.
        expected_terminal_state: The success state expected; must be in the success list.
        idempotency_key: The persisted idempotency key of the submission, if any (S29).
        status_location: The status resource named by a 202's Location, if any (S22).
        started_at: When the job was submitted; default ``now``; not in the future.
        deadline_at: The deadline; default ``now + contract.default_deadline_seconds``.
        business_deadline_at: When the result stops being useful (S28), if known.
        max_status_requests: Status-request budget; default from the contract.
        max_transport_failures: Transport-failure budget; default from the contract.
        max_rate_limited: Rate-limited budget; default from the contract.
        first_poll_after_seconds: Delay before the first poll; default from the contract.
    """

    operation_id: Identifier
    provider: Annotated[str, Meta(min_length=1, max_length=64)]
    provider_job_id: Identifier
    account_context: Annotated[str, Meta(max_length=MAX_ID_LENGTH)] = ""
    request_fingerprint: Annotated[str, Meta(max_length=MAX_ID_LENGTH)] = ""
    expected_terminal_state: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH)] | None = None
    status_location: Annotated[str, Meta(min_length=1, max_length=2048)] | None = None
    started_at: float | None = None
    deadline_at: float | None = None
    business_deadline_at: float | None = None
    max_status_requests: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    max_transport_failures: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    max_rate_limited: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    first_poll_after_seconds: Annotated[float, Meta(ge=0)] | None = None
