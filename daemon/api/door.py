"""One API socket for a node's whole life, answered by what the node is at the moment.

With the log in PostgreSQL a node is a standby, then the active node for a term, and maybe a
standby again. The socket is opened once (or inherited once from systemd: an inherited
socket cannot be opened a second time) and stays open across those changes, so a client
never finds nothing there while the node runs: the standby's reads answer it, or the active
node's API, or, for the moment between the two, a 503 with ``Retry-After`` saying why.
"""

from __future__ import annotations

import contextlib
import os

import anyio
import anyio.abc

from daemon import logfmt
from daemon.api.listener import open_listener
from daemon.api.server import ApiServer, Count, Handler, Limits, Request, Response, error
from daemon.config import Config


class ApiDoor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._handler: Handler = self._between
        self._count: Count = lambda reason: None
        self._why = "this node is starting"

    def answer_with(self, handler: Handler, count: Count | None = None) -> None:
        """From now on ``handler`` answers every request (those already in flight finish
        with the handler they started with)."""
        self._handler = handler
        self._count = count or (lambda reason: None)

    def between(self, why: str) -> None:
        """Answer 503 (``Retry-After: 1``) saying ``why`` until the next :meth:`answer_with`:
        the node is changing from standby to active or back."""
        self._why = why
        self.answer_with(self._between)

    async def _between(self, request: Request) -> Response:
        return error(
            503, "changing_role", f"{self._why}; ask again in a moment", headers=_RETRY_SOON
        )

    async def _dispatch(self, request: Request) -> Response:
        return await self._handler(request)

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the socket and answer on it until cancelled; removes a socket it bound."""
        cfg = self.config.api
        listener, where, bound = await open_listener(
            self.config.socket_path, mode=int(cfg.socket_mode, 8), group=cfg.socket_group
        )
        server = ApiServer(
            self._dispatch,
            limits=Limits(
                max_connections=cfg.max_connections,
                max_connections_per_user=cfg.max_connections_per_user,
                request_timeout=cfg.request_timeout_seconds,
            ),
            count=lambda reason: self._count(reason),
        )
        logfmt.info("api listening", socket=where, inherited=not bound)
        task_status.started(where)
        try:
            async with listener:
                await server.serve(listener)
        finally:
            if bound:
                with contextlib.suppress(OSError):
                    os.unlink(where)


_RETRY_SOON = [("Retry-After", "1")]
