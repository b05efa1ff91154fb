"""Errors of the daemon layer.

DaemonError            anything the I/O shell cannot do; the message names the path or
 |                     setting at fault and the fix, and never carries a secret
 +-- UsageError        bad flags or a missing/unreadable file given by the user (exit 2)
 +-- ConfigError       a config or provider profile that does not validate
 +-- Refused           the one refusal of a request (spool file, API call, command), with
                       its kind; the API maps the kind to an HTTP status
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay.retention import Tombstone


class DaemonError(Exception):
    exit_status = 2


class UsageError(DaemonError):
    exit_status = 2


class ConfigError(DaemonError):
    exit_status = 2


class RefusalKind(enum.Enum):
    """Why a request is refused, as a kind every door can act on (the API maps each to one
    HTTP status in :mod:`daemon.api.service`; the spool writes the detail beside the file)."""

    INVALID = "invalid"  # the request does not validate (422)
    MALFORMED = "malformed"  # the request cannot be read at all: JSON, a query value (400)
    NOT_FOUND = "not_found"  # nothing by that id that the caller may see (404)
    CONFLICT = "conflict"  # it clashes with what is recorded: an id in use, a state (409)
    FORBIDDEN = "forbidden"  # the caller lacks the role or the ownership it takes (403)
    GONE = "gone"  # it existed, and is no longer kept (410)
    RATE_LIMITED = "rate_limited"  # too many too fast: try again after ``retry_after`` (429)
    UNAVAILABLE = "unavailable"  # the daemon cannot answer yet: try again shortly (503)


class Refused(DaemonError):
    """A request the daemon will not carry out (from the spool, the API or a command): its
    ``kind``, a machine-readable ``code``, the ``field`` at fault and, for a refusal to be
    retried, ``retry_after`` seconds. ``str()`` is the detail, the reason shown."""

    exit_status = 1

    def __init__(
        self,
        detail: str,
        *,
        kind: RefusalKind = RefusalKind.INVALID,
        code: str = "rejected",
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.kind = kind
        self.code = code
        self.field = field
        self.retry_after = retry_after


def retired_refusal(op_id: str, tombstone: Tombstone) -> Refused:
    """The answer for an operation that ended and left the daemon's memory (``[retention]``):
    gone, the same to every retry, naming where its story still is."""
    return Refused(
        f"operation {op_id} {tombstone.outcome} and was retired from the daemon's memory "
        f"([retention] ended_after, max_ended); its story stays in the log: "
        f"bide story {op_id} --offline",
        kind=RefusalKind.GONE,
        code="operation_retired",
    )
