"""Numbers and times a person or an agent types: parsed and range-checked in one place.

Every duration, time, budget and size given on the command line goes through here, so each is
finite and inside its documented range, or the command stops with an error naming the flag and
the range. A value that was given is never replaced by a default: ``float("nan")`` becomes an
error here, not JSON ``null`` that the daemon would fill from the profile.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

from daemon.errors import UsageError

#: The longest duration any flag takes: ten years. A deadline past it is a typo or an attempt
#: to stay live for ever; a profile may set a lower maximum still.
MAX_DURATION_SECONDS = 10 * 365 * 86400.0
#: Times before 2000 or after 2200 are not deadlines anybody means.
MIN_TIME = 946_684_800.0
MAX_TIME = 7_258_118_400.0
#: The longest text accepted where a number is expected (a 10 KB string is refused unread).
MAX_TEXT = 64

_AMOUNT = r"([0-9]+(?:\.[0-9]+)?)"
_DURATION = re.compile(rf"^(?:{_AMOUNT}d)?(?:{_AMOUNT}h)?(?:{_AMOUNT}m)?(?:{_AMOUNT}s)?$")
_NUMBER = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")
_INTEGER = re.compile(r"^[0-9]+$")


def parse_duration(
    text: str,
    flag: str,
    *,
    minimum: float = 0.0,
    maximum: float = MAX_DURATION_SECONDS,
    allow_zero: bool = False,
) -> float:
    """``90``, ``90s``, ``40m``, ``1h30m``, ``2d`` -> seconds, within [minimum, maximum].

    Only plain decimal digits are read: no sign, exponent, ``nan`` or ``inf`` (Python's
    ``float()`` takes all of those). Zero is refused unless ``allow_zero``.
    """
    t = text.strip()
    example = "examples: 90s, 40m, 1h30m, 2d"
    if len(t) > MAX_TEXT:
        raise UsageError(f"{flag}: {len(t)} characters is not a duration ({example})")
    if _NUMBER.match(t):
        seconds = float(t)
    else:
        m = _DURATION.match(t)
        if not t or not m or not any(m.groups()):
            raise UsageError(f"{flag} {text!r} is not a duration ({example})")
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    return check_range(
        seconds, flag, minimum=minimum, maximum=maximum, allow_zero=allow_zero, unit="s"
    )


def parse_time(text: str, flag: str, now: float) -> float:
    """An ISO-8601 time (UTC if no offset), or ``+DURATION`` from now -> POSIX seconds."""
    if len(text) > MAX_TEXT:
        raise UsageError(f"{flag}: {len(text)} characters is not a time")
    if text.startswith("+"):
        return now + parse_duration(text[1:], flag)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not a time (ISO-8601 like 2026-12-02T18:00:00Z, "
            f"or +DURATION like +2h)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return check_range(
        dt.timestamp(), flag, minimum=MIN_TIME, maximum=MAX_TIME, allow_zero=False, unit=""
    )


def parse_count(text: str, flag: str, *, minimum: int = 1, maximum: int = 1_000_000) -> int:
    """A whole number of requests, failures, items ... within [minimum, maximum]."""
    t = text.strip()
    if len(t) > MAX_TEXT or not _INTEGER.match(t):
        shown = repr(text) if len(text) <= MAX_TEXT else f"({len(text)} characters)"
        raise UsageError(f"{flag} {shown} is not a whole number from {minimum} to {maximum}")
    value = int(t)
    if not minimum <= value <= maximum:
        raise UsageError(f"{flag} {value} is out of range: from {minimum} to {maximum}")
    return value


def check_range(
    value: float,
    flag: str,
    *,
    minimum: float,
    maximum: float,
    allow_zero: bool = False,
    unit: str = "",
) -> float:
    """``value`` if finite and within [minimum, maximum] (and not zero unless allowed)."""
    if not math.isfinite(value):
        raise UsageError(f"{flag} must be a finite number, not {value}")
    if value == 0 and not allow_zero:
        raise UsageError(f"{flag} must be more than zero")
    if not minimum <= value <= maximum:
        raise UsageError(
            f"{flag} {value:g}{unit} is out of range: from {minimum:g}{unit} to {maximum:g}{unit}"
        )
    return value + 0.0  # -0.0 becomes 0.0


def count_arg(minimum: int = 1, maximum: int = 1_000_000) -> Callable[[str], int]:
    """An argparse ``type=`` for a count; argparse names the flag in its error."""

    def parse(text: str) -> int:
        try:
            return parse_count(text, "value", minimum=minimum, maximum=maximum)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value ")) from None

    return parse


def seconds_arg(
    minimum: float = 0.0, maximum: float = 3600.0, *, allow_zero: bool = False
) -> Callable[[str], float]:
    """An argparse ``type=`` for a duration (``10``, ``90s``, ``5m``)."""

    def parse(text: str) -> float:
        try:
            return parse_duration(
                text, "value", minimum=minimum, maximum=maximum, allow_zero=allow_zero
            )
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value ")) from None

    return parse


def until_of(args: argparse.Namespace) -> tuple[int | None, float | None]:
    """``--until``: a record number, or a time (RFC 3339 or relative) read as of now."""
    if not args.until:
        return None, None
    if args.until.isdigit():
        return int(args.until), None
    return None, parse_time(args.until, "--until", time.time())
