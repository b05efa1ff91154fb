"""Accepting connections without dying of a full descriptor table.

An ``accept`` that fails for want of file descriptors (EMFILE, ENFILE, ...) is a moment to
wait, not a reason to end the listener and, with it, the daemon: the loop backs off and tries
again, logging once when it starts and once when it recovers. Shared by the metrics listener
and the local API.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.abc

from daemon import logfmt

OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


async def accepted(
    listener: anyio.abc.SocketListener, name: str, on_exhausted: Callable[[], None] = lambda: None
) -> AsyncIterator[anyio.abc.SocketStream]:
    """Each accepted connection, forever; ``name`` prefixes the log lines."""
    failing = False
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            if not failing:
                logfmt.warn(
                    f"{name}: out of file descriptors; not accepting for now", error=exc.strerror
                )
                on_exhausted()
            failing = True
            await anyio.sleep(0.2)
            continue
        if failing:
            logfmt.info(f"{name}: accepting connections again")
            failing = False
        yield stream
