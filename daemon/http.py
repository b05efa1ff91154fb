"""The HTTP shell: one status request in, one recorded fact out.

``StatusClient.fetch`` sends exactly one request and turns whatever happens into an event the
model reads: a :class:`StatusResponseReceived` for any HTTP answer (a status code is data; the
poller never raises for status) or a :class:`TransportFailed` naming how delivery failed.
Foreign errors are translated here, at the boundary (STYLE.md §5):

    never delivered:    connect_refused, dns, tls, connect_timeout, pool_timeout
    delivery ambiguous: read_timeout, write_timeout, connection_reset, protocol_error

Every request is one counted request: no transport retries, no redirects followed (a 3xx is
recorded like any status the contract does not explain, so a credential never crosses to
another origin), ``trust_env`` off (no proxy or netrc from the environment, no SSLKEYLOGFILE),
``Accept-Encoding: identity`` and a streamed body read up to a cap (a gzip bomb or an endless
body is cut, recorded as truncated, never held in memory).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import anyio
import certifi
import httpx

from daemon.profile import Profile
from replay.events import ResponseHeaders, StatusResponseReceived, TransportFailed, TransportKind

USER_AGENT = "bide/0.1 (+status polling under a contract)"
HEADER_CAP = 512  # bytes kept of any recorded header value
MIN_TIMEOUT = 0.05


def tls_context() -> ssl.SSLContext:
    """Verification on, certifi's roots, and no key log whatever the environment says."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class CredentialError(Exception):
    """A credential file is missing or unreadable; the message names the file, not its value."""


def read_credential(profile: Profile, directory: Path | None) -> tuple[str, str] | None:
    """(header, value) for the profile's credential, read now (rotation needs no restart)."""
    ref = profile.credential
    if ref is None:
        return None
    if directory is None:
        raise CredentialError(
            f"profile {profile.name} names credential file {ref.file} but neither [paths] "
            f"credentials_dir nor $CREDENTIALS_DIRECTORY is set"
        )
    path = directory / ref.file
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise CredentialError(f"credential file {path} for provider {profile.name}: {reason}"
                              ) from None
    if not secret or "\n" in secret or "\r" in secret:
        raise CredentialError(f"credential file {path} must hold one non-empty line")
    value = f"{ref.scheme} {secret}" if ref.scheme else secret
    return ref.header, value


class StatusClient:
    """One provider's HTTP client. Rebuilt after a pool timeout (httpcore slot leak)."""

    def __init__(self, profile: Profile, credentials_dir: Path | None) -> None:
        self.profile = profile
        self._credentials_dir = credentials_dir
        self._tls = tls_context()
        self._client = self._build()

    def _build(self) -> httpx.AsyncClient:
        limit = self.profile.quota.max_in_flight
        return httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            verify=self._tls,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            headers={"User-Agent": USER_AGENT},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def rebuild(self) -> None:
        old, self._client = self._client, self._build()
        with anyio.CancelScope(shield=True):
            await old.aclose()

    def check_credential(self) -> None:
        """Raise :class:`CredentialError` if the credential cannot be read right now."""
        read_credential(self.profile, self._credentials_dir)

    async def fetch(
        self, *, operation_id: str, job_id: str, request_number: int, time_left: float,
        clock: Callable[[], float],
    ) -> StatusResponseReceived | TransportFailed:
        """Send the one status request; the fact is stamped with ``clock()`` when it ends."""
        status = self.profile.status
        budget = max(MIN_TIMEOUT, min(status.timeout_seconds, time_left))
        timeout = httpx.Timeout(budget)
        headers = {"Accept": "application/json", "Accept-Encoding": "identity",
                   **status.headers}
        try:
            credential = read_credential(self.profile, self._credentials_dir)
        except CredentialError as exc:
            return TransportFailed(operation_id=operation_id, at=clock(),
                                   request_number=request_number, kind="connect_refused",
                                   detail=f"not sent: {exc}")
        if credential is not None:
            headers[credential[0]] = credential[1]
        url = self.profile.status_url(job_id)

        def failed(kind: TransportKind, detail: str) -> TransportFailed:
            return TransportFailed(operation_id=operation_id, at=clock(),
                                   request_number=request_number, kind=kind,
                                   detail=detail[:HEADER_CAP])

        try:
            async with self._client.stream(status.method, url, headers=headers,
                                           timeout=timeout) as resp:
                body, truncated, complete = await self._read_capped(resp, budget)
                if not complete:
                    return failed("read_timeout",
                                  f"body not complete within {budget:.3g}s (slow response)")
                return StatusResponseReceived(
                    operation_id=operation_id, at=clock(), request_number=request_number,
                    status_code=resp.status_code, headers=_headers(resp, status.request_id_header),
                    body=body, body_truncated=truncated)
        except httpx.PoolTimeout:
            await self.rebuild()
            return failed("pool_timeout", "no connection slot free in time; client rebuilt")
        except httpx.ConnectTimeout:
            return failed("connect_timeout", f"no connection within {budget:.3g}s")
        except httpx.ConnectError as exc:
            return failed(*_connect_kind(exc))
        except httpx.ReadTimeout:
            return failed("read_timeout", f"no response within {budget:.3g}s")
        except httpx.WriteTimeout:
            return failed("write_timeout", f"request not sent within {budget:.3g}s")
        except (httpx.ReadError, httpx.WriteError, httpx.CloseError):
            return failed("connection_reset", "connection reset by the provider")
        except httpx.RemoteProtocolError as exc:
            text = str(exc)
            if "disconnected" in text or "closed" in text:
                return failed("connection_reset", "provider closed the connection without "
                                                  "a complete response")
            return failed("protocol_error", f"malformed HTTP from the provider: {text[:200]}")
        except httpx.HTTPError as exc:
            return failed("protocol_error", f"{type(exc).__name__}: {str(exc)[:200]}")

    async def _read_capped(
        self, resp: httpx.Response, budget: float
    ) -> tuple[bytes, bool, bool]:
        """(body, truncated, complete): at most the cap, and no longer than ``budget`` overall."""
        cap = self.profile.status.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        truncated = False
        with anyio.move_on_after(budget) as scope:
            async for chunk in resp.aiter_raw():
                room = cap - size
                if len(chunk) > room:
                    chunks.append(chunk[:room])
                    truncated = True
                    break
                chunks.append(chunk)
                size += len(chunk)
        if scope.cancelled_caught:
            await self.rebuild()  # a cancelled read may leave the pool slot behind
            return b"", False, False
        return b"".join(chunks), truncated, True


def _headers(resp: httpx.Response, request_id_header: str) -> ResponseHeaders:
    def get(name: str) -> str | None:
        value = resp.headers.get(name)
        return value[:HEADER_CAP] if value is not None else None

    return ResponseHeaders(
        retry_after=get("retry-after"),
        ratelimit=get("ratelimit"),
        ratelimit_policy=get("ratelimit-policy"),
        request_id=get(request_id_header),
        location=get("location"),
        content_type=get("content-type"),
    )


def _connect_kind(exc: httpx.ConnectError) -> tuple[TransportKind, str]:
    cause = exc.__cause__ or exc.__context__
    text = str(exc)
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return "tls", f"TLS handshake failed: {type(cause).__name__}"
        cause = cause.__cause__ or cause.__context__
    lowered = text.lower()
    if "name or service" in lowered or "name resolution" in lowered or "nodename" in lowered:
        return "dns", "the provider's host name did not resolve"
    if "certificate" in lowered or "ssl" in lowered:
        return "tls", "TLS handshake failed"
    return "connect_refused", "connection refused or unreachable"
