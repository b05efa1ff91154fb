"""A cheaper answer to httpcore's "has the server closed this idle connection?".

Before every request and after every response, httpcore's pool asks each idle connection
whether its socket is readable. Its AnyIO stream answers by building anyio's whole attribute
mapping (a ``getpeername`` system call) and a fresh ``select.poll`` object, every time: with
the pool full (a provider's ``max_in_flight`` connections) that cost 200-280 µs of event loop
CPU per status request in the scale benchmark, a fifth of the daemon's. The stream here
answers the same question with one ``poll`` object per connection, made when it opens.

httpx exposes no network backend setting, so :func:`install` replaces the backend of the
client's connection pool, and leaves the pool as httpx built it when these internals are not
where this version of it keeps them (the test suite checks they are, for the pinned versions).
"""

# httpcore's stream and backend interfaces take ``timeout`` arguments; these are overrides.
# ruff: noqa: ASYNC109

from __future__ import annotations

import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's AnyIO stream, with ``is_readable`` from a poll object kept per connection."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        # A socket.socket, or asyncio's TransportSocket wrapping one: anything with fileno().
        self._sock: Any = inner.get_extra_info("socket")
        self._poll: Any = None
        if self._sock is not None and self._sock.fileno() >= 0:
            self._poll = select.poll()
            self._poll.register(self._sock.fileno(), select.POLLIN)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # As httpcore answers it: a closed socket, or one with data or a hang-up waiting.
            if self._poll is None or self._sock is None or self._sock.fileno() < 0:
                return True
            return bool(self._poll.poll(0))
        return self._inner.get_extra_info(info)


class Backend(httpcore.AnyIOBackend):
    """httpcore's AnyIO backend whose streams answer ``is_readable`` cheaply."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        return _Stream(await super().connect_tcp(host, port, timeout, local_address,
                                                 socket_options))


def install(client: httpx.AsyncClient) -> bool:
    """Give ``client``'s connection pool the lean backend; False (and nothing changed) where
    this httpx or httpcore keeps its pool elsewhere."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool) or not isinstance(
            getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend):
        return False
    pool._network_backend = Backend()
    return True
