"""What the simulated provider received: one record per request, secrets redacted.

Records are appended from the simulator's event loop and read from any thread (tests read
them while the simulator runs in a background thread), so the log is guarded by a lock and
waiters are woken through a condition variable instead of sleeping. With a path, every
record is also appended to a JSON-lines file and flushed, so a test driving a daemon
subprocess can read what the provider saw.

Redaction happens before a record exists: credential-carrying headers are replaced by
``<redacted>``, secret-looking query parameters too, and the configured bearer token is
scrubbed from every logged string wherever it appears.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Final
from urllib.parse import parse_qsl, quote

import msgspec

__all__ = [
    "REDACTED",
    "RequestLog",
    "RequestRecord",
    "read_request_log",
    "redact_headers",
    "redact_target",
]

REDACTED: Final = "<redacted>"

_SECRET_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "apikey",
        "x-auth-token",
        "x-access-token",
        "x-amz-security-token",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
    }
)
# Anything that looks like it carries a credential; Idempotency-Key does not match.
_SECRET_PATTERN: Final = re.compile(
    r"auth|token|secret|passw|api[-_]?key|credential|session|signature|^sig$|^key$",
    re.IGNORECASE,
)


def _is_secret(name: str) -> bool:
    return name.lower() in _SECRET_HEADERS or _SECRET_PATTERN.search(name) is not None


def _scrub(value: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            value = value.replace(secret, REDACTED)
    return value


def redact_headers(
    headers: Iterable[tuple[str, str]], secrets: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """Headers as logged: credential headers replaced, known secrets scrubbed everywhere."""
    return [
        (name, REDACTED if _is_secret(name) else _scrub(value, secrets)) for name, value in headers
    ]


def redact_target(target: str, secrets: Sequence[str] = ()) -> str:
    """A request target as logged: secret-looking query values replaced."""
    path, sep, query = target.partition("?")
    if sep:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(k, safe='')}={REDACTED if _is_secret(k) else quote(v, safe='')}"
            for k, v in pairs
        )
    return _scrub(path + sep + query, secrets)


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the provider received it.

    Attributes:
        seq: 1-based arrival order; the ``X-Request-Id`` sent back is ``sim-{seq}``.
        wall: POSIX seconds when the request head had arrived.
        monotonic: ``time.monotonic()`` at the same moment (same process only).
        method: the request method.
        target: the raw request target (percent-encoding kept), secrets redacted.
        headers: every request header in order, secrets redacted.
        kind: ``status``, ``submit``, ``cancel``, ``result``, ``admin``, ``path_escape``,
            ``not_found`` or ``bad_request``.
        job_id: the percent-decoded job id the request named (or created), if any.
        step: index in the job's script ``steps`` of the step that answered a status call.
        step_label: that step's state, fault or status, or ``canceled``.
        call: the job's status-call number (1-based; counts GET and HEAD that reached it).
        status: the HTTP status answered; ``None`` when the connection was reset or closed.
        fault: ``reset`` or ``close`` when no response was sent.
        delay: seconds the answer was held back.
    """

    seq: int
    wall: float
    monotonic: float
    method: str
    target: str
    headers: list[tuple[str, str]]
    kind: str
    job_id: str | None = None
    step: int | None = None
    step_label: str | None = None
    call: int | None = None
    status: int | None = None
    fault: str | None = None
    delay: float = 0.0

    def header(self, name: str) -> str | None:
        """The first value of a header (case-insensitive), or None."""
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


_encoder: Final = msgspec.json.Encoder()


class RequestLog:
    """A thread-safe, append-only list of :class:`RequestRecord`, optionally mirrored to a file.

    Args:
        path: if given, each record is appended to this file as one JSON line and flushed.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self._records: list[RequestRecord] = []
        self._changed = threading.Condition()
        self._path = Path(path) if path is not None else None
        self._file: IO[bytes] | None = None

    def open(self) -> None:
        """Open the mirror file (append mode); a no-op without a path.

        Raises:
            OSError: the file cannot be opened.
        """
        if self._path is not None and self._file is None:
            self._file = self._path.open("ab")

    def close(self) -> None:
        """Close the mirror file, if open."""
        with self._changed:
            if self._file is not None:
                self._file.close()
                self._file = None

    def append(self, record: RequestRecord) -> None:
        """Add a record, mirror it to the file, and wake any waiters."""
        with self._changed:
            self._records.append(record)
            if self._file is not None:
                self._file.write(_encoder.encode(record) + b"\n")
                self._file.flush()
            self._changed.notify_all()

    def snapshot(self) -> list[RequestRecord]:
        """Every record so far, in arrival order."""
        with self._changed:
            return list(self._records)

    def __len__(self) -> int:
        with self._changed:
            return len(self._records)

    def encode(self) -> bytes:
        """Every record so far as a JSON array."""
        return _encoder.encode(self.snapshot())

    def wait_for(
        self, predicate: Callable[[list[RequestRecord]], bool], timeout: float
    ) -> list[RequestRecord]:
        """Block (a thread, never the simulator's event loop) until ``predicate(records)``.

        Returns:
            The records that satisfied the predicate.

        Raises:
            TimeoutError: the predicate did not hold within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(list(self._records)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"simulator log: condition not met within {timeout} s "
                        f"({len(self._records)} requests logged)"
                    )
                self._changed.wait(remaining)
            return list(self._records)


def read_request_log(path: str | Path) -> list[RequestRecord]:
    """Read a JSON-lines request log written by a simulator.

    A torn last line (the simulator was killed mid-write) is skipped.

    Raises:
        msgspec.DecodeError: a line other than the last does not decode.
        OSError: the file cannot be read.
    """
    records: list[RequestRecord] = []
    decoder = msgspec.json.Decoder(RequestRecord)
    lines = Path(path).read_bytes().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            records.append(decoder.decode(line))
        except msgspec.DecodeError:
            if number < len(lines):
                raise
    return records
