"""What httpx's client layer costs per request: ``AsyncClient.send`` against the transport it
wraps (``AsyncHTTPTransport.handle_async_request``), in the same process, alternating.

The daemon sends its status requests straight to the transport (``daemon/http.py``): the
client layer's redirects, auth flow, cookie jar and environment proxies are all things bide
turns off. This measures what walking through that layer costs, so the scale benchmark's
ratio against the bare loop (which uses ``AsyncClient.stream``, as an agent would) can be
read with it: same headers, timeout, connection limits and raw body reading on both sides,
against one minimal HTTP/1.1 server in its own process that answers every request at once.

``python -m tests.bench --only http`` prints CPU per request (user + system, this process)
and requests/s for each, per round, and the ratio of the best rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import anyio
import httpx

BODY = b'{"state":"running","progress":0.5}'
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
HEADERS = {
    "User-Agent": "bench-http",
    "Accept": "application/json",
    "Accept-Encoding": "identity",
    "Authorization": "Bearer not-a-secret",
}
CONCURRENCY = 8


class _Answer(asyncio.Protocol):
    """Answers each request head as soon as it has arrived (no bodies are sent to it)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._buffered = b""

    def data_received(self, data: bytes) -> None:
        self._buffered += data
        while b"\r\n\r\n" in self._buffered:
            self._buffered = self._buffered.split(b"\r\n\r\n", 1)[1]
            self._transport.write(RESPONSE)


async def _serve() -> None:
    server = await asyncio.get_running_loop().create_server(_Answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _round(base: str, requests: int, through_client: bool) -> dict[str, float]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    timeout = httpx.Timeout(5.0)
    client = httpx.AsyncClient(limits=limits, follow_redirects=False, trust_env=False)
    transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False, retries=0)

    async def by_client(url: str) -> int:
        request = client.build_request("GET", url, headers=HEADERS, timeout=timeout)
        async with contextlib.aclosing(await client.send(request, stream=True)) as resp:
            return len(b"".join([chunk async for chunk in resp.aiter_raw()]))

    async def by_transport(url: str) -> int:
        request = httpx.Request(
            "GET", url, headers=HEADERS, extensions={"timeout": timeout.as_dict()}
        )
        resp = await transport.handle_async_request(request)
        async with contextlib.aclosing(resp):
            return len(b"".join([chunk async for chunk in resp.aiter_raw()]))

    one: Callable[[str], Awaitable[int]] = by_client if through_client else by_transport
    received = 0

    async def worker(w: int) -> None:
        nonlocal received
        for i in range(w, requests, CONCURRENCY):
            n = await one(f"{base}/jobs/j-{i:07d}")
            received += n  # not ``+= await``: that reads ``received`` before awaiting

    await one(f"{base}/warm")  # the first connection's setup is not what is measured
    cpu, started = _cpu(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(CONCURRENCY):
            tg.start_soon(worker, w)
    cpu, seconds = _cpu() - cpu, time.perf_counter() - started
    await client.aclose()
    await transport.aclose()
    assert received == requests * len(BODY), "a response came back short"
    return {
        "cpu_us_per_request": round(cpu / requests * 1e6, 1),
        "requests_per_s": round(requests / seconds),
    }


def run(requests: int = 20_000, rounds: int = 3) -> dict[str, object]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.bench_http", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base = f"http://127.0.0.1:{int(server.stdout.readline())}"
        client: list[dict[str, float]] = []
        transport: list[dict[str, float]] = []
        for _ in range(rounds):  # alternating, so a slow minute of the machine hits both
            client.append(anyio.run(_round, base, requests, True))
            transport.append(anyio.run(_round, base, requests, False))
    finally:
        server.terminate()
        server.wait(10)
    best_client = min(r["cpu_us_per_request"] for r in client)
    best_transport = min(r["cpu_us_per_request"] for r in transport)
    return {
        "requests_per_round": requests,
        "concurrency": CONCURRENCY,
        "client": client,
        "transport": transport,
        "client_layer_us_per_request": round(best_client - best_transport, 1),
        "transport_vs_client_cpu": round(best_transport / best_client, 3),
    }


def print_table(r: dict[str, object]) -> None:
    print(
        f"\nhttpx's client layer, {r['requests_per_round']} GETs per round, "
        f"{r['concurrency']} in flight, one process, alternating"
    )
    print(
        f"  {'round':<8}{'AsyncClient us/req':>20}{'req/s':>8}{'transport us/req':>18}{'req/s':>8}"
    )
    client, transport = r["client"], r["transport"]
    assert isinstance(client, list)
    assert isinstance(transport, list)
    for i, (c, t) in enumerate(zip(client, transport, strict=True), start=1):
        print(
            f"  {i:<8}{c['cpu_us_per_request']:>20}{c['requests_per_s']:>8}"
            f"{t['cpu_us_per_request']:>18}{t['requests_per_s']:>8}"
        )
    print(
        f"  the client layer, best rounds: {r['client_layer_us_per_request']} us per request "
        f"(transport / client CPU {r['transport_vs_client_cpu']})"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    asyncio.run(_serve())
