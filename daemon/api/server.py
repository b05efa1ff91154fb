"""HTTP/1.1 over a Unix socket, with h11, bounded so that no client can hurt the daemon.

Each connection is one task: it reads one request at a time (its head within
``max_header_bytes``, its body within ``max_body_bytes``, the whole request within
``request_timeout``, the next request on a kept-alive connection within ``idle_timeout``),
asks the handler for the answer with the peer's credentials from the kernel, and writes it
(within ``write_timeout``). While the handler works (a bounded wait can take a minute), the
connection is watched: a client that goes away cancels its handler at once, so a waiter
never outlives its caller. At most ``max_connections`` are open; more are answered 503 and
closed. An ``accept`` that fails for want of file descriptors backs off instead of ending
the listener. Every refusal is counted by its reason.
"""

from __future__ import annotations

import http
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import h11
import msgspec
from anyio.abc import SocketAttribute

from daemon import logfmt
from daemon.accepting import accepted
from daemon.api.peer import Peer, peer_of
from daemon.api.schema import ApiError

_RECEIVE_BYTES = 64 * 1024
_FILE_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024
    max_header_bytes: int = 16 * 1024
    request_timeout: float = 10.0  # from a request's first byte to its last
    idle_timeout: float = 75.0  # a kept-alive connection waiting for its next request
    write_timeout: float = 10.0
    max_connections: int = 1024
    max_connections_per_user: int = 256  # so one user cannot shut the others out


@dataclass(frozen=True)
class Relayed:
    """Who asked, for a request another node's API took from its local agent and relayed
    to this shard's holder (:mod:`daemon.shards.relay`): the peer is that agent's, from the
    other host's kernel, and the roles are what that node computed from the agent's groups
    there (this host cannot see them). Only the relay builds one, from a row sealed with the
    log's data key; a request read from a socket never carries one."""

    node: str
    name: str
    roles: tuple[str, ...]


@dataclass
class Request:
    method: str
    path: str  # percent-decoded
    raw_path: str  # as sent
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    peer: Peer
    relayed: Relayed | None = None


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "application/json"
    #: A file to send as the body (a fetched result), opened and streamed when written in
    #: chunks, each within ``write_timeout``; ``body`` is then unused.
    file: Path | None = None


Handler = Callable[[Request], Awaitable[Response]]
Count = Callable[[str], None]  # a refusal's reason, for the metrics


def error(
    status: int,
    code: str,
    detail: str,
    field_name: str | None = None,
    headers: list[tuple[str, str]] | None = None,
) -> Response:
    body = msgspec.json.encode(ApiError(error=code, detail=detail, field=field_name))
    return Response(status, body, headers or [])


class _Refused(Exception):
    def __init__(self, response: Response, reason: str) -> None:
        self.response = response
        self.reason = reason


class ApiServer:
    def __init__(
        self, handler: Handler, *, limits: Limits | None = None, count: Count = lambda reason: None
    ) -> None:
        self.handler = handler
        self.limits = limits or Limits()
        self.count = count
        self.connections = 0
        self._per_user: dict[int, int] = {}

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accept until cancelled."""
        async with anyio.create_task_group() as tg:
            async for stream in accepted(listener, "api", lambda: self.count("out_of_descriptors")):
                tg.start_soon(self._connection, stream)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                peer = peer_of(stream.extra(SocketAttribute.raw_socket))
                mine = self._per_user.get(peer.uid, 0)
                if (
                    self.connections >= self.limits.max_connections
                    or mine >= self.limits.max_connections_per_user
                ):
                    whose = (
                        "its" if self.connections >= self.limits.max_connections else "this user's"
                    )
                    self.count("too_many_connections")
                    conn = h11.Connection(h11.SERVER)
                    await self._write_refusal(
                        conn,
                        stream,
                        error(
                            503,
                            "too_many_connections",
                            f"the daemon has {whose} limit of API connections open; try again "
                            "shortly",
                            headers=[("Retry-After", "1")],
                        ),
                    )
                    return
                self.connections += 1
                self._per_user[peer.uid] = mine + 1
                try:
                    await self._converse(stream, peer)
                finally:
                    self.connections -= 1
                    left = self._per_user[peer.uid] - 1
                    if left:
                        self._per_user[peer.uid] = left
                    else:
                        del self._per_user[peer.uid]
        except (
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            anyio.EndOfStream,
            ConnectionError,
            TimeoutError,
        ):
            pass  # the client went away or was too slow to read: nothing to answer
        except h11.ProtocolError as exc:  # the barrier: one connection, never the listener
            logfmt.error("api: HTTP protocol error; connection closed", error=str(exc)[:200])
            self.count("protocol_error")
        except Exception as exc:  # a bug in the connection loop: this connection only
            logfmt.error("api: internal error; connection closed", error=type(exc).__name__)
            self.count("internal_error")

    async def _converse(self, stream: anyio.abc.SocketStream, peer: Peer) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        while True:
            try:
                request = await self._read(conn, stream, peer)
            except _Refused as refused:
                self.count(refused.reason)
                await self._write_refusal(conn, stream, refused.response)
                return
            if request is None:
                return
            response = await self._answer(conn, stream, request)
            if response is None:
                return  # the client left while its request was handled
            keep = await self._write(conn, stream, response, head=request.method == "HEAD")
            if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _answer(
        self, conn: h11.Connection, stream: anyio.abc.SocketStream, request: Request
    ) -> Response | None:
        """Run the handler while watching the connection: if the client closes it, the
        handler is cancelled (a waiter leaves with its caller)."""
        result: list[Response] = []
        async with anyio.create_task_group() as tg:

            async def handle() -> None:
                try:
                    result.append(await self.handler(request))
                except Exception as exc:  # the barrier: a bug answers 500, the daemon goes on
                    logfmt.error("api: internal error", path=request.path, error=type(exc).__name__)
                    self.count("internal_error")
                    result.append(
                        error(
                            500,
                            "internal_error",
                            f"bide failed answering ({type(exc).__name__}); "
                            "the daemon goes on; see its journal",
                        )
                    )
                tg.cancel_scope.cancel()

            async def watch() -> None:
                pending = 0
                while True:
                    try:
                        data = await stream.receive(_RECEIVE_BYTES)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        data = b""
                    if not data:
                        self.count("client_left")
                        tg.cancel_scope.cancel()
                        return
                    pending += len(data)
                    if pending > self.limits.max_header_bytes + self.limits.max_body_bytes:
                        tg.cancel_scope.cancel()  # a client flooding while it waits
                        return
                    conn.receive_data(data)  # a pipelined next request: kept for later

            tg.start_soon(handle)
            tg.start_soon(watch)
        return result[0] if result else None

    async def _read(
        self, conn: h11.Connection, stream: anyio.abc.SocketStream, peer: Peer
    ) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        started = False
        scope = anyio.CancelScope(deadline=anyio.current_time() + self.limits.idle_timeout)
        with scope:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    status = exc.error_status_hint
                    reason = "header_too_large" if status == 431 else "malformed_http"
                    raise _Refused(
                        error(status, reason, f"not a valid HTTP/1.1 request: {exc}"), reason
                    ) from None
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive(_RECEIVE_BYTES)
                    except anyio.EndOfStream:
                        data = b""
                    if data and not started:
                        started = True  # the request has begun: it has request_timeout
                        scope.deadline = anyio.current_time() + self.limits.request_timeout
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    head = event
                    size = len(event.target) + sum(
                        len(k) + len(v) + 4 for k, v in event.headers.raw_items()
                    )
                    if size > self.limits.max_header_bytes:
                        raise _Refused(
                            error(
                                431,
                                "header_too_large",
                                f"the request head is {size} bytes; the limit is "
                                f"{self.limits.max_header_bytes}",
                            ),
                            "header_too_large",
                        )
                    length = _content_length(event)
                    if length is not None and length > self.limits.max_body_bytes:
                        raise _Refused(self._too_large(length), "body_too_large")
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > self.limits.max_body_bytes:
                        raise _Refused(self._too_large(len(body)), "body_too_large")
                elif isinstance(event, h11.EndOfMessage) and head is not None:
                    return _request(head, bytes(body), peer)
                else:
                    return None  # the client closed the connection
        if started:
            self.count("request_timeout")
            raise _Refused(
                error(
                    408,
                    "request_timeout",
                    f"the request did not arrive whole within {self.limits.request_timeout:g}s",
                ),
                "request_timeout",
            )
        return None  # idle keep-alive connection: close it quietly

    def _too_large(self, size: int) -> Response:
        return error(
            413,
            "body_too_large",
            f"the body is {size} bytes; the limit is {self.limits.max_body_bytes}",
        )

    async def _write_refusal(
        self, conn: h11.Connection, stream: anyio.abc.SocketStream, response: Response
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response.headers.append(("Connection", "close"))
        try:
            await self._write(conn, stream, response)
        except h11.LocalProtocolError:
            return

    async def _write(
        self,
        conn: h11.Connection,
        stream: anyio.abc.SocketStream,
        response: Response,
        *,
        head: bool = False,
    ) -> bool:
        if response.file is not None:
            return await self._write_file(conn, stream, response, response.file, head=head)
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            *response.headers,
        ]
        with anyio.fail_after(self.limits.write_timeout):
            await stream.send(
                conn.send(
                    h11.Response(
                        status_code=response.status,
                        headers=headers,
                        reason=_reason(response.status),
                    )
                )
                or b""
            )
            if response.body and not head:  # a HEAD answer has the headers only
                await stream.send(conn.send(h11.Data(data=response.body)) or b"")
            await stream.send(conn.send(h11.EndOfMessage()) or b"")
        return True

    async def _write_file(
        self,
        conn: h11.Connection,
        stream: anyio.abc.SocketStream,
        response: Response,
        path: Path,
        *,
        head: bool,
    ) -> bool:
        try:
            file = path.open("rb")
        except OSError:
            return await self._write(
                conn,
                stream,
                error(
                    410,
                    "result_gone",
                    "the fetched result is no longer kept ([fetch] "
                    "results_max_age_seconds, results_max_bytes); fetch it again",
                ),
            )
        with file:
            size = os.fstat(file.fileno()).st_size
            headers = [
                ("Content-Type", response.content_type),
                ("Content-Length", str(size)),
                ("Cache-Control", "no-store"),
                *response.headers,
            ]
            with anyio.fail_after(self.limits.write_timeout):
                await stream.send(
                    conn.send(
                        h11.Response(
                            status_code=response.status,
                            headers=headers,
                            reason=_reason(response.status),
                        )
                    )
                    or b""
                )
            left = 0 if head else size
            while left > 0:
                chunk = await anyio.to_thread.run_sync(file.read, min(left, _FILE_CHUNK))
                if not chunk:  # the file shrank: the promised length cannot be kept
                    return False
                left -= len(chunk)
                with anyio.fail_after(self.limits.write_timeout):
                    await stream.send(conn.send(h11.Data(data=chunk)) or b"")
            with anyio.fail_after(self.limits.write_timeout):
                await stream.send(conn.send(h11.EndOfMessage()) or b"")
        return True


def _content_length(event: h11.Request) -> int | None:
    for name, value in event.headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _request(head: h11.Request, body: bytes, peer: Peer) -> Request:
    target = urlsplit(head.target.decode("ascii", "replace"))
    raw_path = unquote_to_bytes(target.path)
    try:
        path = raw_path.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(
            error(400, "bad_path", "the path is not UTF-8 once percent-decoded", "path"), "bad_path"
        ) from None
    query: dict[str, str] = {}
    try:
        for key, value in parse_qsl(
            target.query,
            keep_blank_values=True,
            strict_parsing=False,
            errors="strict",
            max_num_fields=32,
        ):
            query[key] = value
    except (ValueError, UnicodeDecodeError):
        raise _Refused(
            error(
                400,
                "bad_query",
                "the query string does not parse (UTF-8, at most 32 fields)",
                "query",
            ),
            "bad_query",
        ) from None
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
    return Request(
        method=head.method.decode("ascii", "replace"),
        path=path,
        raw_path=target.path,
        query=query,
        headers=headers,
        body=body,
        peer=peer,
    )


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""
