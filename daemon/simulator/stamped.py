"""The simulator's sockets, each received chunk stamped by the kernel as it arrived.

The simulator is the provider's witness: a request's ``wall`` is when its head reached the
provider's host, and the tests judge quotas and lease terms by it. Stamped when the
simulator's own code got round to it, that time would include the simulator's scheduling:
in a test process whose other threads hold the GIL, on a machine whose cores are all busy,
tens to hundreds of milliseconds; enough to move a request sent inside a quota window or a
lease term out of it. The kernel stamps each segment as it lands (``SO_TIMESTAMPNS``) and
``recvmsg`` hands the stamp over with the bytes; this module reads sockets that way.

Where the kernel gives no stamp (not Linux), :attr:`StampedStream.arrived` stays None and
the simulator reads its clock as it parses, as before.
"""

from __future__ import annotations

import contextlib
import errno
import platform
import select
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

#: ``SO_TIMESTAMPNS`` (``SO_TIMESTAMPNS_OLD``: a native ``struct timespec``), which Python's
#: socket module does not name: 35 where Linux uses the generic socket options (elsewhere,
#: alpha, mips, parisc, sparc, other numbers mean other options: no stamps there).
_GENERIC_SOCKET_OPTIONS = {"x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "riscv64"}
_MACHINE = platform.machine().lower()
_SO_TIMESTAMPNS = (
    35
    if sys.platform.startswith("linux")
    and (_MACHINE in _GENERIC_SOCKET_OPTIONS or _MACHINE.startswith("arm"))
    else None
)
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_T = TypeVar("_T")
#: How long :func:`listen` waits for the kernel to stamp arriving segments.
_STAMPING_WAIT = 2.0
#: Accepting failed for want of descriptors or memory: wait this long and try again.
_ACCEPT_BACKOFF = 0.1


class StampedStream:
    """A connected TCP socket read with ``recvmsg``; ``arrived`` is the kernel's wall-clock
    time of the last chunk :meth:`receive` returned (None without one)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stamped = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._stamped = True
            except OSError:
                pass
        self.sock = sock
        self.arrived: float | None = None

    async def receive(self, max_bytes: int) -> bytes:
        """The next bytes (at most ``max_bytes``); :class:`anyio.EndOfStream` at the end."""
        room = _ANCILLARY if self._stamped else 0
        data, ancillary, _flags, _address = await self._io(
            lambda: self.sock.recvmsg(max_bytes, room), anyio.wait_readable
        )
        if not data:
            raise anyio.EndOfStream
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack(raw[: _TIMESPEC.size])
                self.arrived = seconds + nanoseconds / 1e9
        return data

    async def send(self, data: bytes) -> None:
        """All of ``data``, waiting while the peer's window is full."""
        view = memoryview(data)
        while view:
            sent = await self._io(partial(self.sock.send, view), anyio.wait_writable)
            view = view[sent:]

    async def _io(
        self, call: Callable[[], _T], wait: Callable[[socket.socket], Awaitable[None]]
    ) -> _T:
        """``call()`` on the non-blocking socket, waiting with ``wait`` until it can go; a
        reset is a :class:`ConnectionError`, any other failure a broken resource."""
        while True:
            if self.sock.fileno() < 0:
                raise anyio.ClosedResourceError
            try:
                return call()
            except (BlockingIOError, InterruptedError):
                await wait(self.sock)
            except ConnectionError:
                raise
            except OSError as exc:
                raise anyio.BrokenResourceError(str(exc)) from exc

    def reset_on_close(self) -> None:
        """``SO_LINGER`` on with a zero timeout: closing discards unsent data and sends RST."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def aclose(self) -> None:
        self.sock.close()
        await anyio.lowlevel.checkpoint()


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking TCP listening socket on ``host`` (an address or ``localhost``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=128)
    listener.setblocking(False)
    if _SO_TIMESTAMPNS is not None:
        # Accepted sockets inherit the option, and the bytes of a connection not accepted yet
        # are stamped too once the kernel stamps at all (below).
        with contextlib.suppress(OSError):
            listener.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            _wait_until_stamping(listener)
    return listener


def _wait_until_stamping(listener: socket.socket) -> None:
    """Return once the kernel stamps arriving segments (at most :data:`_STAMPING_WAIT` s).

    The first socket to ask turns stamping on through deferred work in the kernel, and the
    last one closed turns it off the same way: a request sent in the first moments after
    ``listen`` would land unstamped, and be stamped when parsed instead. So: send a byte to
    the listener from a probe connection until the byte comes with a stamp."""
    address = listener.getsockname()[:2]
    deadline = time.monotonic() + _STAMPING_WAIT
    while time.monotonic() < deadline:
        with socket.create_connection(address, timeout=1.0) as probe:
            readable, _, _ = select.select([listener], [], [], 1.0)
            if not readable:
                continue
            accepted, _peer = listener.accept()
            with accepted:
                accepted.settimeout(1.0)
                probe.sendall(b".")
                _data, ancillary, _flags, _address = accepted.recvmsg(1, _ANCILLARY)
        if any(kind == _SO_TIMESTAMPNS for _level, kind, _raw in ancillary):
            return
        time.sleep(0.005)


async def serve_stamped(
    listener: socket.socket, handler: Callable[[StampedStream], Coroutine[Any, Any, None]]
) -> None:
    """Accept on ``listener`` until cancelled, each connection handled in its own task; the
    listener is closed on the way out."""
    try:
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.wait_readable(listener)
                try:
                    sock, _peer = listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        raise
                    await anyio.sleep(_ACCEPT_BACKOFF)
                    continue
                tg.start_soon(handler, StampedStream(sock))
    finally:
        listener.close()
