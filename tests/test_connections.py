"""The lean connection backend (daemon/connections.py): installed on the status clients with
the httpx and httpcore this project pins; an idle keep-alive connection is reused, and one the
provider closed is noticed, so the next request goes out on a fresh connection."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from daemon import connections

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"  # keep-alive by the book


async def answer_each_request(stream: anyio.abc.SocketStream, delay: float = 0.0) -> None:
    """Answer every request head that arrives on ``stream`` with :data:`RESPONSE`, ``delay``
    seconds after it, until the stream ends (anyio's end-of-stream errors propagate)."""
    buffered = b""
    while True:
        while b"\r\n\r\n" not in buffered:
            buffered += await stream.receive()
        buffered = buffered.split(b"\r\n\r\n", 1)[1]
        if delay:
            await anyio.sleep(delay)
        await stream.send(RESPONSE)


def test_installs_on_the_pinned_httpx() -> None:
    assert connections.install(httpx.AsyncHTTPTransport()), (
        "httpx/httpcore no longer keep the pool where daemon/connections.py looks; update it "
        "or drop it (the daemon falls back to httpcore's own backend)"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("hangs_up", [False, True], ids=["kept-open", "closed-by-provider"])
async def test_idle_connections_are_reused_until_the_provider_closes_them(hangs_up: bool) -> None:
    opened = 0
    hang_up, hung_up = anyio.Event(), anyio.Event()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        nonlocal opened
        opened += 1
        first = opened == 1
        async with stream, anyio.create_task_group() as tg:

            async def close_on_hang_up() -> None:  # the first connection only
                await (hang_up.wait() if first else anyio.sleep_forever())
                # shutdown() sends the FIN now; asyncio would close the socket a turn later.
                stream.extra(anyio.abc.SocketAttribute.raw_socket).shutdown(socket.SHUT_RDWR)
                await stream.aclose()
                hung_up.set()

            tg.start_soon(close_on_hang_up)
            try:
                await answer_each_request(stream)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                tg.cancel_scope.cancel()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        transport = httpx.AsyncHTTPTransport(trust_env=False)
        assert connections.install(transport)
        async with httpx.AsyncClient(transport=transport) as client:
            with anyio.fail_after(10):
                first = await client.get(f"http://127.0.0.1:{port}/a")
                if hangs_up:  # while the client holds the connection idle in its pool
                    hang_up.set()
                    await hung_up.wait()
                second = await client.get(f"http://127.0.0.1:{port}/b")
        tg.cancel_scope.cancel()
    assert (first.text, second.text) == ("ok", "ok")
    assert opened == (2 if hangs_up else 1)


@pytest.mark.anyio
async def test_a_pool_polls_its_idle_connections_once_per_loop_pass() -> None:
    """Eight connections held idle, then eight requests at once: httpcore asks about every idle
    connection before and after each request, but the pool's sockets are polled together, at
    most once per event-loop pass (was: one poll call per connection per question)."""
    polls = 0
    inflight = 8

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await answer_each_request(stream, delay=0.01)  # all eight in flight together

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
        transport = httpx.AsyncHTTPTransport(trust_env=False, limits=limits)
        assert connections.install(transport)
        async with httpx.AsyncClient(transport=transport) as client:
            pool: Any = transport._pool
            readiness = pool._network_backend._readiness
            real_poll = readiness._poll

            class Counting:
                def register(self, fd: int, mask: int) -> None:
                    real_poll.register(fd, mask)

                def unregister(self, fd: int) -> None:
                    real_poll.unregister(fd)

                def poll(self, timeout: int) -> list[tuple[int, int]]:
                    nonlocal polls
                    polls += 1
                    return real_poll.poll(timeout)  # type: ignore[no-any-return]

            readiness._poll = Counting()

            async def get(path: str) -> str:
                return (await client.get(f"http://127.0.0.1:{port}/{path}")).text

            async def wave() -> list[str]:
                texts: list[str] = []

                async def one(i: int) -> None:
                    texts.append(await get(str(i)))

                async with anyio.create_task_group() as wave_tg:
                    for i in range(inflight):
                        wave_tg.start_soon(one, i)
                return texts

            with anyio.fail_after(10):
                assert await wave() == ["ok"] * inflight  # opens the eight connections
                asked = polls
                assert await wave() == ["ok"] * inflight  # on eight idle connections
            assert len(pool.connections) == inflight
        tg.cancel_scope.cancel()
    # httpcore asks about every idle connection before and after each request: about 200
    # poll calls for this wave with one per connection per question; shared, one per pass
    # that asks (about two per request, depending on how the passes fall).
    assert 0 < polls - asked <= 4 * inflight, f"{polls - asked} poll calls for {inflight} requests"
