"""The simulator's HTTP/1.1 server: anyio sockets and h11, around :class:`Provider`.

The shell reads one request (bounded: header bytes, body bytes, a read timeout per request
including keep-alive idling), hands it to the provider with the arrival time, and carries
out the reply: hold it back for ``delay``, reset the connection (``SO_LINGER`` 0, so the
peer sees RST), close it without answering, or send it (bounded by a write timeout, bodies
streamed in chunks). A misbehaving client can cost the simulator one connection slot for at
most a timeout, never wedge it.

Two ways to run it::

    async with anyio.create_task_group() as tg:            # inside an event loop
        address = await tg.start(Simulator(script).serve)

    with run_in_thread(script) as sim:                     # from synchronous code (pytest)
        httpx.get(sim.job_url("export-1"))
        sim.wait_for_requests(1, kind="status")
"""

from __future__ import annotations

import functools
import http
import ipaddress
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.abc
import h11
import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal

from daemon.simulator.provider import Provider, Reply, Request
from daemon.simulator.requestlog import RequestLog, RequestRecord
from daemon.simulator.script import Job, Script, Step
from daemon.simulator.stamped import StampedStream, listen, serve_stamped

__all__ = ["Limits", "Simulator", "SimulatorHandle", "is_loopback", "run_in_thread"]

_RECEIVE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """Bounds that keep a client from wedging the simulator.

    Attributes:
        max_header_bytes: request line plus headers; beyond it the answer is 431.
        max_body_bytes: request body; beyond it the answer is 413 and the connection closes.
        read_timeout: seconds to receive a whole request (and to wait for the next one on a
            kept-alive connection); then the connection is closed.
        write_timeout: seconds to send a whole response (after any scripted delay).
        max_connections: concurrent connections; more are closed at once.
    """

    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024
    read_timeout: float = 10.0
    write_timeout: float = 30.0
    max_connections: int = 128


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class _Incoming:
    request: Request
    wall: float
    monotonic: float
    refuse: int | None = None  # 413 or 431: answered without reaching the provider


class Simulator:
    """A scripted provider serving HTTP/1.1 on loopback.

    Args:
        script: jobs, scenarios and server behaviour (default: none; add jobs later).
        host: address to bind; a non-loopback one needs ``allow_remote=True``.
        port: port to bind; 0 picks a free one.
        token: if set, requests other than ``/_sim/`` need ``Authorization: Bearer <token>``.
        request_log: also append each request record to this JSON-lines file.
        limits: bounds on what a client may cost.
        clock: wall clock in POSIX seconds, for the log, ``Date`` and computed timestamps.
        allow_remote: permit a non-loopback ``host``.

    Raises:
        ValueError: ``host`` is not loopback and ``allow_remote`` is False.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        request_log: str | Path | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        allow_remote: bool = False,
    ) -> None:
        if not allow_remote and not is_loopback(host):
            raise ValueError(f"refusing to bind {host!r}: not a loopback address")
        self._host = host
        self._port = port
        self._limits = limits or Limits()
        self._clock = clock
        self._connections = 0
        self._address: tuple[str, int] | None = None
        self.log = RequestLog(request_log)
        self.provider = Provider(script or Script(), log=self.log, now=clock(), token=token)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port).

        Raises:
            RuntimeError: the simulator has not started serving.
        """
        if self._address is None:
            raise RuntimeError("the simulator is not serving yet")
        return self._address

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running simulator."""
        return _origin(*self.address)

    def requests(self) -> list[RequestRecord]:
        """Every request received so far, in arrival order."""
        return self.log.snapshot()

    def add_job(
        self,
        job: Job | Sequence[Step | str | Mapping[str, Any]] | str,
        *,
        job_id: str | None = None,
        result_size: int | None = None,
    ) -> str:
        """Add a job (call from the simulator's event loop, or use the handle's method).

        Args:
            job: a :class:`Job`, or its steps: a list of :class:`Step`, compact strings
                or step tables as dicts (``{"status": 503, "retry_after": 5}``), or one
                compact string.
            job_id: its id; default a fresh ``{id_prefix}{n}``.
            result_size: bytes of its result file (default the server's).

        Returns:
            The job id.

        Raises:
            ValueError: the steps do not validate (``msgspec.ValidationError``, which names the
                key), or the id is taken.
        """
        if not isinstance(job, Job):
            steps = job if isinstance(job, str) else list(job)
            job = msgspec.convert({"steps": steps, "result_size": result_size}, Job)
        return self.provider.add_job(job, job_id=job_id, now=self._clock())

    async def serve(
        self,
        *,
        task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind, report ``(host, port)`` through ``task_status``, and serve until cancelled.

        Raises:
            OSError: the address cannot be bound, or the request log file cannot be opened.
        """
        self.log.open()
        try:
            listener = listen(self._host, self._port)
            bound = listener.getsockname()
            self._address = (str(bound[0]), int(bound[1]))
            self.provider.base_url = self.base_url
            task_status.started(self._address)
            await serve_stamped(listener, self._connection)
        finally:
            self.log.close()

    async def _connection(self, stream: StampedStream) -> None:
        if self._connections >= self._limits.max_connections:
            await stream.aclose()
            return
        self._connections += 1
        try:
            await self._converse(stream)
        except (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            anyio.EndOfStream,
            ConnectionError,
            TimeoutError,
        ):
            pass  # the client went away, or was too slow to read; nothing to answer
        finally:
            self._connections -= 1
            await stream.aclose()

    async def _converse(self, stream: StampedStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        while True:
            try:
                incoming = await self._read(conn, stream)
            except h11.RemoteProtocolError as exc:
                await self._refuse(conn, stream, exc.error_status_hint)
                return
            if incoming is None:
                return
            if incoming.refuse is not None:
                reply = self.provider.reject(
                    incoming.request,
                    incoming.refuse,
                    wall=incoming.wall,
                    monotonic=incoming.monotonic,
                )
                await self._send(conn, stream, reply, head=False)
                await _drain(stream)
                return
            reply = self.provider.handle(
                incoming.request, wall=incoming.wall, monotonic=incoming.monotonic
            )
            head = incoming.request.method == "HEAD"
            if not await self._send(conn, stream, reply, head=head):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read(self, conn: h11.Connection, stream: StampedStream) -> _Incoming | None:
        incoming: _Incoming | None = None
        body = bytearray()
        with anyio.move_on_after(self._limits.read_timeout):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive(_RECEIVE_BYTES)
                    except anyio.EndOfStream:
                        data = b""
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    incoming = _Incoming(
                        Request(
                            method=event.method.decode("ascii", "replace"),
                            target=event.target.decode("ascii", "replace"),
                            headers=tuple(
                                (k.decode("latin-1"), v.decode("latin-1"))
                                for k, v in event.headers.raw_items()
                            ),
                        ),
                        *self._arrival(stream),
                    )
                    # h11 bounds only a head still arriving; one that came whole is checked here.
                    size = len(event.target) + sum(
                        len(k) + len(v) + 4 for k, v in event.headers.raw_items()
                    )
                    if size > self._limits.max_header_bytes:
                        incoming.refuse = 431
                        return incoming
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > self._limits.max_body_bytes and incoming is not None:
                        incoming.refuse = 413
                        return incoming
                elif isinstance(event, h11.EndOfMessage) and incoming is not None:
                    incoming.request = Request(
                        incoming.request.method,
                        incoming.request.target,
                        incoming.request.headers,
                        bytes(body),
                    )
                    return incoming
                else:  # ConnectionClosed, or PAUSED (never expected here)
                    return None
        return None  # read timeout

    def _arrival(self, stream: StampedStream) -> tuple[float, float]:
        """When the request's head reached this host: the kernel's stamp of the bytes that
        completed it (:mod:`daemon.simulator.stamped`), unless a test set the clock."""
        wall, monotonic = self._clock(), time.monotonic()
        if stream.arrived is not None and self._clock is time.time:
            waited = max(0.0, wall - stream.arrived)
            return wall - waited, monotonic - waited
        return wall, monotonic

    async def _refuse(self, conn: h11.Connection, stream: StampedStream, status: int) -> None:
        """Answer a request h11 could not parse (400, or 431 for oversized headers), and log it."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        reply = self.provider.reject(
            Request("", "", ()), status, wall=self._clock(), monotonic=time.monotonic()
        )
        with suppress(h11.LocalProtocolError):
            await self._send(conn, stream, reply, head=False)

    async def _send(
        self, conn: h11.Connection, stream: StampedStream, reply: Reply, *, head: bool
    ) -> bool:
        """Carry out a reply; returns False if the connection was reset or closed."""
        if reply.delay > 0:
            await anyio.sleep(reply.delay)
        if reply.fault is not None:
            if reply.fault == "reset":
                stream.reset_on_close()
            await stream.aclose()
            return False
        headers = list(reply.headers)
        bodyless = head or reply.status in (204, 304)
        if reply.chunked and not bodyless:
            headers.append(("Transfer-Encoding", "chunked"))
        elif reply.status not in (204, 304):
            headers.append(("Content-Length", str(reply.length)))
        with anyio.fail_after(self._limits.write_timeout):
            response = h11.Response(
                status_code=reply.status, headers=headers, reason=_reason(reply.status)
            )
            await stream.send(conn.send(response) or b"")
            if not bodyless:
                chunks = reply.stream.chunks() if reply.stream is not None else iter([reply.body])
                for chunk in chunks:
                    if chunk:
                        await stream.send(conn.send(h11.Data(data=chunk)) or b"")
            await stream.send(conn.send(h11.EndOfMessage()) or b"")
        return True


async def _drain(stream: StampedStream) -> None:
    """Read and drop what the client is still sending, briefly, so closing does not RST it.

    Closing a socket with unread data sends RST, which can destroy the response before the
    client reads it; this gives the client a moment to finish and close first.
    """
    budget = 1024 * 1024
    with anyio.move_on_after(0.5):
        while budget > 0:
            try:
                budget -= len(await stream.receive(_RECEIVE_BYTES))
            except anyio.EndOfStream:
                return


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


class SimulatorHandle:
    """A simulator running in a background thread, driven from synchronous code."""

    def __init__(self, simulator: Simulator, portal: BlockingPortal) -> None:
        self.simulator = simulator
        self._portal = portal

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        return self.simulator.address

    @property
    def base_url(self) -> str:
        """``http://host:port``."""
        return self.simulator.base_url

    def url(self, path: str) -> str:
        """An absolute URL for a path on the simulator."""
        return self.base_url + path

    def job_url(self, job_id: str) -> str:
        """The status URL of a job, its id percent-encoded as one path segment."""
        return f"{self.base_url}/jobs/{quote(job_id, safe='')}"

    def requests(
        self, *, kind: str | None = None, job_id: str | None = None
    ) -> list[RequestRecord]:
        """The request log so far, optionally only one kind and/or one job."""
        return _select(self.simulator.requests(), kind, job_id)

    def wait_for_requests(
        self,
        count: int,
        *,
        kind: str | None = None,
        job_id: str | None = None,
        timeout: float = 10.0,
    ) -> list[RequestRecord]:
        """Block until at least ``count`` matching requests are logged; returns them.

        Raises:
            TimeoutError: fewer arrived within ``timeout`` seconds.
        """
        records = self.simulator.log.wait_for(
            lambda rs: len(_select(rs, kind, job_id)) >= count, timeout
        )
        return _select(records, kind, job_id)

    def add_job(
        self,
        job: Job | Sequence[Step | str | Mapping[str, Any]] | str,
        *,
        job_id: str | None = None,
        result_size: int | None = None,
    ) -> str:
        """Add a job on the simulator's event loop; see :meth:`Simulator.add_job`."""
        add = functools.partial(self.simulator.add_job, job, job_id=job_id, result_size=result_size)
        return self._portal.call(add)


def _select(
    records: list[RequestRecord], kind: str | None, job_id: str | None
) -> list[RequestRecord]:
    return [
        r
        for r in records
        if (kind is None or r.kind == kind) and (job_id is None or r.job_id == job_id)
    ]


@contextmanager
def run_in_thread(
    script: Script | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    request_log: str | Path | None = None,
    limits: Limits | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[SimulatorHandle]:
    """Serve ``script`` on its own event loop in a background thread.

    The simulator is listening when the block starts and stopped (every connection
    closed, the log file closed) when it ends. Arguments are those of :class:`Simulator`.
    """
    simulator = Simulator(
        script,
        host=host,
        port=port,
        token=token,
        request_log=request_log,
        limits=limits,
        clock=clock,
    )
    with start_blocking_portal(name="bide-simulator") as portal:
        future, _address = portal.start_task(simulator.serve)
        try:
            yield SimulatorHandle(simulator, portal)
        finally:
            future.cancel()
