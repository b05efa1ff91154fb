"""The daemon's composition root: the engine (:mod:`daemon.engine`) plus its edges.

The engine owns the log, the timers, the quotas, the intake and every status request, and
imports nothing of the local API; this module attaches the API (:mod:`daemon.api`) to it. It
keeps the import path ``daemon.supervisor`` that ``bide run``, the node and the demo use. The
map of the engine is ``daemon/ARCHITECTURE.md``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import anyio
import anyio.abc

from daemon import logfmt
from daemon.engine.chain import RequestGate
from daemon.engine.supervisor import DRAIN_SECONDS
from daemon.engine.supervisor import Supervisor as Engine

__all__ = ["DRAIN_SECONDS", "RequestGate", "Supervisor"]


class Supervisor(Engine):
    """The engine, serving the local API when ``[api] enabled``."""

    async def serve_api(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The local API on its Unix socket, answered from the engine's memory."""
        from daemon.api.listener import open_listener
        from daemon.api.server import ApiServer, Limits
        from daemon.api.service import Api

        cfg = self.config.api
        listener, where, bound = await open_listener(
            self.config.socket_path, mode=int(cfg.socket_mode, 8), group=cfg.socket_group
        )
        api = Api(self)

        async def handle(request: Any) -> Any:
            self.metrics.api_requests += 1
            return await api.handle(request)

        def count(reason: str) -> None:
            self.metrics.api_rejections[reason] += 1

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
