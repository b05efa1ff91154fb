"""Errors of the daemon layer.

    DaemonError            anything the I/O shell cannot do; the message names the path or
     |                     setting at fault and the fix, and never carries a secret
     +-- UsageError        bad flags or a missing/unreadable file given by the user (exit 2)
     +-- ConfigError       a config or provider profile that does not validate
"""

from __future__ import annotations


class DaemonError(Exception):
    exit_status = 2


class UsageError(DaemonError):
    exit_status = 2


class ConfigError(DaemonError):
    exit_status = 2


class Refused(DaemonError):
    """A request the daemon will not carry out (from the spool or the API), with what an API
    answer needs: a machine-readable ``code``, an HTTP ``status`` and the ``field`` at fault."""

    exit_status = 1

    def __init__(self, detail: str, *, code: str = "rejected", status: int = 422,
                 field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.status = status
        self.field = field
