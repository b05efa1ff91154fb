"""What a sharded node answers its agents with: the router on its socket, the relay beside it.

Built once per node from its config (:func:`node_doors`). The node plugs in three things:
``router`` as its door's handler factory, ``relay.serve`` as a task of every active shard's
term (``serve(k, handler)``: it answers shard ``k``'s relayed writes while the node holds
``k``), and ``relay.run`` in its own task group for its whole life (the relay's connection
pool and its ``LISTEN``; without it a relayed write waits out its bound and answers 503).
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.api.server import Handler
from daemon.config import Config
from daemon.engine.intake import Authority
from daemon.shards.relay import Relay
from daemon.shards.router import ShardHost, ShardRouter
from eventlog.keys import KeyRing, keys_directory, load_keyring
from eventlog.pgstore import PgSettings
from eventlog.shards import Layout


@dataclass(frozen=True)
class Doors:
    layout: Layout
    relay: Relay

    def router(self, node: ShardHost) -> Handler:
        """The door's handler for ``node`` (a ``Router`` of :mod:`daemon.shards.runtime`)."""
        return ShardRouter(self.layout, node, self.relay, catch_up=self.relay.timeout).handle


def node_doors(
    cfg: Config,
    settings: PgSettings,
    layout: Layout,
    node: str,
    keyring: KeyRing | None = None,
) -> Doors:
    """The doors of node ``node`` of ``layout`` (``settings``: the catalog's, the DSN's own
    schema): roles from this host's groups as ``[api]`` configures them, a relayed write
    waited for ``[api] request_timeout_seconds`` (plus its ``?wait=``)."""
    ring = keyring if keyring is not None else load_keyring(keys_directory(cfg.keys_dir))
    relay = Relay(
        settings,
        layout,
        node,
        ring,
        authority=Authority(cfg),
        timeout=cfg.api.request_timeout_seconds,
    )
    return Doors(layout, relay)
