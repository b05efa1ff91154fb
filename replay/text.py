"""How the model writes values into the text of its events: times, capped strings, JSON.

Shared by :mod:`replay.reading` (what a response said) and :mod:`replay.decide` (what is
done about it), so neither needs the other for its wording.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

import msgspec

__all__ = ["HINT_VALUE_CAP", "cap", "cap_bytes", "format_time", "json_text"]

#: The most characters of a provider's value kept in a ``HintRejected`` (and the default cap).
HINT_VALUE_CAP: Final = 200


def format_time(t: float) -> str:
    """Format POSIX seconds as ISO-8601 UTC (``2025-04-18T10:20:05Z``; milliseconds if any).

    Args:
        t: POSIX seconds.

    Returns:
        The ISO-8601 text, or ``repr(t)`` if the time is outside the calendar.
    """
    try:
        when = datetime.fromtimestamp(t, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return repr(t)
    spec = "seconds" if when.microsecond == 0 else "milliseconds"
    return when.isoformat(timespec=spec).replace("+00:00", "Z")


def cap(text: str, limit: int = HINT_VALUE_CAP) -> str:
    """``text`` cut to at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit]


def cap_bytes(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (never inside a character), and
    whether it was cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", errors="ignore"), True


def json_text(value: object) -> str:
    """A decoded JSON value as JSON text again (how a non-string value is recorded)."""
    return msgspec.json.encode(value).decode("utf-8", errors="replace")
