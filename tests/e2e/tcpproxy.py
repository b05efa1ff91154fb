"""A TCP proxy the test controls, between a node and PostgreSQL: ``cut()`` closes every
connection and refuses new ones (each accepted and closed at once) until ``restore()``;
``stall()`` keeps every connection open and forwards nothing either way (new ones are accepted
and held) until ``restore()``: a server that stopped answering, with no reset to notice."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._cut = threading.Event()
        self._stall = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        held: list[socket.socket] = []  # accepted while stalled, not yet connected upstream
        stalled = False
        while not self._stop.is_set():
            if self._cut.is_set() and peers:
                for s in list(peers):
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(s)
                    s.close()
                peers.clear()
            if self._stall.is_set() != stalled:
                stalled = not stalled
                for s in peers:
                    if stalled:
                        sel.unregister(s)
                    else:
                        sel.register(s, selectors.EVENT_READ)
                while held and not stalled:
                    self._connect(held.pop(), sel, peers)
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    try:
                        client, _ = self.listener.accept()
                    except BlockingIOError:
                        continue
                    if self._cut.is_set():
                        client.close()
                    elif stalled:
                        held.append(client)
                    else:
                        self._connect(client, sel, peers)
                    continue
                other = peers.get(sock)
                if other is None:
                    continue
                try:
                    data = sock.recv(65536)
                    if data:
                        other.setblocking(True)
                        other.sendall(data)
                        other.setblocking(False)
                        continue
                except OSError:
                    pass
                for s in (sock, other):
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(s)
                    s.close()
                    peers.pop(s, None)
        for s in [*peers, *held]:
            s.close()
        self.listener.close()

    def _connect(
        self,
        client: socket.socket,
        sel: selectors.BaseSelector,
        peers: dict[socket.socket, socket.socket],
    ) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=3)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        peers[client], peers[upstream] = upstream, client

    def cut(self) -> None:
        self._cut.set()

    def stall(self) -> None:
        self._stall.set()

    def restore(self) -> None:
        self._cut.clear()
        self._stall.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@contextmanager
def proxy_to(host: str, port: int) -> Iterator[Proxy]:
    p = Proxy((host, port))
    try:
        yield p
    finally:
        p.close()
