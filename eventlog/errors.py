"""Errors of the event log.

EventLogError               base; messages name the path or key id, never key material
  +-- KeyFileError         a key file is missing, unreadable, malformed or too open
 +-- UnknownKeyError        a record names a data key id the keyring does not hold
 +-- DecryptError           a payload failed authentication (wrong key, or tampering)
 +-- LockedError            another process holds the log's writer lock (names its pid)
 +-- DamagedLogError        the log fails verification; the writer refuses to append
 +-- LogIOError             an fsync or write failed; the writer stops and must reopen
 |    +-- StoreError        the database store failed; nothing of the round was acknowledged
 |         +-- FencedError  another node holds the lease (a higher epoch): stop, go standby
 |              +-- DivergedError  the round does not follow the stored head: re-sync
 +-- SchemaError            no bide schema in the database, or an unknown version
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


class StoreError(LogIOError):
    """The durable store behind the log (PostgreSQL) failed or is unreachable; nothing of the
    round was acknowledged. Messages name the store, never a password."""


class FencedError(StoreError):
    """Another node took the log's lease (its epoch moved on): this node must not append or
    send anything more, and falls back to standby."""

    exit_status = 1


class DivergedError(FencedError):
    """This node's round does not follow the record the database holds (a commit whose outcome
    was lost, or records only the local copy has): the node stops, lets its lease run out and
    rebuilds its copy from the database as a standby."""


class SchemaError(EventLogError):
    """The database holds no bide schema, or one this version does not know; names the command
    that creates or upgrades it (`bide log init`)."""
