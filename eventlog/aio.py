"""``fdatasync`` without a thread: Linux native AIO (``IOCB_CMD_FDSYNC``), completed on an eventfd.

Why: the event loop must never block on ``fdatasync``, and handing it to a thread costs far more
than the call. A second Python thread shares the GIL with the event loop: every system call
either thread makes is a chance for a hand-off, each a pair of context switches, and under load
that (not the writing) was the log's largest cost, about 180 µs of CPU per status request.
Here the event loop writes the round itself (a ``write`` into the page cache) and submits the
``fdatasync`` to the kernel, which runs it on a kernel worker and signals an eventfd the loop
already watches. No Python thread runs, so nothing waits for the GIL.

Since Linux 4.18 the kernel accepts ``IOCB_CMD_FDSYNC`` for any file whose file system has an
``fsync`` (ext4, xfs, btrfs, tmpfs...). glibc wraps none of the ``io_*`` calls, so they are made
through ``syscall(2)`` with the architecture's numbers; on an architecture not listed here, a
big-endian one, or a kernel that refuses, :func:`open_ring` returns None and the writer keeps
its thread.

The completion is the kernel's own ``fdatasync`` result: 0, or a negative errno (``-EIO``) that
the writer treats exactly like a failed ``os.fdatasync``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
import sys

#: (io_setup, io_destroy, io_getevents, io_submit) by ``platform.machine()``.
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),  # the generic table (asm-generic/unistd.h)
    "arm64": (0, 1, 4, 2),
    "riscv64": (0, 1, 4, 2),
}
_IOCB = struct.Struct("<QIIHhIQQqQII")  # struct iocb, little-endian (64 bytes)
_EVENT = struct.Struct("<QQqq")  # struct io_event: data, obj, res, res2
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_EVENTS = 4  # room in the context; the writer keeps one fdatasync in flight at a time


class SyncRing:
    """One AIO context and its eventfd: submit an ``fdatasync``, learn its result later.

    One operation is in flight at a time (the writer's rounds are sequential). The eventfd
    becomes readable when it completes; :meth:`reap` then returns its result.
    """

    def __init__(self, numbers: tuple[int, int, int, int]) -> None:
        self._setup, self._destroy, self._getevents, self._submit = (
            ctypes.c_long(n) for n in numbers
        )
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ctx = ctypes.c_ulong(0)
        if self._call(self._setup, ctypes.c_long(_EVENTS), ctypes.byref(self._ctx)) < 0:
            raise self._error("io_setup")
        try:
            self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            self._call(self._destroy, self._ctx)
            raise
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._iocbs = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size * _EVENTS)
        self._no_wait = _Timespec(0, 0)
        # The arguments of the two calls made per round, built once (ctypes conversions are
        # most of what such a call costs in Python).
        self._submit_args = (self._submit, self._ctx, ctypes.c_long(1), self._iocbs)
        self._reap_args = (
            self._getevents,
            self._ctx,
            ctypes.c_long(0),
            ctypes.c_long(_EVENTS),
            self._events,
            ctypes.byref(self._no_wait),
        )
        self.in_flight = False
        self.closed = False

    def fileno(self) -> int:
        """The eventfd: readable once the submitted ``fdatasync`` has completed."""
        return self._eventfd

    def submit(self, fd: int) -> None:
        """Start an ``fdatasync`` of ``fd``; raises ``OSError`` if the kernel refuses it."""
        _IOCB.pack_into(
            self._iocb,
            0,
            fd,
            0,
            0,
            _IOCB_CMD_FDSYNC,
            0,
            fd,
            0,
            0,
            0,
            0,
            _IOCB_FLAG_RESFD,
            self._eventfd,
        )
        if self._call(*self._submit_args) != 1:
            raise self._error("io_submit")
        self.in_flight = True

    def reap(self) -> int | None:
        """The completed ``fdatasync``'s result (0, or a negative errno), or None if it has not
        completed yet (a wake-up with nothing to collect)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._eventfd)
        got = self._call(*self._reap_args)
        if got < 0:
            raise self._error("io_getevents")
        if got == 0:
            return None
        self.in_flight = False
        return int(_EVENT.unpack_from(self._events, 0)[2])

    def wait(self, seconds: float) -> int | None:
        """Block (a thread, never the event loop) up to ``seconds`` for the result."""
        whole = int(seconds)
        limit = _Timespec(whole, int((seconds - whole) * 1e9))
        got = self._call(
            self._getevents,
            self._ctx,
            ctypes.c_long(1),
            ctypes.c_long(_EVENTS),
            self._events,
            ctypes.byref(limit),
        )
        if got < 0:
            raise self._error("io_getevents")
        if got == 0:
            return None
        self.in_flight = False
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._eventfd)
        return int(_EVENT.unpack_from(self._events, 0)[2])

    def close(self) -> None:
        """Release the context (the kernel waits for an operation still in flight)."""
        if self.closed:
            return
        self.closed = True
        self._call(self._destroy, self._ctx)
        os.close(self._eventfd)

    def _call(self, number: ctypes.c_long, *args: object) -> int:
        return int(self._syscall(number, *args))

    @staticmethod
    def _error(what: str) -> OSError:
        code = ctypes.get_errno() or errno.EIO
        return OSError(code, f"{what}: {os.strerror(code)}")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def open_ring(fd: int) -> SyncRing | None:
    """A ring proven to make ``fd`` durable on this kernel and file system, or None (the
    caller keeps its thread). Blocks for one ``fdatasync``: call it off the event loop."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or sys.byteorder != "little" or not sys.platform.startswith("linux"):
        return None
    try:
        ring = SyncRing(numbers)
    except (OSError, AttributeError):
        return None
    try:
        ring.submit(fd)
        result = ring.wait(30.0)
    except OSError:
        ring.close()
        return None
    if result != 0:
        ring.close()  # the kernel refused or the disk failed: the thread's path will say which
        return None
    return ring
