"""The HTTP shell: one status request in, one recorded fact out.

``StatusClient.fetch`` sends exactly one request and turns whatever happens into an event the
model reads: a :class:`StatusResponseReceived` for any HTTP answer (a status code is data; the
poller never raises for status) or a :class:`TransportFailed` naming how delivery failed.
Foreign errors are translated here, at the boundary (STYLE.md §5):

    never delivered:    connect_refused, dns, tls, connect_timeout, pool_timeout, not_sent
    delivery ambiguous: read_timeout, write_timeout, connection_reset, protocol_error

``not_sent`` is a request refused before it left: a URL that does not parse or is not the
provider's own, a header value the HTTP layer will not send, or a caller's ``gate`` (the lease)
that no longer allows it as its first byte is to be written (:func:`daemon.connections.gated`:
after the credential command, the pool's slot and the connection, whatever they took).
Whatever a provider or an agent put into a request, it becomes a recorded failure, never an
exception out of the poll; and no error text that could quote a request header (the
credential) is ever recorded. A status code outside 100-599 is a protocol error, not a
response.

Every request is one counted request: no transport retries, no redirects followed (a 3xx is
recorded like any status the contract does not explain, so a credential never crosses to
another origin), ``trust_env`` off (no proxy or netrc from the environment, no SSLKEYLOGFILE),
``Accept-Encoding: identity`` and a streamed body read up to a cap (a gzip bomb or an endless
body is cut, recorded as truncated, never held in memory), and no cookies.

Requests go straight to httpx's transport (``AsyncHTTPTransport``, its public interface for
custom transports), not through ``AsyncClient``: everything the client layer adds is what bide
turns off (redirects, the auth flow and credentials taken from a URL's userinfo, the cookie
jar, proxies from the environment), and walking through it cost 100-200 µs of CPU per request
on the benchmark machine (``python -m tests.bench --only http``).
So those guarantees hold by construction, not by configuration.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import certifi
import httpx

from daemon import connections
from daemon.awssign import Signer, SigningError
from daemon.credentials import CommandCredential
from daemon.profile import Profile
from daemon.recent import RecentResults
from daemon.secretfiles import CredentialError, read_private_file
from replay.actions import origin
from replay.events import ResponseHeaders, StatusResponseReceived, TransportFailed, TransportKind
from replay.signals import check_provider_url

USER_AGENT = "bide/0.1 (+status polling under a contract)"
HEADER_CAP = 512  # bytes kept of any recorded header value
MIN_TIMEOUT = 0.05
CREDENTIAL_MAX_AGE = 1.0  # seconds a credential read is reused while its file looks unchanged
URL_CHECKS_KEPT = 16_384  # status URLs whose parse is remembered at most, per generation
URL_CHECKS_SECONDS = 30.0  # a URL's parse is let go 30-60 s after its last request


def _check_url(key: tuple[str, str, str]) -> str | None:
    return check_provider_url(*key)


#: :func:`check_provider_url` by (URL, provider origin, path prefix), and each URL's origin,
#: remembered while the URL is in use: an operation's status URL is the same at every poll,
#: and parsing it twice per request (here and for its origin) cost about 15 µs; let go once
#: its operation stops being polled, so retired operations leave nothing here (issue 38).
_url_refused: RecentResults[tuple[str, str, str], str | None] = RecentResults(
    _check_url, seconds=URL_CHECKS_SECONDS, most=URL_CHECKS_KEPT
)
_origins: RecentResults[str, str] = RecentResults(
    origin, seconds=URL_CHECKS_SECONDS, most=URL_CHECKS_KEPT
)


def _origin_of(url: str) -> str:
    return _origins.get(url)


def tls_context() -> ssl.SSLContext:
    """Verification on, certifi's roots, and no key log whatever the environment says."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


__all__ = ["CredentialError", "StatusClient", "read_credential"]


def read_credential(profile: Profile, directory: Path | None) -> tuple[str, str] | None:
    """(header, value) for the profile's credential, read now (rotation needs no restart).

    The file must be readable by its owner only, and hold one line of printable ASCII (it
    becomes a header value); errors name the file and what is wrong, never its bytes.
    """
    ref = profile.credential
    if ref is None or ref.file is None:
        return None
    if directory is None:
        raise CredentialError(
            f"profile {profile.name} names credential file {ref.file} but neither [paths] "
            f"credentials_dir nor $CREDENTIALS_DIRECTORY is set"
        )
    path = directory / ref.file
    raw = read_private_file(path, "credential file", profile.name)
    secret = raw.strip(b" \t\r\n")
    if not secret or b"\n" in secret or b"\r" in secret:
        raise CredentialError(f"credential file {path} must hold one non-empty line")
    bad = next((i for i, byte in enumerate(secret) if not 0x20 <= byte <= 0x7E), None)
    if bad is not None:
        raise CredentialError(
            f"credential file {path} for provider {profile.name} holds a byte that cannot be "
            f"sent in a header (a control character or non-ASCII, at offset {bad}); write the "
            f"token as printable ASCII"
        )
    value = f"{ref.scheme} {secret.decode('ascii')}" if ref.scheme else secret.decode("ascii")
    return ref.header, value


class StatusClient:
    """One provider's HTTP client: its connection pool, rebuilt after a pool timeout (httpcore
    slot leak)."""

    def __init__(self, profile: Profile, credentials_dir: Path | None) -> None:
        self.profile = profile
        self._credentials_dir = credentials_dir
        self._tls = tls_context()
        self._unwired: set[httpx.AsyncHTTPTransport] = set()
        self._transport = self._build()
        # Requests in flight per transport: one retired by ``rebuild`` is closed only once its
        # last request is done, so one operation's slow provider never cuts off another's.
        self._users: dict[httpx.AsyncHTTPTransport, int] = {}
        self._retired: set[httpx.AsyncHTTPTransport] = set()
        self._credential_seen: tuple[tuple[float, ...], tuple[str, str] | None] | None = None
        self._signer = (
            Signer(profile.aws, credentials_dir, profile.name) if profile.aws is not None else None
        )
        ref = profile.credential
        self._credential_file = (
            os.fspath(credentials_dir / ref.file)
            if ref is not None and ref.file is not None and credentials_dir is not None
            else None
        )
        self._command = (
            CommandCredential(profile.name, ref) if ref is not None and ref.command else None
        )

    def _build(self) -> httpx.AsyncHTTPTransport:
        limit = self.profile.quota.max_in_flight
        transport = httpx.AsyncHTTPTransport(
            verify=self._tls,
            trust_env=False,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            retries=0,
        )
        if not connections.install(transport):
            self._unwired.add(transport)  # no stream of ours: the gate is checked before it
        return transport

    async def aclose(self) -> None:
        for transport in (*self._retired, self._transport):
            await transport.aclose()
        self._retired.clear()

    async def rebuild(self) -> None:
        """A fresh connection pool for the next requests; the old one closes when its last
        request ends."""
        old, self._transport = self._transport, self._build()
        self._retired.add(old)
        await self._release(old, 0)

    async def _release(self, transport: httpx.AsyncHTTPTransport, done: int) -> None:
        users = self._users.get(transport, 0) - done
        if users > 0:
            self._users[transport] = users
            return
        self._users.pop(transport, None)
        if transport in self._retired:
            self._retired.discard(transport)
            self._unwired.discard(transport)
            with anyio.CancelScope(shield=True):
                await transport.aclose()

    def check_credential(self) -> None:
        """Raise :class:`CredentialError` if the credential file (or the AWS signing keys)
        cannot be read right now. (A credential command's failure is the request's: a
        recorded transport failure.)"""
        if self._command is None:
            self._credential()
        if self._signer is not None:
            try:
                self._signer.check()
            except SigningError as exc:
                raise CredentialError(str(exc)) from None

    def _credential(self) -> tuple[str, str] | None:
        """The credential as the file holds it now. The file is read again whenever a stat
        of it differs from the last read (rotated, rewritten, replaced, removed), and at least
        every ``CREDENTIAL_MAX_AGE`` seconds (a same-size rewrite within one timestamp tick of
        a coarse file system): the stat is one system call, where reading the file on every
        request cost about 0.1 ms."""
        if self._credential_file is None:
            return read_credential(self.profile, self._credentials_dir)
        try:
            st = os.stat(self._credential_file)
        except OSError:
            self._credential_seen = None
            return read_credential(self.profile, self._credentials_dir)  # names the problem
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        now = time.monotonic()
        seen = self._credential_seen
        if seen is not None and seen[0][:-1] == key and now - seen[0][-1] < CREDENTIAL_MAX_AGE:
            return seen[1]
        value = read_credential(self.profile, self._credentials_dir)
        self._credential_seen = ((*key, now), value)
        return value

    async def _credential_for(self, url_origin: str, budget: float) -> tuple[str, str] | None:
        """The credential for a call to ``url_origin``: only the provider's own origin gets
        one; a credential command runs (or its cached token is used) within ``budget``."""
        ref = self.profile.credential
        if url_origin != self.profile.origin or ref is None:
            return None
        if self._command is None:
            return self._credential()
        token = await self._command.token(budget)
        return ref.header, f"{ref.scheme} {token}" if ref.scheme else token

    def _request_headers(
        self, extra: dict[str, str] | None, credential: tuple[str, str] | None
    ) -> dict[str, str]:
        """Headers for one call, with ``credential`` (see :meth:`_credential_for`)."""
        headers = {
            "User-Agent": USER_AGENT,
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            **self.profile.status.headers,
            **(extra or {}),
        }
        if credential is not None:
            headers[credential[0]] = credential[1]
        return headers

    async def call(
        self,
        method: str,
        url: str,
        *,
        seconds: float,
        cap: int,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        sink: Callable[[bytes], None] | None = None,
        gate: Callable[[float], bool] | None = None,
    ) -> Answer | NoAnswer:
        """Make exactly one request. With ``sink`` the body goes there instead of memory.

        ``gate(seconds)`` is asked as the request's first byte is to be written, with the
        seconds the exchange may still take: False and the request is not sent
        (``not_sent``). The lease passes its gate here, so a request whose node lost the
        lease while it waited for its credential, its connection or its pool slot never
        leaves.

        ``seconds`` bounds the whole exchange. It is handed to httpx as its timeouts, so httpx
        usually gives up by itself; but those bound each socket operation, and a provider that
        trickles a byte at a time (slowloris, in the head or the body) never trips them, so the
        exchange also runs under one overall deadline. When that deadline cancels it, the
        connection pool is rebuilt (a cancelled request may leave its httpcore pool slot
        behind); the old one closes once the requests still using it are done.
        """
        budget = max(MIN_TIMEOUT, seconds)
        url_origin = _origin_of(url)
        if not url_origin:
            return NoAnswer("not_sent", "not sent: the URL does not parse")
        started = time.monotonic()
        try:
            credential = await self._credential_for(url_origin, budget)
            request_headers = self._request_headers(headers, credential)
            if self._signer is not None and url_origin == self.profile.origin:
                # SigV4 over exactly what is sent (daemon/awssign.py), timestamped now.
                request_headers = self._signer.sign(method, url, request_headers, body)
        except (CredentialError, SigningError) as exc:
            return NoAnswer("not_sent", f"not sent: {exc}")
        # A credential command's run counts in the call's time: one call stays within budget.
        budget = max(MIN_TIMEOUT, budget - (time.monotonic() - started))
        transport = self._transport
        self._users[transport] = self._users.get(transport, 0) + 1
        try:
            result = await self._exchange(
                transport, method, url, request_headers, body, budget, cap, sink, gate
            )
        finally:
            await self._release(transport, 1)
        refused = isinstance(result, Answer) and result.status == 401
        if refused and credential is not None and self._command is not None:
            self._command.forget()  # refused before its expiry: ask the program again
        return result

    async def _exchange(
        self,
        transport: httpx.AsyncHTTPTransport,
        method: str,
        url: str,
        request_headers: dict[str, str],
        body: bytes | None,
        budget: float,
        cap: int,
        sink: Callable[[bytes], None] | None,
        gate: Callable[[float], bool] | None = None,
    ) -> Answer | NoAnswer:
        answer: Answer | None = None
        headed = False
        try:
            request = httpx.Request(
                method,
                url,
                headers=request_headers,
                content=body,
                extensions={"timeout": httpx.Timeout(budget).as_dict()},
            )
        except (
            httpx.InvalidURL,
            httpx.UnsupportedProtocol,
            UnicodeError,
            ValueError,
            TypeError,
        ) as exc:
            # Refused before it left. The message may quote a header value: not recorded.
            return NoAnswer(
                "not_sent", f"not sent: the request could not be built ({type(exc).__name__})"
            )
        ends = time.monotonic() + budget
        check = None if gate is None else _until(gate, ends)
        try:
            if check is not None and transport in self._unwired and not check():
                raise connections.Unsent  # no stream of ours to check at the first write
            with anyio.move_on_after(budget), connections.gated(check):
                resp = await transport.handle_async_request(request)
                async with contextlib.aclosing(resp):
                    resp.request = request
                    headed = True
                    if not 100 <= resp.status_code <= 599:
                        return NoAnswer(
                            "protocol_error",
                            f"status code {resp.status_code} is "
                            f"outside 100-599: not an HTTP answer",
                        )
                    data, size, truncated = await self._read_capped(resp, cap, sink)
                    kept = _headers(resp, self.profile)
                    answer = Answer(
                        resp.status_code,
                        kept,
                        _capped(resp.headers.get("operation-location")),
                        data,
                        size,
                        truncated,
                    )
            if answer is not None:
                return answer
            if self._transport is transport:
                await self.rebuild()
            if headed:
                return NoAnswer(
                    "read_timeout", f"body not complete within {budget:.3g}s (slow response)"
                )
            return NoAnswer(
                "read_timeout", f"no complete response head within {budget:.3g}s (slow response)"
            )
        except connections.Unsent:
            if check is not None and time.monotonic() >= ends:
                return NoAnswer(
                    "not_sent",
                    f"not sent: its {budget:.3g}s ran out before its first byte was written "
                    f"(the process was paused or starved on its way; nothing of it was written)",
                )
            return NoAnswer(
                "not_sent",
                "not sent: the lease would not outlive the request once its connection was "
                "ready (nothing of it was written)",
            )
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as exc:
            # The HTTP layer refused to write it (e.g. an illegal header value): never sent.
            # Its message may quote a header value (the credential): not recorded.
            return NoAnswer(
                "not_sent", f"not sent: the HTTP layer refused the request ({type(exc).__name__})"
            )
        except httpx.PoolTimeout:
            if self._transport is transport:
                await self.rebuild()
            return NoAnswer(
                "pool_timeout", "no connection slot free in time; connection pool rebuilt"
            )
        except httpx.ConnectTimeout:
            return NoAnswer("connect_timeout", f"no connection within {budget:.3g}s")
        except httpx.ConnectError as exc:
            return NoAnswer(*_connect_kind(exc))
        except httpx.ReadTimeout:
            return NoAnswer("read_timeout", f"no response within {budget:.3g}s")
        except httpx.WriteTimeout:
            return NoAnswer("write_timeout", f"request not sent within {budget:.3g}s")
        except (httpx.ReadError, httpx.WriteError, httpx.CloseError):
            return NoAnswer("connection_reset", "connection reset by the provider")
        except httpx.RemoteProtocolError as exc:
            text = str(exc)
            if "disconnected" in text or "closed" in text:
                return NoAnswer(
                    "connection_reset", "provider closed the connection without a complete response"
                )
            return NoAnswer("protocol_error", f"malformed HTTP from the provider: {text[:200]}")
        except httpx.HTTPError as exc:
            return NoAnswer("protocol_error", type(exc).__name__)

    async def fetch(
        self,
        *,
        operation_id: str,
        url: str,
        request_number: int,
        time_left: float,
        clock: Callable[[], float],
        job_id: str = "",
        gate: Callable[[float], bool] | None = None,
    ) -> StatusResponseReceived | TransportFailed:
        """The one status request of a poll, as the fact the model reads (``job_id`` fills a
        POST read's body, daemon/readpost.py; ``gate`` as in :meth:`call`)."""
        status = self.profile.status
        refused = _url_refused.get((url, self.profile.origin, self.profile.status_path_prefix))
        if refused is not None:  # S22: only the profile's own status resources
            return TransportFailed(
                operation_id=operation_id,
                at=clock(),
                request_number=request_number,
                kind="not_sent",
                detail=f"not sent: {refused}"[:HEADER_CAP],
            )
        result = await self.call(
            status.method,
            url,
            seconds=min(status.timeout_seconds, time_left),
            cap=status.max_body_bytes,
            body=self.profile.status_body(job_id),
            gate=gate,
        )
        if isinstance(result, NoAnswer):
            return TransportFailed(
                operation_id=operation_id,
                at=clock(),
                request_number=request_number,
                kind=result.kind,
                detail=result.detail[:HEADER_CAP],
            )
        return StatusResponseReceived(
            operation_id=operation_id,
            at=clock(),
            request_number=request_number,
            status_code=result.status,
            headers=result.headers,
            body=result.body,
            body_truncated=result.truncated,
        )

    @staticmethod
    async def _read_capped(
        resp: httpx.Response,
        cap: int,
        sink: Callable[[bytes], None] | None,
    ) -> tuple[bytes, int, bool]:
        """(body, size, truncated): at most ``cap`` bytes, raw (never decompressed)."""
        chunks: list[bytes] = []
        size = 0
        truncated = False
        async for chunk in resp.aiter_raw():
            room = cap - size
            if len(chunk) > room:
                chunk = chunk[:room]
                truncated = True
            if sink is not None:
                sink(chunk)
            else:
                chunks.append(chunk)
            size += len(chunk)
            if truncated:
                break
        return b"".join(chunks), size, truncated


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, the headers that matter, and the body read up to a cap."""

    status: int
    headers: ResponseHeaders
    operation_location: str | None
    body: bytes
    size: int
    truncated: bool


@dataclass(frozen=True)
class NoAnswer:
    """No HTTP answer: how delivery failed, with a detail that carries no secret."""

    kind: TransportKind
    detail: str


def _until(gate: Callable[[float], bool], ends: float) -> Callable[[], bool]:
    """``gate`` asked about the seconds left until ``ends`` (monotonic), when it is asked; no
    once ``ends`` has passed, whatever the gate says. A process paused on the request's way
    (SIGSTOP, a frozen VM) resumes with both its lease and the request's own time run out,
    the request's by more: asked about a negative time, a lease that ran out would still
    seem to outlive it, and the bytes would leave (the request's cancellation comes a loop
    pass later than its first write). So the gate is asked about zero at least (a lease
    found run out still ends the term there and then) and the answer is no regardless."""

    def check() -> bool:
        left = ends - time.monotonic()
        allowed = gate(max(0.0, left))
        return allowed and left > 0

    return check


def _capped(value: str | None) -> str | None:
    return value[:HEADER_CAP] if value is not None else None


def _headers(resp: httpx.Response, profile: Profile) -> ResponseHeaders:
    """The headers bide reads, capped; the provider's own rate-limit headers only when the
    contract names them (so nothing else is recorded for the other profiles)."""
    contract = profile.contract

    def get(name: str | None) -> str | None:
        return None if name is None else _capped(resp.headers.get(name))

    return ResponseHeaders(
        retry_after=get("retry-after"),
        ratelimit=get("ratelimit"),
        ratelimit_policy=get("ratelimit-policy"),
        request_id=get(profile.status.request_id_header),
        location=get("location"),
        content_type=get("content-type"),
        ratelimit_remaining=get(contract.rate_limit_remaining_header),
        ratelimit_reset=get(contract.rate_limit_reset_header),
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
