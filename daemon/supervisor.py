"""The daemon's composition root: the engine (:mod:`daemon.engine`) plus its edges.

The engine owns the log, the timers, the quotas, the intake and every status request, and
imports nothing of the local API; this module attaches the API (:mod:`daemon.api`) to it. It
keeps the import path ``daemon.supervisor`` that ``bide run``, the node and the demo use. The
map of the engine is ``daemon/ARCHITECTURE.md``.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from daemon import logfmt
from daemon.engine.chain import RequestGate
from daemon.engine.supervisor import DRAIN_SECONDS
from daemon.engine.supervisor import Supervisor as Engine

if TYPE_CHECKING:
    from daemon.api.door import ApiDoor
    from daemon.api.server import Count, Handler, Request, Response

__all__ = ["DRAIN_SECONDS", "RequestGate", "Supervisor"]


class Supervisor(Engine):
    """The engine, serving the local API when ``[api] enabled``."""

    #: The node's socket (the log in PostgreSQL), open across its terms; None: this
    #: supervisor opens its own.
    door: ApiDoor | None = None

    async def serve_api(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The local API on its Unix socket, answered from the engine's memory."""
        from daemon.api.listener import open_listener
        from daemon.api.server import ApiServer, Limits

        handle, count = self.api_handler()
        if self.door is not None:
            self.door.answer_with(handle, count)
            self.api_socket = str(self.config.socket_path)
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self.door.between("this node is leaving the active role")
        cfg = self.config.api
        listener, where, bound = await open_listener(
            self.config.socket_path, mode=int(cfg.socket_mode, 8), group=cfg.socket_group
        )
        server = ApiServer(
            handle,
            limits=Limits(
                max_connections=cfg.max_connections,
                max_connections_per_user=cfg.max_connections_per_user,
                request_timeout=cfg.request_timeout_seconds,
            ),
            count=count,
        )
        self.api_socket = where
        logfmt.info("api listening", socket=where, inherited=not bound)
        task_status.started()
        try:
            async with listener:
                await server.serve(listener)
        finally:
            if bound:
                with contextlib.suppress(OSError):
                    os.unlink(where)

    def api_handler(self) -> tuple[Handler, Count]:
        """The API's answers from this engine's memory, and the count of its refusals."""
        from daemon.api.service import Api

        api = Api(self)

        async def handle(request: Request) -> Response:
            self.metrics.api_requests += 1
            return await api.handle(request)

        def count(reason: str) -> None:
            self.metrics.api_rejections[reason] += 1

        return handle, count
