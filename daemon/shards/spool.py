"""The sharded node's spool: one directory for the node (``STATE/spool``, as on any node),
each file handed to the door of the shard its operation id names.

Every shard's engine is built with the node's spool directory
(:func:`daemon.shards.runtime.shard_config`) but without edges: none watches it. The node
watches it once (as :class:`daemon.engine.spooling.SpoolDoor` does: on every change, and a
rescan at least once a second), reads each file's operation id, and passes the file to the
spool door of that shard's engine when this node holds the shard; the door then does what
it does on an unsharded node (the owner's rights, the intake, the receipt or the
refusal). A file for a shard held elsewhere waits in the spool: it is ingested once this
node takes that shard (a relay through the database is issue 39's E). A file that cannot be
read for an id is handed to any held shard's door, which rejects it with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import msgspec
import watchfiles

from daemon import logfmt
from daemon.engine.chain import frames
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
    ) -> None:
        self.spool = spool
        self.shard_of = shard_of
        self.held = held

    async def ingest_all(self) -> None:
        """Hand every waiting file whose shard this node holds to that shard's door."""
        supervisors = self.held()
        if not supervisors:
            return
        first = supervisors[min(supervisors)]
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
                sup = first if op is None else supervisors.get(self.shard_of(op))
                if sup is None:
                    continue  # its shard is held elsewhere: it waits here
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
                    logfmt.error(
                        "internal error while ingesting a spool file; rejected",
                        file=path.name,
                        error=type(exc).__name__,
                        trace=frames(exc),
                    )
                    self.spool.reject(
                        path,
                        request_id_of(path),
                        f"internal error ({type(exc).__name__}) while ingesting; "
                        f"the daemon went on without it",
                        decision=decision,
                    )
        first.spool_door.prune()

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
