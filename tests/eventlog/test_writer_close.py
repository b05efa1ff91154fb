"""Closing a writer whose term was cancelled (its lease fenced, say) while a round was still on
its way to the database: the writer's thread stops, its file closes and its lock goes, so the
same process can open the log again (a shard taken again by the node that was fenced off it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from eventlog.errors import FencedError
from eventlog.lock import WriterLock
from eventlog.store import StoredLine
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet

pytestmark = pytest.mark.anyio

#: How long the fenced database takes to refuse a round (a commit waiting on a lock there).
STALL = 0.3


class FencingStore:
    """A log's durable store that accepts rounds until :attr:`fenced` is set, then refuses
    each one after :data:`STALL` seconds, as a database does whose lease another node took
    while it was slow to answer. The whole :class:`eventlog.store.LineStore` interface."""

    def __init__(self) -> None:
        self.lines: list[StoredLine] = []
        self.fenced = threading.Event()
        self.refused = 0

    def commit(self, lines: Sequence[StoredLine], prev_hash: str) -> None:
        if self.fenced.is_set():
            threading.Event().wait(STALL)
            self.refused += 1
            raise FencedError("append refused: another node took the lease")
        self.lines.extend(lines)

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        return [line for line in self.lines if line.seq > seq][:limit]

    def save_snapshot(self, seq: int, record_hash: str, data: bytes) -> bool:
        return False

    def load_snapshot(self) -> bytes | None:
        return None


async def test_a_term_cancelled_with_a_round_in_flight_leaves_the_log_unlocked(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    # Writer threads other tests of this process left behind are not this term's.
    others = {t for t in threading.enumerate() if t.name == "bide-log-writer"}
    store = FencingStore()
    told = anyio.Event()
    ended: list[BaseException] = []
    try:
        async with anyio.create_task_group() as term:

            async def keep() -> None:
                """The lease's keeper: told of the refused append, it ends the term."""
                await told.wait()
                raise FencedError("the lease is no longer this node's")

            async def engine() -> None:
                async with LogWriter(
                    log, ks.keyring(), ks.signer(), checkpoint_interval=0.05, store=store
                ) as w:
                    await w.append(b"before the fence")
                    store.fenced.set()
                    # Refused after STALL; meanwhile the ticker queues a periodic checkpoint,
                    # refused STALL later still: in flight when the term is cancelled.
                    try:
                        await w.append(b"after the fence")
                    except FencedError:
                        told.set()
                    await anyio.sleep_forever()

            term.start_soon(keep)
            term.start_soon(engine)
    except* FencedError as group:
        ended.extend(group.exceptions)
    assert [str(e) for e in ended] == ["the lease is no longer this node's"]
    assert store.refused >= 1
    # The term is over: the log's lock is free for this process's next term.
    lock = WriterLock(log)
    lock.acquire()
    lock.release()
    assert not [t for t in threading.enumerate() if t.name == "bide-log-writer" and t not in others]
