"""The engine: the middle of the daemon, one module per job (the map: daemon/ARCHITECTURE.md).

* ``pacing``     provider quotas, in-flight slots and fair shares between registrants,
                 limits settable while running, and one pacing shared by every engine of
                 a sharded node (``SharedPacing``);
* ``chain``      one log: append and retry, fold, snapshots, recovery, the lease gate, and
                 ``handle``, the one path that decides and records;
* ``followers``  the in-memory projections fed by the chain (live counts, stories, waiters,
                 metrics and escalation notices);
* ``poller``     each operation's timer and the poll sequence around ``replay.decide``;
* ``intake``     registrations, submits, fetches, decisions and withdrawals as typed
                 commands, and every authorization rule: the one door;
* ``spooling``   the spool's side of that door (files in, receipts out);
* ``supervisor`` composition and lifecycle.

Each imports only the ones listed before it (``tests/test_layers.py``); none imports the
local API, which :mod:`daemon.supervisor` attaches as an edge.
"""
