"""The sharded node's spool: one directory for the node (``STATE/spool``, as on any node),
each file handed to the door of the shard its operation id names.

Every shard's engine is built with the node's spool directory
(:func:`daemon.shards.runtime.shard_config`) but without edges: none watches it. The node
watches it once (as :class:`daemon.engine.spooling.SpoolDoor` does: on every change, and a
rescan at least once a second), reads each file's operation id, and passes the file to the
spool door of that shard's engine when this node holds the shard; the door then does what
it does on an unsharded node (the owner's rights, the intake, the receipt or the
refusal). A file that cannot be read for an id is handed to any held shard's door, which
rejects it with its reason.

A file for a shard held elsewhere waits in the spool, as it would for a daemon that is not
running: it is ingested if this node takes that shard within ``grace`` (the node passes two
lease lengths: long enough for a shard moving here to arrive, for a restarted node to take
its share back). Past that it is moved to ``spool/rejected`` with a reason that names the
fix: a node may never hold that shard, and a request waiting for ever is a request lost.
The reason asks for the API (``bide watch``/``submit``/``decide`` talk to the running daemon,
and the router relays the request to the shard's holder) or the holder's own spool. A
file that cannot be read for an id waits and is rejected the same way while this node holds
no shard to read it with. Spool files are not relayed: a submit's and a fetch's receipt is
written when the action ends, on the spool of the node that ran it, which is the holder's;
a decision's approval is read from the file's owner and directory on this host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import msgspec
import watchfiles

from daemon import logfmt
from daemon.engine.spooling import reject_broken
from daemon.errors import Refused
from daemon.spool import (
    DecisionFile,
    FetchFile,
    RegistrationFile,
    Spool,
    SubmitFile,
    decode_incoming,
    request_id_of,
)
from daemon.supervisor import Supervisor
from eventlog.errors import FencedError


def operation_of(path: Path, spool: Spool, *, decision: bool) -> str | None:
    """The operation a spool file is about, or None when it cannot be read for one."""
    try:
        data, _ = spool.read(path)
        if decision:
            return msgspec.json.decode(data, type=DecisionFile).operation_id
        request = decode_incoming(data)
    except (Refused, msgspec.ValidationError, msgspec.DecodeError):
        return None
    if isinstance(request, RegistrationFile | SubmitFile):
        return request.registration.operation_id
    assert isinstance(request, FetchFile)
    return request.operation_id


class NodeSpool:
    def __init__(
        self,
        spool: Spool,
        shard_of: Callable[[str], int],
        held: Callable[[], Mapping[int, Supervisor]],
        *,
        grace: float = float("inf"),
        holder_of: Callable[[int], str | None] = lambda shard: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool = spool
        self.shard_of = shard_of
        self.held = held
        #: How long a file waits for its shard to be held here before it is rejected.
        self.grace = grace
        self.holder_of = holder_of  # the node holding a shard, when known (for the reason)
        self.clock = clock
        self._waiting: dict[Path, float] = {}  # a file held elsewhere -> first seen waiting

    async def ingest_all(self) -> None:
        """Hand every waiting file whose shard this node holds to that shard's door; reject
        one that waited ``grace`` for a shard held elsewhere."""
        supervisors = self.held()
        first = supervisors[min(supervisors)] if supervisors else None
        now = self.clock()
        seen: set[Path] = set()
        for directory, decision in ((self.spool.incoming, False), (self.spool.decisions, True)):
            try:
                waiting = self.spool.pending(directory)
            except OSError as exc:
                logfmt.warn(
                    "cannot list the spool; trying again at the next scan",
                    directory=directory,
                    error=exc.strerror,
                )
                continue
            for path in waiting:
                op = operation_of(path, self.spool, decision=decision)
                shard = None if op is None else self.shard_of(op)
                sup = first if shard is None else supervisors.get(shard)
                if sup is None:  # its shard is held elsewhere: it waits here, for a while
                    seen.add(path)
                    since = self._waiting.setdefault(path, now)
                    if now - since >= self.grace:
                        self._reject_unheld(path, op, shard, decision=decision)
                    continue
                self._waiting.pop(path, None)
                door = sup.spool_door
                try:
                    if decision:
                        if door.decisions_safe():
                            await door.ingest_decision(path)
                    else:
                        await door.ingest_incoming(path)
                except FencedError:
                    continue  # that shard's term ended: left for its next holder
                except Exception as exc:  # the barrier: one file, not all
                    reject_broken(self.spool, path, exc, decision=decision)
        for gone in set(self._waiting) - seen:  # ingested, rejected or taken away
            del self._waiting[gone]
        if first is not None:
            first.spool_door.prune()

    def _reject_unheld(
        self, path: Path, op: str | None, shard: int | None, *, decision: bool
    ) -> None:
        """Move a file that waited ``grace`` for its shard to ``spool/rejected``, with a
        reason that says what to do instead."""
        waited = f"{self.grace:g}s"
        if shard is None:
            what = f"this node held no shard to read it with for {waited}"
        else:
            holder = self.holder_of(shard)
            where = f"node {holder}" if holder else "another node (or none now)"
            what = (
                f"operation {op} is in shard {shard}, held by {where}, and this node did not "
                f"take that shard within {waited}; a sharded node's spool is not relayed"
            )
        reason = (
            f"{what}: send the request through the API instead (bide watch, bide submit "
            f"and bide decide use it while the daemon answers; it relays the request to the "
            f"shard's holder), or drop the file in the spool of the node holding the shard"
        )
        logfmt.warn("spool file rejected", file=path.name, reason=reason)
        self._waiting.pop(path, None)
        self.spool.reject(path, request_id_of(path), reason, decision=decision)

    async def watch(self, stopping: anyio.Event) -> None:
        """Ingest on every change, and rescan at least once a second (a shard taken since
        the last change gets its waiting files within a second)."""
        async for _ in watchfiles.awatch(
            self.spool.incoming,
            self.spool.decisions,
            stop_event=stopping,
            debounce=20,
            step=10,
            rust_timeout=1000,
            yield_on_timeout=True,
        ):
            await self.ingest_all()
