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
