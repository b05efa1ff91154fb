"""Errors of the replay layer.

Expected outcomes of polling (a 401, a 429, an unknown job state, a spent budget, a rejected
registration or decision) are *values*: events that ``decide`` returns. The exceptions below are
for bugs in a caller and for logs that cannot be read; their messages name the event type, the
operation id or the schema version, and never carry a secret, a response body or a header value.

    ReplayError                  base of every error raised by ``replay``
     +-- EventDecodeError        a payload is not a bide event (corrupt, or not JSON)
     |    +-- NewerSchemaError   the payload was written by a newer bide: a newer schema major
     |                           version or an event type this bide does not know; "upgrade bide"
     +-- ReplayOrderError        ``evolve`` was given an event that cannot follow the state it
     |                           was given (before registration, a second registration, another
     |                           operation's event): the log or the caller is wrong
     +-- InvalidInputError       ``decide``/``register`` were called outside their contract
     |                           (a draw outside [0, 1), a non-finite ``now``, an observation
     |                           for another operation); also a ``ValueError``
     +-- InvalidEventError       an event about to be appended would not read back as written
                                 (``encode_checked``): a bug, caught before it poisons the log
"""

from __future__ import annotations


class ReplayError(Exception):
    """Base of every exception raised by :mod:`replay`."""


class EventDecodeError(ReplayError):
    """A payload could not be decoded as a bide event."""


class NewerSchemaError(EventDecodeError):
    """A payload was written by a newer bide (newer schema major, or an unknown event type)."""

    def __init__(self, schema: int, detail: str = "") -> None:
        self.schema = schema
        message = f"this log was written by a newer bide (schema {schema}); upgrade bide"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)


class ReplayOrderError(ReplayError):
    """An event cannot be applied to the state it was given."""


class InvalidInputError(ReplayError, ValueError):
    """A pure function was called with an argument outside its documented contract."""


class InvalidEventError(ReplayError):
    """An event would not read back from the log as written; it is never appended."""
