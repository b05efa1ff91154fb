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

import msgspec

from replay.events import (
    MAX_ID_LENGTH,
    Registration,
    RequestOutcomeUnknown,
    StatusResponseReceived,
    TransportFailed,
)

__all__ = [
    "MAX_ID_LENGTH",
    "DecisionSubmitted",
    "InternalFault",
    "Observation",
    "QuotaDeferred",
    "Registration",
    "WakeUp",
    "Withdrawal",
]


class WakeUp(msgspec.Struct, frozen=True, kw_only=True, tag="wake_up"):
    """A timer fired for the operation (or the daemon started): run the S32 checks.

    Attributes:
        timer_elapsed: The daemon's monotonic timer for the wait it scheduled has run out.
            The poll is then due even if the wall clock (set back since) still reads before
            ``next_poll_at``; the deadline is checked against the wall clock all the same.
    """

    timer_elapsed: bool = False


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
        self_approved: The approver registered the operation (the daemon checked that the
            config allows it); recorded with the decision.
    """

    option: str
    approver: str
    note: str = ""
    escalation_id: int | None = None
    self_approved: bool = False


class InternalFault(msgspec.Struct, frozen=True, kw_only=True, tag="internal_fault"):
    """bide itself raised while handling the operation (a bug): the daemon stops the wait
    with ``internal_error`` instead of dying, and the other operations go on.

    Attributes:
        detail: What failed, without a message that could carry a secret: the stage and the
            exception class (``"ValueError while polling"``).
    """

    detail: str


class Withdrawal(msgspec.Struct, frozen=True, kw_only=True, tag="withdrawal"):
    """The operation's owner asked to stop waiting (the daemon checked who may).

    Attributes:
        by: The owner's user name, from the kernel (the API's peer credentials).
        by_uid: Their uid.
        note: Free text.
    """

    by: str
    by_uid: int | None = None
    note: str = ""


Observation = (
    WakeUp
    | Withdrawal
    | InternalFault
    | QuotaDeferred
    | DecisionSubmitted
    | StatusResponseReceived
    | TransportFailed
    | RequestOutcomeUnknown
)
