"""The sharded node (issue 39): a log split into shards in PostgreSQL, each with its own lease
and epoch, divided among the live nodes.

* :mod:`daemon.shards.assign`: which shards a node should take and hand over (pure).
* :mod:`daemon.shards.membership`: the node's heartbeat row in ``bide_nodes``.
* :mod:`daemon.shards.links`: the node's connections for every shard (two pools, one
  ``LISTEN`` whose news wakes only the shards that moved).
* :mod:`daemon.shards.quota`: each provider's quota divided among the live nodes.
* :mod:`daemon.shards.spool`: the node's one spool, each file handed to its shard's door.
* :mod:`daemon.shards.metricspage`: the node's ``/metrics``, every shard's page labelled.
* :mod:`daemon.shards.runtime`: :class:`~daemon.shards.runtime.ShardNode`, one process with
  one API door, one metrics listener, signals and systemd notify, and per shard a term loop
  (standby reads, or an engine supervisor built without edges under the shard's lease).
"""
