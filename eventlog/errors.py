"""Errors of the event log.

    EventLogError               base; messages name the path or key id, never key material
      +-- KeyFileError         a key file is missing, unreadable, malformed or too open
     +-- UnknownKeyError        a record names a data key id the keyring does not hold
     +-- DecryptError           a payload failed authentication (wrong key, or tampering)
     +-- LockedError            another process holds the log's writer lock (names its pid)
     +-- DamagedLogError        the log fails verification; the writer refuses to append
     +-- LogIOError             an fsync or write failed; the writer stops and must reopen
"""

from __future__ import annotations


class EventLogError(Exception):
    """Base of every event-log error. ``exit_status`` is what the CLI exits with."""

    exit_status = 2


class KeyFileError(EventLogError):
    pass


class UnknownKeyError(EventLogError):
    pass


class DecryptError(EventLogError):
    exit_status = 1


class LockedError(EventLogError):
    pass


class DamagedLogError(EventLogError):
    exit_status = 1


class LogIOError(EventLogError):
    pass
