"""Structured log lines (logfmt), one per line on stderr: journald-friendly and grep-able.

Only ids, counts, reasons and times go in; credentials and payloads never do.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_stream: TextIO | None = None  # None: whatever sys.stderr is at the time


def set_stream(stream: TextIO | None) -> None:
    """Send log lines elsewhere (the demo keeps them in a file beside its log)."""
    global _stream
    _stream = stream


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def log(level: str, msg: str, **fields: object) -> None:
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    parts = [f"ts={ts}", f"level={level}", f"msg={_quote(msg)}"]
    parts += [f"{k}={_quote(v)}" for k, v in fields.items() if v is not None]
    print(" ".join(parts), file=_stream or sys.stderr, flush=True)


def info(msg: str, **fields: object) -> None:
    log("info", msg, **fields)


def warn(msg: str, **fields: object) -> None:
    log("warn", msg, **fields)


def error(msg: str, **fields: object) -> None:
    log("error", msg, **fields)
