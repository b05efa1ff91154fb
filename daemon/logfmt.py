"""Structured log lines (logfmt), one per line on stderr: journald-friendly and grep-able.

Only ids, counts, reasons and times go in; credentials and payloads never do.

Under journald (``$JOURNAL_STREAM`` names the device and inode of the stream a line goes to,
as sd-daemon(3) describes) each line starts with its syslog priority, ``<3>`` error,
``<4>`` warning, ``<6>`` info, ``<7>`` debug, so ``journalctl -p warning`` finds the
warnings; anywhere else lines carry no prefix. Lines below the level set by
:func:`set_level` (``[log] level``, ``bide run --log-level``) are not written.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Literal, TextIO, get_args

LogLevel = Literal["debug", "info", "warning", "error"]
LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)

#: Each level's rank (lines below the threshold are dropped), its word in the line, and its
#: syslog priority (RFC 5424 §6.2.1) for journald's ``<N>`` prefix.
_RANK = {"debug": 0, "info": 1, "warning": 2, "error": 3}
_WORD = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3}

_stream: TextIO | None = None  # None: whatever sys.stderr is at the time
_threshold = _RANK["info"]
#: The stream last checked against $JOURNAL_STREAM, and whether it is the journal.
_journal_checked: tuple[TextIO, str, bool] | None = None


def set_stream(stream: TextIO | None) -> None:
    """Send log lines elsewhere (the demo keeps them in a file beside its log)."""
    global _stream
    _stream = stream


def set_level(level: str) -> None:
    """Write only lines at ``level`` or above (debug, info, warning, error)."""
    global _threshold
    if level not in _RANK:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    _threshold = _RANK[level]


def is_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is connected to journald: ``$JOURNAL_STREAM`` (``DEV:INODE``) names
    the file it writes to. A stream inherited by a child that redirected it does not match."""
    global _journal_checked
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    if (
        _journal_checked is not None
        and _journal_checked[0] is stream
        and _journal_checked[1] == expected
    ):
        return _journal_checked[2]
    try:
        st = os.fstat(stream.fileno())
        matches = expected == f"{st.st_dev}:{st.st_ino}"
    except (OSError, ValueError, AttributeError):  # no file descriptor behind it
        matches = False
    _journal_checked = (stream, expected, matches)
    return matches


def journal_prefix(level: LogLevel, stream: TextIO) -> str:
    """``<N>``, the syslog priority of ``level``, when ``stream`` is the journal; else ""."""
    return f"<{_PRIORITY[level]}>" if is_journal(stream) else ""


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def log(level: str, msg: str, **fields: object) -> None:
    """One line at ``level`` (debug, info, warning, error; ``warn`` is warning)."""
    key = "warning" if level == "warn" else level
    rank = _RANK.get(key, _RANK["info"])
    if rank < _threshold:
        return
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    parts = [f"ts={ts}", f"level={_WORD.get(key, level)}", f"msg={_quote(msg)}"]
    parts += [f"{k}={_quote(v)}" for k, v in fields.items() if v is not None]
    stream = _stream or sys.stderr
    prefix = f"<{_PRIORITY.get(key, 6)}>" if is_journal(stream) else ""
    print(prefix + " ".join(parts), file=stream, flush=True)


def debug(msg: str, **fields: object) -> None:
    log("debug", msg, **fields)


def info(msg: str, **fields: object) -> None:
    log("info", msg, **fields)


def warn(msg: str, **fields: object) -> None:
    log("warning", msg, **fields)


def error(msg: str, **fields: object) -> None:
    log("error", msg, **fields)
