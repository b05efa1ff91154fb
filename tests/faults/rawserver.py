"""A deliberately hostile HTTP/1.1 server on plain sockets, for what the simulator cannot do.

Each path under ``/jobs/`` names a behaviour; every request's head is kept (bounded) so a test
can see which headers arrived. Each connection has its own thread and a hard time limit, so a
client that stops reading costs the server nothing it cannot give back.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HEAD_LIMIT = 64 * 1024
CONNECTION_SECONDS = 30.0


@dataclass
class Seen:
    path: str
    head: bytes


def _head(body: bytes, *extra: bytes, status: bytes = b"200 OK") -> bytes:
    lines = [
        b"HTTP/1.1 " + status,
        b"Content-Type: application/json",
        b"Connection: close",
        b"Content-Length: " + str(len(body)).encode(),
        *extra,
        b"",
        b"",
    ]
    return b"\r\n".join(lines)


def _slow_head(conn: socket.socket, stop: threading.Event) -> None:
    """Slowloris: the status line, then one header byte every 0.2 s, never the blank line."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nX-Slow: ")
    while not stop.wait(0.2):
        conn.sendall(b"a")


def _slow_body(conn: socket.socket, stop: threading.Event) -> None:
    """A complete head promising 100 bytes, then one body byte every 0.2 s."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: 100\r\n\r\n{"
    )
    while not stop.wait(0.2):
        conn.sendall(b" ")


def _endless(conn: socket.socket, stop: threading.Event) -> None:
    """A chunked body that never ends."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b" " * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    while not stop.is_set():
        conn.sendall(frame)


def _big_header(conn: socket.socket, stop: threading.Event) -> None:
    """A 10 MB header value."""
    body = b'{"status": "running"}'
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nX-Huge: "
    )
    block = b"h" * 65536
    for _ in range(160):  # 10 MiB
        if stop.is_set():
            return
        conn.sendall(block)
    conn.sendall(b"\r\n\r\n" + body)


def _bad_utf8(conn: socket.socket, stop: threading.Event) -> None:
    body = b'{"status": "runn\xff\xfe\xc3\x28ing", "x": "\xed\xa0\x80"}'
    conn.sendall(_head(body) + body)


_BOMB: bytes | None = None


def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzip-compressed (about 1 MiB): made once per process."""
    global _BOMB
    if _BOMB is None:
        member = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
        _BOMB = member * 16  # concatenated gzip members decode to 1 GiB
    return _BOMB


def _bomb(conn: socket.socket, stop: threading.Event) -> None:
    body = gzip_bomb()
    conn.sendall(_head(body, b"Content-Encoding: gzip") + body)


def _late(conn: socket.socket, stop: threading.Event) -> None:
    """A well-formed answer after 1.5 s: slow, but inside a 3 s timeout."""
    if stop.wait(1.5):
        return
    body = b'{"status": "running"}'
    conn.sendall(_head(body) + body)


def _status_999(conn: socket.socket, stop: threading.Event) -> None:
    body = b'{"status": "running"}'
    conn.sendall(_head(body, status=b"999 Beyond") + body)


def _deep(conn: socket.socket, stop: threading.Event) -> None:
    """4 KB of JSON nested 2,000 levels deep: under any size cap, over a decoder's stack."""
    body = b"[" * 2000 + b"]" * 2000
    conn.sendall(_head(body) + body)


BEHAVIOURS: dict[str, Callable[[socket.socket, threading.Event], None]] = {
    "status-999": _status_999,
    "deep": _deep,
    "slow-head": _slow_head,
    "slow-body": _slow_body,
    "endless": _endless,
    "big-header": _big_header,
    "bad-utf8": _bad_utf8,
    "gzip-bomb": _bomb,
    "late": _late,
}


@dataclass
class RawServer:
    """Serves :data:`BEHAVIOURS` on 127.0.0.1 until :meth:`close`."""

    seen: list[Seen] = field(default_factory=list)
    #: Whole answers (head and body, as bytes) by the last path segment, for fuzzing.
    replies: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + CONNECTION_SECONDS
        conn.settimeout(5.0)
        done = threading.Event()
        watchdog = threading.Thread(target=self._limit, args=(done, deadline), daemon=True)
        watchdog.start()
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
            self.seen.append(Seen(path, head[:HEAD_LIMIT]))
            name = path.rsplit("/", 1)[-1]
            reply = self.replies.get(name)
            if reply is not None:
                conn.sendall(reply)
                return
            behaviour = BEHAVIOURS.get(name)
            if behaviour is None:
                body = b'{"error": "no such behaviour"}'
                conn.sendall(_head(body, status=b"404 Not Found") + body)
                return
            behaviour(conn, done)
        except OSError:
            return  # the client gave up: what the behaviour is for
        finally:
            done.set()
            conn.close()

    def _limit(self, done: threading.Event, deadline: float) -> None:
        done.wait(max(0.0, deadline - time.monotonic()))
        done.set()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accepter.join(5)
        for t in self._threads:
            t.join(CONNECTION_SECONDS + 5)
