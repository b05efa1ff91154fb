"""A cheaper answer to httpcore's "has the server closed this idle connection?".

Before every request and after every response, httpcore's pool asks each idle connection
whether its socket is readable. Its AnyIO stream answers by building anyio's whole attribute
mapping (a ``getpeername`` system call) and a fresh ``select.poll`` object, every time: with
the pool full (a provider's ``max_in_flight`` connections) that cost 200-280 µs of event loop
CPU per status request in the scale benchmark, a fifth of the daemon's.

Here a pool's connections share one ``poll`` object, and one ``poll`` call answers for all of
them until the event loop's next pass (:class:`_Readiness`). With 8 connections the pool asked
about 24 times per request (counted in its test), each a system call that also let the log's
writer thread take the GIL from the event loop; now about twice. Within one pass nothing else
runs on the loop, so an answer from earlier in the pass is as current as httpcore's own (a
server may close a connection just after any such check; that race is httpcore's, and is
recorded as a reset).

httpx exposes no network backend setting, so :func:`install` replaces the backend of the
transport's connection pool, and leaves the pool as httpx built it when these internals are not
where this version of it keeps them (the test suite checks they are, for the pinned versions).

The same streams hold the last look before a request leaves (:func:`gated`): a request sent
inside ``with gated(check):`` writes its first byte only if ``check()`` still says yes at that
moment, after the credential, the pool's slot and the connection, whatever those awaits took
(a process paused in one of them, past its lease, must not send when it resumes). A refusal
raises :class:`Unsent` out of httpcore's ``handle_async_request``; nothing of the request
was written, and httpcore closes the connection. The check runs once per request, on its first
write (a request's head is one write; its body follows only once the head has left); its cost is
a context variable read per write, and the check itself once per request.
"""

# httpcore's stream and backend interfaces take ``timeout`` arguments; these are overrides.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from typing import Any

import anyio.lowlevel
import httpcore
import httpx


class Unsent(Exception):
    """A gated request's check said no as its first byte was to be written: nothing of it
    left (:func:`gated`)."""


class _Gate:
    """One request's check, and whether its first write passed it; entered around the
    request (a plain class: ``contextlib.contextmanager`` cost 3-7 µs per request here)."""

    __slots__ = ("_token", "check", "passed")

    def __init__(self, check: Callable[[], bool]) -> None:
        self.check = check
        self.passed = False
        self._token: Token[_Gate | None] | None = None

    def __enter__(self) -> None:
        self._token = _GATE.set(self)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _GATE.reset(self._token)
            self._token = None


#: The gate of the request this task is sending (httpcore writes it in the caller's task).
_GATE: ContextVar[_Gate | None] = ContextVar("bide_send_gate", default=None)
_UNGATED = contextlib.nullcontext()


def gated(check: Callable[[], bool] | None) -> contextlib.AbstractContextManager[None]:
    """Send the request made inside only if ``check()`` holds as its first byte is written
    (None: no check); raises :class:`Unsent` otherwise."""
    return _UNGATED if check is None else _Gate(check)


def _may_write() -> None:
    gate = _GATE.get()
    if gate is not None and not gate.passed:
        if not gate.check():
            raise Unsent
        gate.passed = True


class _Readiness:
    """One ``poll`` object for a pool's sockets; the readable ones, polled once per event-loop
    pass at most."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._readable: set[int] | None = None  # this pass's answer; None: not asked yet

    def add(self, fd: int) -> None:
        self._poll.register(fd, select.POLLIN)
        self._readable = None

    def remove(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._poll.unregister(fd)
        self._readable = None

    def readable(self, fd: int) -> bool:
        """Data, a hang-up or an error waiting on ``fd`` (a closed descriptor polls as
        ``POLLNVAL``: readable too, as httpcore counts it)."""
        if self._readable is None:
            self._readable = {ready for ready, _ in self._poll.poll(0)}
            asyncio.get_running_loop().call_soon(self._forget)
        return fd in self._readable

    def _forget(self) -> None:
        self._readable = None


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's AnyIO stream, with ``is_readable`` answered by the pool's
    :class:`_Readiness`, and a request's first write checked by its gate (:func:`gated`)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, readiness: _Readiness) -> None:
        self._inner = inner
        self._readiness = readiness
        # A socket.socket, or asyncio's TransportSocket wrapping one: anything with fileno().
        self._sock: Any = inner.get_extra_info("socket")
        self._fd = -1
        if self._sock is not None and self._sock.fileno() >= 0:
            self._fd = self._sock.fileno()
            readiness.add(self._fd)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        gate = _GATE.get()
        if gate is None or gate.passed:
            await self._inner.write(buffer, timeout)
            return
        # anyio's send yields to the event loop before the bytes go; on a busy loop that is
        # long enough for a pause (SIGSTOP, a frozen VM) to land between the check and the
        # bytes, which then leave on resume under a lease that ran out meanwhile. So: yield
        # first, then check and hand the bytes to the transport with no await between.
        await anyio.lowlevel.checkpoint()
        transport = self._plain_transport()
        _may_write()  # the last look before the request's first byte
        if transport is not None and not transport.is_closing():
            transport.write(buffer)  # asyncio sends at once when nothing is queued before it
            return
        await self._inner.write(buffer, timeout)

    def _plain_transport(self) -> asyncio.WriteTransport | None:
        """The asyncio transport under a plain TCP stream (None under TLS or another
        backend: there the check stays before anyio's send, a yield earlier)."""
        stream = getattr(self._inner, "_stream", None)
        transport = getattr(stream, "_transport", None)
        return transport if isinstance(transport, asyncio.WriteTransport) else None

    async def aclose(self) -> None:
        self._forget_fd()
        await self._inner.aclose()

    def _forget_fd(self) -> None:
        if self._fd >= 0:
            self._readiness.remove(self._fd)
            self._fd = -1

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self._forget_fd()  # the TLS stream registers the same socket again
        return _Stream(
            await self._inner.start_tls(ssl_context, server_hostname, timeout), self._readiness
        )

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # As httpcore answers it: a closed socket, or one with data or a hang-up waiting.
            if self._fd < 0 or self._sock is None or self._sock.fileno() != self._fd:
                return True
            return self._readiness.readable(self._fd)
        return self._inner.get_extra_info(info)


class Backend(httpcore.AnyIOBackend):
    """httpcore's AnyIO backend whose streams answer ``is_readable`` cheaply (one backend per
    pool: its streams share one :class:`_Readiness`)."""

    def __init__(self) -> None:
        self._readiness = _Readiness()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(
            await super().connect_tcp(host, port, timeout, local_address, socket_options),
            self._readiness,
        )


def install(transport: httpx.AsyncHTTPTransport) -> bool:
    """Give ``transport``'s connection pool the lean backend; False (and nothing changed) where
    this httpx or httpcore keeps its pool elsewhere."""
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool) or not isinstance(
        getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend
    ):
        return False
    pool._network_backend = Backend()
    return True
