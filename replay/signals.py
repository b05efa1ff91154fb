"""Pure parsers for what a provider says: protocol headers, hints, JSON pointers, results.

Nothing here decides; each function turns text into a value or a :class:`Rejected` with a
reason that ``decide`` records (S8: a rejected hint is recorded, then ignored).

* ``Retry-After`` (RFC 9110 §10.2.3): ``delay-seconds`` (``1*DIGIT``) or an ``HTTP-date``
  (IMF-fixdate, and the obsolete RFC 850 and asctime forms a recipient must accept, RFC 9110
  §5.6.7). A date in the past means "no wait".
* IETF ``RateLimit`` / ``RateLimit-Policy`` (draft-ietf-httpapi-ratelimit-headers): the current
  form ``"name";r=REMAINING;t=RESET`` and ``"name";q=QUOTA;w=WINDOW``, and the older dictionary
  form ``limit=L, remaining=R, reset=T`` and ``QUOTA;w=WINDOW``. The pacing is the spacing that
  does not spend the advertised quota before its window resets: ``t`` with nothing remaining,
  else ``t / r``; from a policy alone, ``w / q``.
* A provider's own reset header (``x-ratelimit-reset``, :func:`parse_epoch_seconds`): POSIX
  (epoch) seconds as ``1*DIGIT``; no other form (not OpenAI's ``6m0s`` durations).
* Hint times: ISO-8601 with an offset (``2025-04-18T10:24:00Z``) or POSIX seconds.
* JSON pointers, RFC 6901.
* Provider bodies as JSON, bounded before they are decoded (:func:`parse_json`): nesting
  deeper than :data:`MAX_JSON_DEPTH` is refused without recursing into it, so a 4 KB body of
  2,000 brackets is an unparseable response, never a ``RecursionError``.
* URLs a provider names (:func:`check_provider_url`): parsed without raising, on the profile's
  origin, under its path prefix, with no dot segment that normalisation would remove.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, NamedTuple
from urllib.parse import unquote, urlsplit

import msgspec

if TYPE_CHECKING:  # the contract's module reads state with this one's pointers
    from replay.contract import ResultKind

__all__ = [
    "MAX_JSON_DEPTH",
    "Rejected",
    "check_provider_url",
    "parse_epoch_seconds",
    "parse_http_date",
    "parse_instant",
    "parse_json",
    "parse_ratelimit",
    "parse_ratelimit_policy",
    "parse_retry_after",
    "parse_seconds",
    "resolve_pointer",
    "validate_result",
]

_DIGITS: Final = re.compile(r"[0-9]+")
_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_TIME: Final = r"([0-9]{2}):([0-9]{2}):([0-9]{2})"
# RFC 9110 §5.6.7: IMF-fixdate, then the obsolete rfc850-date and asctime-date forms.
_IMF_FIXDATE: Final = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) ([A-Z][a-z]{2}) ([0-9]{4}) " + _TIME + " GMT"
)
_RFC850_DATE: Final = re.compile(
    r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    r"([0-9]{2})-([A-Z][a-z]{2})-([0-9]{2}) " + _TIME + " GMT"
)
_ASCTIME_DATE: Final = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) ([0-9 ][0-9]) " + _TIME + " ([0-9]{4})"
)
_INT: Final = re.compile(r"-?[0-9]{1,15}")
#: No real delay needs more digits; longer is absurd (and would not fit a float).
_MAX_DIGITS: Final = 12


class Rejected(NamedTuple):
    """A value that was not accepted, and why."""

    reason: str


def parse_retry_after(value: str, now: float) -> float | Rejected:
    """Parse ``Retry-After`` into the absolute time it asks to wait until (RFC 9110 §10.2.3).

    Args:
        value: The header value.
        now: When the response was received.

    Returns:
        POSIX seconds (never before ``now``), or a rejection.
    """
    text = value.strip()
    if _DIGITS.fullmatch(text):
        if len(text) > _MAX_DIGITS:
            return Rejected("delay-seconds absurdly large")
        return now + int(text)
    if text.startswith(("-", "+")) or text.replace(".", "", 1).isdigit():
        return Rejected("not delay-seconds (1*DIGIT) nor an HTTP-date")
    when = parse_http_date(text, now)
    if when is None:
        return Rejected("not delay-seconds (1*DIGIT) nor an HTTP-date")
    return max(now, when)


def parse_epoch_seconds(value: str) -> float | Rejected:
    """Parse a reset header given as POSIX (epoch) seconds, ``1*DIGIT`` (GitHub's
    ``x-ratelimit-reset``).

    Args:
        value: The header value.

    Returns:
        POSIX seconds, or a rejection.
    """
    text = value.strip()
    if not _DIGITS.fullmatch(text):
        return Rejected("not epoch seconds (1*DIGIT)")
    if len(text) > _MAX_DIGITS:
        return Rejected("epoch seconds absurdly large")
    return float(int(text))


def parse_http_date(text: str, now: float) -> float | None:
    """Parse an HTTP-date in any of its three forms (RFC 9110 §5.6.7), always GMT.

    Args:
        text: The date.
        now: The current time, to place a two-digit rfc850 year (RFC 9110 §5.6.7: a year more
            than 50 years in the future is the most recent past year with those digits).

    Returns:
        POSIX seconds, or ``None`` if it is not an HTTP-date.
    """
    if match := _IMF_FIXDATE.fullmatch(text):
        day, month, year, hh, mm, ss = match.groups()
        full_year = int(year)
    elif match := _RFC850_DATE.fullmatch(text):
        day, month, year, hh, mm, ss = match.groups()
        this_year = datetime.fromtimestamp(max(0.0, now), tz=UTC).year
        full_year = this_year - this_year % 100 + int(year)
        if full_year > this_year + 50:
            full_year -= 100
    elif match := _ASCTIME_DATE.fullmatch(text):
        month, day, hh, mm, ss, year = match.groups()
        full_year = int(year)
    else:
        return None
    if month not in _MONTHS:
        return None
    try:
        when = datetime(full_year, _MONTHS[month], int(day), int(hh), int(mm), int(ss), tzinfo=UTC)
    except ValueError:
        return None
    return when.timestamp()


def parse_instant(value: object) -> float | Rejected:
    """Parse a hint time: ISO-8601 with an offset, or POSIX seconds (not a bool).

    Args:
        value: The JSON value.

    Returns:
        POSIX seconds, or a rejection.
    """
    if isinstance(value, bool):
        return Rejected("a boolean is not a time")
    if isinstance(value, int | float):
        number = _as_float(value)
        if not math.isfinite(number) or number < 0:
            return Rejected("not a finite, non-negative POSIX time")
        return number
    if not isinstance(value, str):
        return Rejected("not a string or a number")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return Rejected("not an ISO-8601 time")
    if when.tzinfo is None:
        return Rejected("ISO-8601 time without an offset is ambiguous")
    return when.timestamp()


def parse_seconds(value: object) -> float | Rejected:
    """Parse a relative hint in seconds: a JSON number or a decimal string.

    Args:
        value: The JSON value.

    Returns:
        Seconds (possibly negative: the caller rejects those with its own reason), or a
        rejection.
    """
    if isinstance(value, bool):
        return Rejected("a boolean is not a number of seconds")
    if isinstance(value, int | float):
        number = _as_float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}(\.[0-9]{1,9})?", value.strip()):
        number = float(value.strip())
    else:
        return Rejected("not a number of seconds")
    if not math.isfinite(number):
        return Rejected("not a finite number of seconds")
    return number


def _as_float(value: int | float) -> float:
    """A JSON number as a float; an integer beyond a float's range (JSON integers have no
    bound) becomes an infinity of its sign, which the callers refuse as not finite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


#: The deepest nesting of a provider's JSON body that is decoded. Status documents are a few
#: levels deep; thousands of brackets in a small body are an attack on the decoder's stack.
MAX_JSON_DEPTH: Final = 64
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET: Final = re.compile(rb"[\[\]{}]")


def parse_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> tuple[bool, object]:
    """``(True, document)``, or ``(False, reason)`` for a body that is not JSON or nests
    deeper than ``max_depth``. Never raises: what a provider sends is data, not a crash.

    The depth is measured before decoding, with the strings blanked out, and only when the
    body holds more brackets than ``max_depth`` (the common case costs two C-level counts).
    """
    if body.count(b"[") + body.count(b"{") > max_depth:
        depth = deepest = 0
        for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
            depth += 1 if bracket.group() in (b"[", b"{") else -1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                return False, f"the JSON nests deeper than {max_depth} levels"
    try:
        return True, msgspec.json.decode(body)
    except msgspec.DecodeError:
        return False, "the body is not JSON"
    except (RecursionError, MemoryError, ValueError):
        return False, "the body is JSON too deep or too large to decode"


def check_provider_url(url: str, origin: str, path_prefix: str) -> str | None:
    """Why a URL a provider named may not be called with bide's credential, or None if it may.

    It must parse (a bad port, IPv6 literal or host is a reason, not an exception), be on
    ``origin`` (``scheme://host:port``), have a path under ``path_prefix``, and hold no dot
    segment, raw or percent-encoded, that URL normalisation would remove (RFC 3986 §5.2.4),
    nor whitespace, control characters or a backslash.
    """
    if any(ord(ch) < 0x21 or ch in "\\\x7f" for ch in url):
        return "the URL holds whitespace, a control character or a backslash"
    try:
        parts = urlsplit(url)
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, 0)
        host = (parts.hostname or "").lower()
    except ValueError as exc:
        return f"the URL does not parse ({exc})"
    if not host:
        return "the URL names no host"
    found = f"{parts.scheme}://{host}:{port}"
    if found != origin:
        return f"{found} is not the provider's origin {origin}"
    # A segment that is, or percent-decodes to, "." or ".." is removed by normalisation; an
    # encoded "/" inside a segment is not a separator (the job id's encoding relies on that).
    if any(unquote(segment) in (".", "..") for segment in parts.path.split("/")):
        return "the URL's path has a dot segment"
    if not parts.path.startswith(path_prefix):
        return f"the path {parts.path[:200]!r} is not under the profile's prefix {path_prefix!r}"
    return None


def resolve_pointer(document: object, pointer: str) -> tuple[bool, object]:
    """Resolve an RFC 6901 JSON pointer.

    Args:
        document: A decoded JSON document.
        pointer: The pointer ("" is the whole document).

    Returns:
        ``(True, value)`` if found, else ``(False, None)``.
    """
    if pointer == "":
        return True, document
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            if token not in current:
                return False, None
            current = current[token]
        elif isinstance(current, list):
            if not re.fullmatch(r"0|[1-9][0-9]{0,9}", token) or int(token) >= len(current):
                return False, None
            current = current[int(token)]
        else:
            return False, None
    return True, current


def validate_result(kind: ResultKind, value: object) -> str | None:
    """Validate a result field (S14).

    Args:
        kind: How to validate.
        value: The JSON value found.

    Returns:
        ``None`` if valid, else the reason it is not.
    """
    if value is None:
        return "is null"
    if kind == "present":
        return None
    if not isinstance(value, str):
        return "is not a string"
    if kind == "non_empty":
        return None if value.strip() else "is empty"
    if len(value) > 8192 or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "is not a well-formed URL"
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        return "is not a well-formed URL"
    schemes = ("https",) if kind == "https_url" else ("https", "http")
    if parts.scheme not in schemes:
        return f"is not an absolute {' or '.join(schemes)} URL"
    if not host:
        return "has no host"
    return None


# --- RateLimit headers ---------------------------------------------------------------------------


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\" and quoted:
            current.append(char)
            escaped = True
        elif char == '"':
            quoted = not quoted
            current.append(char)
        elif char == separator and not quoted:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if quoted:
        raise ValueError("unterminated string")
    parts.append("".join(current).strip())
    return parts


class _Member(NamedTuple):
    item: str
    params: dict[str, str]


def _members(value: str) -> list[_Member]:
    """A structured-field list (RFC 9651), loosely: members of ``item;key=value;...``."""
    members: list[_Member] = []
    for raw in _split_outside_quotes(value, ","):
        if not raw:
            raise ValueError("empty list member")
        pieces = _split_outside_quotes(raw, ";")
        params: dict[str, str] = {}
        for piece in pieces[1:]:
            key, sep, val = piece.partition("=")
            key = key.strip()
            if not re.fullmatch(r"[a-z*][a-z0-9_.*-]*", key):
                raise ValueError("bad parameter key")
            params[key] = val.strip() if sep else "?1"
        members.append(_Member(pieces[0], params))
    return members


def _non_negative_int(text: str | None, name: str) -> int:
    if text is None or not _INT.fullmatch(text):
        raise ValueError(f"{name} is not an integer")
    number = int(text)
    if number < 0:
        raise ValueError(f"{name} is negative")
    return number


def parse_ratelimit(value: str) -> float | Rejected | None:
    """Pacing from a ``RateLimit`` header: the seconds to leave before the next request.

    Args:
        value: The header value.

    Returns:
        The pacing in seconds, ``None`` if the header gives no reset time, or a rejection.
    """
    try:
        members = _members(value)
        dictionary = all(
            m.item.partition("=")[0].strip() in ("limit", "remaining", "reset") and "=" in m.item
            for m in members
        )
        pacing: float | None = None
        if dictionary:  # older drafts: limit=L, remaining=R, reset=T
            fields = {
                m.item.partition("=")[0].strip(): m.item.partition("=")[2].strip() for m in members
            }
            pairs = [(fields.get("remaining"), fields.get("reset"))]
        else:  # "name";r=R;t=T
            pairs = [(m.params.get("r"), m.params.get("t")) for m in members]
        for remaining_text, reset_text in pairs:
            remaining = _non_negative_int(remaining_text, "remaining (r)")
            if reset_text is None:
                continue
            reset = _non_negative_int(reset_text, "reset (t)")
            wait = float(reset) if remaining == 0 else reset / remaining
            pacing = wait if pacing is None else max(pacing, wait)
    except ValueError as exc:
        return Rejected(f"malformed RateLimit: {exc}")
    return pacing


def parse_ratelimit_policy(value: str) -> float | Rejected | None:
    """Pacing from a ``RateLimit-Policy`` header: the window divided by the quota.

    Args:
        value: The header value.

    Returns:
        The pacing in seconds, ``None`` if no policy names a window, or a rejection.
    """
    try:
        pacing: float | None = None
        for member in _members(value):
            quota_text = member.params.get("q")
            if quota_text is None and _INT.fullmatch(member.item):
                quota_text = member.item  # older drafts: QUOTA;w=WINDOW
            quota = _non_negative_int(quota_text, "quota (q)")
            if quota == 0:
                raise ValueError("quota (q) is zero")
            window_text = member.params.get("w")
            if window_text is None:
                continue
            wait = _non_negative_int(window_text, "window (w)") / quota
            pacing = wait if pacing is None else max(pacing, wait)
    except ValueError as exc:
        return Rejected(f"malformed RateLimit-Policy: {exc}")
    return pacing
