"""The log writer: the recipe layer that picks nonces, key ids and associated data.

Theory of operation:
    * One writer per log directory, enforced by an ``flock`` the kernel drops if we die.
    * On open the whole chain is verified with the signer's own public key -- or, given a
      ``resume`` position that still names its record (a state snapshot's), only what was
      appended after it: what came before was verified when that position was taken. A torn tail
      (crash artifact) is copied to ``quarantine/``, cut, and a ``recovery`` record naming the
      cut bytes is appended; any other damage refuses the open (:class:`DamagedLogError`).
    * Every write ends with a checkpoint or a ``seal`` record: an HMAC, under a key derived
      from the signing key, over the head it follows. On open, records after the last
      checkpoint that no valid seal covers are not adopted: they are copied to
      ``quarantine/``, cut, and named by a ``recovery`` record (``reason="unsealed"``), like a
      torn tail. A crash between two writes leaves such records (never acknowledged), and so
      does anyone who appends with the data key alone: the data key reads and encrypts
      payloads, but only the signing key's holder makes history the writer continues.
    * Appends are group-committed: callers queue payloads, and one round at a time frames,
      encrypts and writes everything queued with one ``write`` and one ``fdatasync``, then
      wakes every caller of the round at once. ``append`` returns only once its record is
      durable, and a task's appends keep their order because each waits for the previous one.
    * Who writes a round: where the kernel takes an asynchronous ``fdatasync``
      (:mod:`eventlog.aio`, probed on open), the event loop frames and writes a plain round
      itself and the kernel runs the ``fdatasync``, answering on an eventfd the loop watches:
      no thread, so no GIL hand-offs. A round that must write other files (a checkpoint,
      whose epoch key and signed head are files; a new segment), a round for a ``store``, and
      every round without a ring, goes to the writer thread, which wakes the loop with
      ``call_soon_threadsafe`` when it is done. The writer needs the asyncio backend.
    * A signed checkpoint is written every ``checkpoint_every`` records, every
      ``checkpoint_interval`` seconds even when idle, and (``final``) on clean close.
    * A failed write or fsync is never retried on the same file descriptor (after a failed
      fsync the kernel may have dropped the dirty pages): the writer marks itself failed and
      every later append raises :class:`LogIOError` until :meth:`LogWriter.reopen`, which
      re-verifies the tail from disk.
    * A failed batch was never acknowledged, and its caller will append it again: what it
      wrote is cut at once. Where the cut itself fails (the file system went read-only between
      two segments), ``reopen`` cuts those records first -- copied to ``quarantine/`` and
      named by a ``recovery`` record, like a torn tail -- so the retry never doubles them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc
import msgspec

from eventlog.aio import SyncRing, open_ring
from eventlog.boundary import verify_live
from eventlog.envelope import (
    ZERO_HASH,
    Checkpoint,
    Recovery,
    Seal,
    SealedEvent,
    Segment,
    Takeover,
    aad_prefix,
    associated_data_from,
    decode_record,
    encode_record,
    record_digest,
    record_hash,
)
from eventlog.errors import DamagedLogError, LogIOError, StoreError
from eventlog.fsync import fsync_dir
from eventlog.heads import HeadStore
from eventlog.keys import KeyRing, Signer
from eventlog.lock import WriterLock
from eventlog.mac import seal_ok, seal_tag
from eventlog.position import LogPosition
from eventlog.seal import NONCE_BYTES, Sealer
from eventlog.segments import QUARANTINE_DIR, SEGMENT_RE, list_segments, segment_name
from eventlog.signing import CheckpointSigning, SingleKey
from eventlog.store import LineStore, StoredLine, place_lines
from eventlog.verify import Report

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
DEFAULT_CHECKPOINT_EVERY = 1000
DEFAULT_CHECKPOINT_INTERVAL = 60.0
#: The largest round the event loop frames itself (records); a larger one goes to the thread.
LOOP_ROUND_RECORDS = 16
#: Random bytes drawn at once for nonces (:meth:`LogWriter._nonces`).
NONCE_POOL_BYTES = 64 * 1024


class Appended(msgspec.Struct, frozen=True):
    """Where a payload landed: its sequence number and record hash."""

    seq: int
    hash: str


class _RoundDone:
    """The end of one flush round, awaited by the appender of each of its batches (an
    ``asyncio.Event`` without its per-waiter bookkeeping: a round of a thousand appenders
    wakes a thousand futures and keeps no list to search). Event loop side only."""

    __slots__ = ("_loop", "_waiters", "is_set")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self.is_set = False

    async def wait(self) -> None:
        if self.is_set:
            return
        waiter = self._loop.create_future()  # cancelling one appender cancels only its own
        self._waiters.append(waiter)
        await waiter

    def set(self) -> None:
        self.is_set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


@dataclass
class _Batch:
    payloads: Sequence[bytes]
    done: _RoundDone  # shared by every batch of one flush round; set on the loop
    checkpoint: str | None = None  # "periodic" or "final": a checkpoint instead of payloads
    takeover: Takeover | None = None  # the checkpoint records a takeover
    results: list[Appended] | None = None
    error: BaseException | None = None


@dataclass
class _Framed:
    """One round framed and not yet written: its lines and the head state they lead to."""

    lines: list[bytes]
    rotate_at: list[int]  # indexes into lines where a new segment starts
    index: int  # the segment the last line lands in
    seq: int
    prev: str
    last_cp: str
    since_cp: int
    last_cp_seq: int | None
    signed: list[bytes]  # the checkpoint lines among them
    taken: list[int]  # lease epochs of the takeovers among them
    start_index: int  # where the round starts: what a failure cuts back to
    start_size: int


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _now_us() -> int:
    return time.time_ns() // 1000


class LogWriter:
    """Use as ``async with LogWriter(dir, keyring, signer) as log: await log.append(b"...")``.

    ``signer`` is a :class:`~eventlog.keys.Signer` (format 2: that key signs everything) or a
    :class:`~eventlog.signing.CheckpointSigning` such as
    :class:`~eventlog.epochs.EpochSigning` (format 3: forward-secure epoch keys). ``heads``
    remembers every signed checkpoint once durable and refuses, on open, a log behind or
    forking from the latest one (:mod:`eventlog.heads`).
    """

    def __init__(
        self,
        log_dir: Path,
        keyring: KeyRing,
        signer: Signer | CheckpointSigning,
        *,
        heads: HeadStore | None = None,
        on_problem: Callable[[str], None] | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
        resume: LogPosition | None = None,
        store: LineStore | None = None,
        sync: str = "auto",
    ) -> None:
        if sync not in ("auto", "thread"):
            raise ValueError(f"sync must be 'auto' or 'thread', not {sync!r}")
        self.log_dir = log_dir
        #: Where each round is made durable beyond this host (PostgreSQL), after the local
        #: fdatasync and before any append returns; None: the segment files are the truth.
        self.store = store
        self._keyring = keyring
        self._sealer = Sealer(keyring.get(keyring.active))
        self._signing = signer if isinstance(signer, CheckpointSigning) else SingleKey(signer)
        self._heads = heads
        # Called from the writer thread with a message naming a problem that did not fail a
        # write (the daemon logs it); stderr by default.
        self._on_problem = on_problem or _to_stderr
        self._segment_bytes = segment_bytes
        self._checkpoint_every = checkpoint_every
        self._checkpoint_interval = checkpoint_interval
        self._lock = WriterLock(log_dir)
        # Batches wait in ``_pending`` until the round before them is done; ``_round`` is the
        # event every batch of the next round shares, set once it is written or has failed.
        # One round at a time (``_busy``), written by the event loop (``_ring``) or by the
        # writer thread (``_job``). All four are guarded by ``_state_lock``; ``_cv`` (on the same
        # lock) is for the writer thread's sleep. The hot paths take ``_state_lock`` directly: its
        # ``with`` is one C call, the Condition's a Python method around it.
        self._sync = sync
        self._ring: SyncRing | None = None
        self._ring_round: tuple[_Framed, list[_Batch], _RoundDone] | None = None
        self._pending: list[_Batch] = []
        self._round: _RoundDone | None = None
        self._busy = False  # a round is being written
        self._dispatch_due = False  # a _dispatch is scheduled
        self._idle: asyncio.Event | None = None  # set once no round is pending or busy
        self._state_lock = threading.Lock()
        self._cv = threading.Condition(self._state_lock)
        self._job: tuple[Callable[[], None], _RoundDone] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = threading.Lock()  # the file and head state: the writer thread, or an open
        self._closing = False
        self._failed: LogIOError | None = None
        self._unacked_from: tuple[int, int, int] | None = None  # (segment, size, head seq)
        self._cuts: list[tuple[Path, int, bytes, str, str]] = []  # cut, not yet recorded
        self._acked_seq = -1
        self._fd = -1
        self._nonce_pool = b""
        self._nonce_at = 0
        self._tg: anyio.abc.TaskGroup | None = None
        # Head state, advanced only once a write is durable.
        self.log_id = ""
        self.head_seq = -1
        self.head_hash = ZERO_HASH
        self._last_cp_hash = ZERO_HASH
        self._last_cp_seq: int | None = None
        self._since_cp = 0
        self._lease_epoch = 0  # the last takeover record's (see Report.lease_epoch)
        self._promised_every = checkpoint_every
        self._segment_index = 0
        self._segment_size = 0
        self._head_len = 0  # the head record's line, newline included
        self.recovered: Recovery | None = None  # the last of ``recoveries``
        #: Every recovery record this writer appended (cuts of a torn tail, of records a
        #: failed write left, of records no seal covers), in order.
        self.recoveries: list[Recovery] = []
        #: The durable head, replaced whole (one store) after every write: safe to read from
        #: the event loop while the flusher thread writes.
        self.position: LogPosition | None = None
        self._resume = resume
        #: The record the open's verification resumed after (None: it verified everything).
        self.resumed_at: int | None = None
        #: Durable write rounds so far (one ``fdatasync`` each, however many records).
        self.flushes = 0

    @property
    def _mac_key(self) -> bytes:
        return self._signing.mac_key  # the current epoch's (format 3): it evolves with it

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> LogWriter:
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            await anyio.to_thread.run_sync(self._locked_open)
        except BaseException:
            self._lock.release()
            raise
        self._loop = asyncio.get_running_loop()
        if self._ring is not None:
            self._loop.add_reader(self._ring.fileno(), self._ring_done)
        self._thread = threading.Thread(
            target=self._writer_thread, name="bide-log-writer", daemon=True
        )
        self._thread.start()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._ticker)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            # The log stays valid up to its last durable record if this fails; reopen re-checks.
            with anyio.CancelScope(shield=True), contextlib.suppress(LogIOError):
                if self._failed is None:
                    await self._enqueue_checkpoint(final=True)
        finally:
            # A close in a cancelled scope (a fenced term) takes the cancellation at the group's
            # exit when a round was still in flight in it (the group waits for its tasks, then
            # raises it): the rest must run anyway, or the thread, the file and the lock stay
            # held by this process (its next writer on the log refused as "locked by" itself).
            try:
                self._closing = True
                assert self._tg is not None
                self._tg.cancel_scope.cancel()
                await self._tg.__aexit__(None, None, None)
            finally:
                try:
                    with anyio.CancelScope(shield=True):
                        await self._drained()
                        with self._cv:
                            self._stopping = True
                            self._cv.notify()
                        if self._thread is not None:
                            await anyio.to_thread.run_sync(self._thread.join)
                finally:
                    if self._ring is not None:
                        assert self._loop is not None
                        self._loop.remove_reader(self._ring.fileno())
                        self._ring.close()
                        self._ring = None
                    if self._fd >= 0:
                        os.close(self._fd)
                        self._fd = -1
                    self._lock.release()
        return None

    @property
    def failed(self) -> LogIOError | None:
        return self._failed

    async def reopen(self) -> None:
        """After an I/O failure: drop the descriptor, re-verify from disk, resume appending."""
        await anyio.to_thread.run_sync(self._reopen_sync)
        self._failed = None

    def _reopen_sync(self) -> None:
        with self._io:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._open_sync()

    def _locked_open(self) -> None:
        with self._io:
            self._open_sync()
            if self._sync == "auto" and self.store is None:
                self._ring = open_ring(self._fd)

    @property
    def sync_mode(self) -> str:
        """How rounds become durable: "kernel" (the event loop writes, the kernel runs the
        ``fdatasync``: :mod:`eventlog.aio`) or "thread" (the writer thread does both)."""
        return "kernel" if self._ring is not None else "thread"

    async def _drained(self) -> None:
        """Wait until every queued round is written or has failed."""
        while self._busy or self._pending:
            self._idle = asyncio.Event()
            with anyio.CancelScope(shield=True):
                await self._idle.wait()

    # -- appending ---------------------------------------------------------------------------

    async def append(self, payload: bytes) -> Appended:
        """Encrypt and append one payload; returns once it is durable."""
        return (await self.append_many([payload]))[0]

    async def append_many(
        self, payloads: Sequence[bytes], *, on_durable: Callable[[], None] | None = None
    ) -> list[Appended]:
        """Append payloads in order, in one batch; returns once all are durable.

        A caller cancelled while waiting still waits (shielded) until its records are written
        or have failed, then the cancellation propagates: the records may be durable.
        ``on_durable`` runs once they are, before this returns or the cancellation propagates,
        so a caller that folds what it appends into state never misses a record.
        """
        if self._failed is not None:
            raise self._failed
        if self._closing:
            raise LogIOError(f"log {self.log_dir} is closing; no more appends")
        batch = self._enqueue(payloads, None)
        await self._outcome(batch, on_durable)
        if batch.error is not None:
            raise batch.error
        assert batch.results is not None
        return batch.results

    @staticmethod
    async def _outcome(batch: _Batch, on_durable: Callable[[], None] | None = None) -> None:
        # Once queued the batch will be written. Shielding only after a cancellation (instead of
        # entering a shielded cancel scope on every append) keeps the hot path cheap.
        try:
            await batch.done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await batch.done.wait()
            if batch.error is None and on_durable is not None:
                on_durable()
            raise
        if batch.error is None and on_durable is not None:
            on_durable()

    async def checkpoint(self, takeover: Takeover | None = None) -> Appended:
        """A signed checkpoint now; with ``takeover``, the one that records a node taking the
        log (its first record as the lease's holder)."""
        return await self._enqueue_checkpoint(final=False, takeover=takeover)

    async def _enqueue_checkpoint(
        self, *, final: bool, takeover: Takeover | None = None
    ) -> Appended:
        batch = self._enqueue((), "final" if final else "periodic", takeover)
        with anyio.CancelScope(shield=True):
            await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert batch.results is not None
        return batch.results[0]

    async def _ticker(self) -> None:
        while True:
            await anyio.sleep(self._checkpoint_interval)
            if self._failed is None and not self._closing:
                self._tg_start_checkpoint()

    def _tg_start_checkpoint(self) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._quiet_checkpoint)

    async def _quiet_checkpoint(self) -> None:
        # A failure is kept in self._failed and raised to the next appender.
        with contextlib.suppress(LogIOError):
            await self._enqueue_checkpoint(final=False)

    def _enqueue(
        self, payloads: Sequence[bytes], checkpoint: str | None, takeover: Takeover | None = None
    ) -> _Batch:
        """Queue a batch (event loop side). Every batch queued in one pass of the event loop,
        and every one queued while a round is being written, goes into the next round."""
        with self._state_lock:
            if self._round is None:
                assert self._loop is not None
                self._round = _RoundDone(self._loop)
            batch = _Batch(payloads, self._round, checkpoint, takeover)
            self._pending.append(batch)
            start = not self._busy and not self._dispatch_due
            if start:
                self._dispatch_due = True
        if start:
            assert self._loop is not None
            self._loop.call_soon(self._dispatch)
        return batch

    def _take(self) -> tuple[list[_Batch], _RoundDone]:
        """The pending batches as the next round (the caller holds ``_state_lock``)."""
        batches, self._pending = self._pending, []
        done, self._round = self._round, None
        assert done is not None
        self._busy = True
        return batches, done

    def _for_the_loop(self, batches: list[_Batch]) -> bool:
        """A round the event loop writes itself: a ring, no checkpoint asked for, and small.
        A large round (many appenders at once) goes to the thread, whose framing then runs
        beside the event loop's work instead of in front of it."""
        return (
            self._ring is not None
            and sum(len(b.payloads) for b in batches) <= LOOP_ROUND_RECORDS
            and all(b.checkpoint is None for b in batches)
        )

    def _dispatch(self) -> None:
        """Start the next round (event loop): written here when it can be, else by the
        thread."""
        with self._state_lock:
            self._dispatch_due = False
            if self._busy or not self._pending:
                return
            batches, done = self._take()
        if self._for_the_loop(batches) and self._write_on_loop(batches, done):
            return
        self._to_thread(self._thread_round(batches), done)

    def _thread_round(self, batches: list[_Batch]) -> Callable[[], None]:
        return functools.partial(
            self._guarded, batches, functools.partial(self._write_batches, batches)
        )

    def _to_thread(self, job: Callable[[], None], done: _RoundDone) -> None:
        with self._cv:
            self._job = (job, done)
            self._cv.notify()

    def _finished(self, done: _RoundDone) -> None:
        """A round is written or has failed (event loop): wake its callers, start the next
        unless the thread already has."""
        done.set()
        with self._state_lock:
            start = not self._busy and bool(self._pending) and not self._dispatch_due
            idle = not self._busy and not self._pending
        if start:
            self._dispatch()
        elif idle and self._idle is not None:
            self._idle.set()

    def _writer_thread(self) -> None:
        """Run the rounds handed over (those that may block: checkpoints, a new segment, a
        store; large rounds; every round without a ring) until the writer closes. What queued
        meanwhile, if it is not for the loop, it writes next at once; it wakes the loop once
        per round."""
        assert self._loop is not None
        while True:
            with self._cv:
                while self._job is None and not self._stopping:
                    self._cv.wait()
                if self._job is None:
                    return
                (job, done), self._job = self._job, None
            with self._io:
                job()
            with self._state_lock:
                if self._pending and not self._for_the_loop(self._pending):
                    batches, next_done = self._take()
                    self._job = (self._thread_round(batches), next_done)
                else:
                    self._busy = False
            try:
                self._loop.call_soon_threadsafe(self._finished, done)
            except RuntimeError:  # pragma: no cover - the loop closed under a crashed caller
                return

    # -- a round on the event loop (the kernel runs its fdatasync) ---------------------------

    def _write_on_loop(self, batches: list[_Batch], done: _RoundDone) -> bool:
        """Frame and write a plain round here and submit its ``fdatasync`` to the ring; False
        (nothing done) when the round must go to the thread: a checkpoint or a new segment is
        due (they write key and directory files), or an open holds the file."""
        assert self._ring is not None
        if self._failed is not None:
            return False
        if not self._io.acquire(blocking=False):
            return False
        try:
            framed = self._frame(batches, plain_only=True)
            if framed is None:
                return False
            self._ring_round = (framed, batches, done)
            written = False
            try:
                self._write_lines(framed.lines, [], framed.index, sync=False)
                written = True
                self._ring.submit(self._fd)
            except OSError as exc:
                self._ring_round = None
                if written:
                    # Written, but the kernel refused the fdatasync: the thread makes it
                    # durable, and later rounds stay on the thread.
                    self._abandon_ring()
                    self._to_thread(
                        functools.partial(
                            self._guarded, batches, functools.partial(self._sync_written, framed)
                        ),
                        done,
                    )
                    return True
                self._guarded(batches, functools.partial(self._raise_after_undo, framed, exc))
                self._round_ended(done)
            return True
        finally:
            self._io.release()

    def _round_ended(self, done: _RoundDone) -> None:
        with self._state_lock:
            self._busy = False
        assert self._loop is not None
        self._loop.call_soon(self._finished, done)

    def _ring_done(self) -> None:
        """The ring's eventfd is readable: the round's ``fdatasync`` has completed."""
        if self._ring is None or self._ring_round is None:
            return
        result = self._ring.reap()
        if result is None:
            return
        framed, batches, done = self._ring_round
        self._ring_round = None
        if result == 0:
            self._guarded(batches, functools.partial(self._adopt, framed))
        else:
            failure = OSError(-result, os.strerror(-result))
            self._guarded(batches, functools.partial(self._raise_after_undo, framed, failure))
        with self._state_lock:
            self._busy = False
        self._finished(done)

    def _raise_after_undo(self, framed: _Framed, exc: OSError) -> None:
        self._undo(framed)
        raise exc

    def _sync_written(self, framed: _Framed) -> None:
        """(thread) Make a round the loop wrote durable."""
        try:
            os.fdatasync(self._fd)
        except OSError:
            self._undo(framed)
            raise
        self._adopt(framed)

    def _abandon_ring(self) -> None:
        ring, self._ring = self._ring, None
        if ring is not None:
            assert self._loop is not None
            self._loop.remove_reader(ring.fileno())
            ring.close()
            self._on_problem(
                f"log {self.log_dir}: the kernel refused an asynchronous "
                f"fdatasync; the writer thread makes every round durable from now"
            )

    # -- framing and writing -----------------------------------------------------------------

    def _guarded(self, batches: list[_Batch], work: Callable[[], None]) -> None:
        """Run ``work`` for a round; a failure fails every batch of it and stops the writer
        until :meth:`reopen`."""
        try:
            work()
        except LogIOError as exc:
            self._failed = exc
            for b in batches:
                b.error = exc
        except OSError as exc:
            failure = LogIOError(
                f"writing log {self.log_dir} failed: {exc.strerror or exc}; the writer "
                f"stopped and will re-check the tail before appending again"
            )
            self._failed = failure
            for b in batches:
                b.error = failure
        except Exception as exc:  # a bug: fail the round loudly rather than leave it waiting
            failure = LogIOError(
                f"writing log {self.log_dir} failed: internal error ({type(exc).__name__}); "
                f"the writer stopped and will re-check the tail before appending again"
            )
            self._on_problem(
                f"log {self.log_dir}: the writer failed a write: {type(exc).__name__}: {exc}"
            )
            self._failed = failure
            for b in batches:
                b.error = failure

    def _write_batches(self, batches: list[_Batch]) -> None:
        """(thread) Frame, write, make durable and adopt one round."""
        framed = self._frame(batches)
        assert framed is not None
        try:
            self._write_lines(framed.lines, framed.rotate_at, framed.index)
            if self.store is not None:
                self.store.commit(
                    place_lines(
                        self.head_seq + 1,
                        framed.lines,
                        framed.start_index,
                        framed.start_size,
                        framed.rotate_at,
                    ),
                    self.head_hash,
                )
        except (OSError, StoreError):
            self._undo(framed)
            raise
        self._adopt(framed)

    def _undo(self, framed: _Framed) -> None:
        """A round failed: forget its rotation, cut what it wrote (or leave that to reopen)."""
        self._signing.abandoned()
        if (
            not self._roll_back(framed.start_index, framed.start_size)
            and self._unacked_from is None
        ):
            self._unacked_from = (framed.start_index, framed.start_size, self.head_seq)

    def _adopt(self, framed: _Framed) -> None:
        """A round is durable: advance the head to it."""
        self._after_durable(framed.signed)
        self.head_seq, self.head_hash = framed.seq, framed.prev
        self._last_cp_hash, self._since_cp = framed.last_cp, framed.since_cp
        self._last_cp_seq = framed.last_cp_seq
        if framed.taken:
            self._lease_epoch = framed.taken[-1]
        self.flushes += 1
        if framed.lines:
            self._head_len = len(framed.lines[-1]) + 1
        self._set_position()

    def _frame(self, batches: list[_Batch], *, plain_only: bool = False) -> _Framed | None:
        """Encrypt and frame a round's records, a seal last. With ``plain_only``, None as soon
        as it would need a checkpoint or a new segment (the thread's work: they write files)."""
        if self._failed is not None:
            raise self._failed
        seq, prev = self.head_seq, self.head_hash
        last_cp, since_cp, last_cp_seq = self._last_cp_hash, self._since_cp, self._last_cp_seq
        lines: list[bytes] = []
        size = self._segment_size
        rotate_at: list[int] = []  # indexes into lines where a new segment starts
        index = self._segment_index
        sealed = True  # the last line emitted is a checkpoint (or there is none)
        signed: list[bytes] = []  # the checkpoint lines of this write
        taken: list[int] = []  # lease epochs of the takeovers among them

        prev_raw = bytes.fromhex(prev)
        prefix = aad_prefix(self.log_id)
        kid = self._keyring.active
        kid_raw = kid.encode("ascii")

        def emit(line: bytes) -> str:
            nonlocal seq, prev, prev_raw, size, sealed
            sealed = False
            lines.append(line)
            size += len(line) + 1
            seq += 1
            prev_raw = record_digest(line)
            prev = prev_raw.hex()
            return prev

        def emit_checkpoint(final: bool, takeover: Takeover | None = None) -> Appended:
            nonlocal last_cp, since_cp, last_cp_seq, sealed
            t_us = _now_us()
            cp_seq = seq + 1
            rec = self._signing.checkpoint(
                self.log_id, cp_seq, prev, t_us, last_cp, final, takeover=takeover
            )
            if takeover is not None:
                taken.append(takeover.lease_epoch)
            signed.append(encode_record(rec))
            h = emit(signed[-1])
            last_cp, since_cp, last_cp_seq = h, 0, cp_seq
            sealed = True
            return Appended(cp_seq, h)

        nonces, drawn = self._nonces(NONCE_BYTES * sum(len(b.payloads) for b in batches))
        for batch in batches:
            if batch.checkpoint is not None:
                if plain_only:
                    return None
                batch.results = [
                    emit_checkpoint(final=batch.checkpoint == "final", takeover=batch.takeover)
                ]
                continue
            results = []
            for payload in batch.payloads:
                if plain_only and (
                    since_cp + 1 >= self._checkpoint_every or size >= self._segment_bytes
                ):
                    return None
                if since_cp >= self._checkpoint_every:
                    emit_checkpoint(final=False)  # recovery records on open left a full run
                if size >= self._segment_bytes:
                    index += 1
                    rotate_at.append(len(lines))
                    size = 0
                    emit(encode_record(Segment(seq + 1, prev, self.log_id, index)))
                aad = associated_data_from(prefix, seq + 1, prev_raw, kid_raw)
                nonce = nonces[drawn : drawn + NONCE_BYTES]
                drawn += NONCE_BYTES
                ct = self._sealer.seal_with(nonce, payload, aad)
                h = emit(encode_record(SealedEvent(seq + 1, prev, self.log_id, kid, nonce, ct)))
                results.append(Appended(seq, h))
                since_cp += 1
                if since_cp >= self._checkpoint_every:
                    emit_checkpoint(final=False)
            batch.results = results
        if not sealed:
            # One HMAC per write: the records since the last checkpoint stay the writer's own.
            log_id = self.log_id
            emit(
                encode_record(
                    Seal(seq + 1, prev, log_id, seal_tag(self._mac_key, log_id, seq + 1, prev))
                )
            )
        return _Framed(
            lines,
            rotate_at,
            index,
            seq,
            prev,
            last_cp,
            since_cp,
            last_cp_seq,
            signed,
            taken,
            self._segment_index,
            self._segment_size,
        )

    def _nonces(self, n: int) -> tuple[bytes, int]:
        """(buffer, offset): ``n`` fresh random bytes at ``offset`` of ``buffer``, for this
        write's nonces.

        Drawn from a pool refilled by one ``os.urandom`` call per :data:`NONCE_POOL_BYTES`
        (about 5,000 nonces), not one call per write: ``os.urandom`` releases the GIL, and this
        thread then waits to get it back behind a busy event loop, once per call. Each byte is
        handed out once; the pool lives only in this process's memory, like the data key.
        """
        if self._nonce_at + n > len(self._nonce_pool):
            self._nonce_pool, self._nonce_at = os.urandom(max(n, NONCE_POOL_BYTES)), 0
        at = self._nonce_at
        self._nonce_at += n
        return self._nonce_pool, at

    def _after_durable(self, signed: list[bytes]) -> None:
        """What follows a durable write: destroying a retired epoch key, recording the signed
        heads. The records are durable and their callers are told so, so a failure here is
        reported (``on_problem``), never turned into a failed write: a caller told it failed
        would append the same records again."""
        try:
            self._signing.durable()
        except OSError as exc:
            self._on_problem(
                f"log {self.log_dir}: a retired epoch key could not be destroyed "
                f"({exc.strerror or exc}); it stays on disk until the next open retries, or "
                f"remove it by hand from the epochs directory"
            )
        if signed and self._heads is not None:
            try:
                self._heads.record(signed)
            except OSError as exc:
                self._on_problem(
                    f"log {self.log_dir}: {len(signed)} signed head(s) could not be recorded "
                    f"in {self._heads.path} ({exc.strerror or exc}): they are not published "
                    f"to witnesses; the next checkpoint recorded covers them"
                )

    def _set_position(self) -> None:
        self.position = self._signing.stamp(
            LogPosition(
                log_id=self.log_id,
                seq=self.head_seq,
                hash=self.head_hash,
                segment=self._segment_index,
                line_start=self._segment_size - self._head_len,
                end=self._segment_size,
                last_cp_seq=self._last_cp_seq,
                last_cp_hash=self._last_cp_hash,
                checkpoint_every=self._promised_every,
                unsigned_run=self._since_cp,
                lease_epoch=self._lease_epoch,
            )
        )

    def _roll_back(self, index: int, size: int) -> bool:
        """Cut what a failed batch wrote: none of it was acknowledged, and a retry after
        :meth:`reopen` must not find half of it there (it would append it twice).

        Returns False where the cut itself fails (a read-only file system): ``reopen`` then
        cuts the unacknowledged records before anything else (:meth:`_cut_unacknowledged`).
        """
        try:
            for extra in sorted(self.log_dir.glob("seg-*.jsonl")):
                m = SEGMENT_RE.match(extra.name)
                if m and int(m.group(1)) > index:
                    extra.unlink()
            os.truncate(self.log_dir / segment_name(index), size)
            fsync_dir(self.log_dir)
        except OSError:
            return False
        return True

    def _cut_after(self, index: int, size: int, reason: str) -> None:
        """Quarantine and cut every byte after ``size`` in segment ``index`` and every later
        segment: records a failed batch left behind that no caller was told are durable
        (``unacknowledged``), or records no seal authenticates (``unsealed``).

        Each cut, last segment first, is kept in ``_cuts`` (segment, offset, cut bytes,
        quarantine name, reason) for the ``recovery`` records appended once the log is open.
        """
        for extra in sorted(self.log_dir.glob("seg-*.jsonl"), reverse=True):
            m = SEGMENT_RE.match(extra.name)
            if m and int(m.group(1)) > index:
                torn, qname = self._quarantine(extra, 0, reason)
                extra.unlink()
                self._cuts.append((extra, 0, torn, qname, reason))
        base = self.log_dir / segment_name(index)
        if base.stat().st_size > size:
            torn, qname = self._quarantine(base, size, reason)
            os.truncate(base, size)
            fd = os.open(base, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._cuts.append((base, size, torn, qname, reason))
        fsync_dir(self.log_dir)

    def _write_lines(
        self, lines: list[bytes], rotate_at: list[int], last_index: int, sync: bool = True
    ) -> None:
        cuts = [0, *rotate_at, len(lines)]
        index = last_index - len(rotate_at)
        size = self._segment_size
        for i in range(len(cuts) - 1):
            chunk = lines[cuts[i] : cuts[i + 1]]
            if i > 0:
                self._start_segment(index + i)
                size = 0
            if chunk:
                data = b"\n".join(chunk) + b"\n"
                self._write_all(data)
                size += len(data)
        if sync:
            os.fdatasync(self._fd)
        # Counted, not asked of the file (an fstat is one more system call per write): the
        # descriptor is O_APPEND and one round at a time, under the writer lock, writes it.
        self._segment_size = size

    def _write_all(self, data: bytes) -> None:
        self._write_fd(self._fd, data)

    @staticmethod
    def _write_fd(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def _start_segment(self, index: int) -> None:
        os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1
        path = self.log_dir / segment_name(index)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        fsync_dir(self.log_dir)
        self._segment_index = index

    # -- open and recovery (a worker thread, holding ``_io``) -----------------------------

    def _open_sync(self) -> None:
        if self._unacked_from is not None:
            index, size, self._acked_seq = self._unacked_from
            self._cut_after(index, size, "unacknowledged")
            self._unacked_from = None
        if not any(p.name.startswith("seg-") for p in self.log_dir.iterdir()):
            if self._heads is not None:
                self._heads.check_empty(self.log_dir)
            self._create()
            self._set_position()
            return
        report = self._verify()
        if report.head_seq >= 0:
            unsealed = self._unsealed_from(report)
            if unsealed is not None:
                self._cut_after(*unsealed, "unsealed")
                report = self._verify()
                if report.torn is not None or self._unsealed_from(report) is not None:
                    raise DamagedLogError(  # pragma: no cover - the cut removed them
                        f"log {self.log_dir}: records no seal covers remain after cutting "
                        f"them; refusing to append. Inspect it with `bide verify`"
                    )
        torn = report.torn
        if report.head_seq < 0:
            # Not even the genesis record was written: keep the bytes, start the log afresh.
            assert torn is not None
            cut, qname = self._quarantine(torn.segment, torn.offset)
            os.unlink(torn.segment)
            fsync_dir(self.log_dir)
            self._create()
            self._append_recovery(torn.segment, torn.offset, cut, qname, "torn")
            self._segment_size = os.fstat(self._fd).st_size
            self._set_position()
            return
        self.log_id = report.log_id
        self.head_seq, self.head_hash = report.head_seq, report.head_hash
        self._head_len = report.last_segment_good_size - report.head_offset
        self._last_cp_hash = report.last_checkpoint_hash
        self._last_cp_seq = report.last_checkpoint_seq
        self._since_cp = report.unsigned_run  # exactly what verify holds against the promise
        self._lease_epoch = report.lease_epoch
        # Never sign less often than the genesis record promised (verify enforces it).
        self._promised_every = report.checkpoint_every
        self._checkpoint_every = min(self._checkpoint_every, report.checkpoint_every)
        assert report.last_segment is not None
        self._segment_index = report.last_segment_index
        self._fd = os.open(report.last_segment, os.O_WRONLY | os.O_APPEND)
        if torn is not None:
            cut, qname = self._quarantine(torn.segment, torn.offset)
            if torn.segment != report.last_segment:
                # The crash came while a new segment was being started: the file holds only
                # torn bytes (perhaps none). Remove it; the next rotation creates it again.
                os.unlink(torn.segment)
                fsync_dir(self.log_dir)
            else:
                os.truncate(torn.segment, torn.offset)
                os.fsync(self._fd)
            self._append_recovery(torn.segment, torn.offset, cut, qname, "torn")
        if self._cuts:
            unacked = any(c[4] == "unacknowledged" for c in self._cuts)
            if unacked and report.head_seq != self._acked_seq:
                raise DamagedLogError(
                    f"log {self.log_dir}: after cutting a failed batch the head is record "
                    f"{report.head_seq}, not the last acknowledged record {self._acked_seq}; "
                    f"refusing to append. Inspect it with `bide verify {self.log_dir}`"
                )
            while self._cuts:
                self._append_recovery(*self._cuts[0])
                del self._cuts[0]
        self._segment_size = os.fstat(self._fd).st_size
        self._set_position()

    def _verify(self) -> Report:
        """Verify the log (from the resume position, when it still matches) with the signer's
        own public key; any damage refuses the open."""
        report = verify_live(
            self.log_dir,
            self._signing.verify_key,
            writer_live=False,  # the lock is ours
            resume=self.position or self._resume,
        )
        self.resumed_at = report.resumed_at
        if report.damage is not None:
            d = report.damage
            raise DamagedLogError(
                f"log {self.log_dir} is damaged at record {d.seq} ({d.kind}: {d.detail}; "
                f"{d.segment} offset {d.offset}); refusing to append. Inspect it with "
                f"`bide verify {self.log_dir}`; nothing was changed"
            )
        if self._heads is not None and report.head_seq >= 0:
            self._heads.check(self.log_dir, report)
        if report.head_seq >= 0:
            self._signing.opened(self.log_dir, report)
        return report

    def _unsealed_from(self, report: Report) -> tuple[int, int] | None:
        """Where the records no valid seal or checkpoint covers begin (segment index, offset),
        or None when the head is covered.

        Reads only from ``report.trusted_end`` (the last checkpoint, the genesis record, or
        the position an authenticated snapshot or this writer resumed from) to the head: at
        most one unsigned run. The chain and the checkpoints there are verified already.
        """
        ordinal, offset = report.trusted_end
        last, good_end = report.last_segment_index, report.last_segment_good_size
        if report.head_sealed and (ordinal, offset) >= (last, good_end):
            return None
        covered = (ordinal, offset)
        segments = dict(list_segments(self.log_dir))  # by index (the first may be archived)
        for o in range(ordinal, last + 1):
            path = segments[o]
            start = offset if o == ordinal else 0
            with path.open("rb") as f:
                f.seek(start)
                data = f.read((good_end if o == last else path.stat().st_size) - start)
            pos = start
            for line in data.split(b"\n")[:-1]:
                pos += len(line) + 1
                try:
                    rec = decode_record(line)
                except (msgspec.DecodeError, ValueError):  # pragma: no cover - verified
                    continue
                if isinstance(rec, Checkpoint) or (
                    isinstance(rec, Seal)
                    and (not self._signing.seals_checkable or seal_ok(self._mac_key, rec))
                ):
                    covered = (o, pos)
        return None if covered == (last, good_end) else covered

    def _create(self) -> None:
        self.log_id = os.urandom(16).hex()
        genesis = self._signing.genesis(self.log_id, _now_us(), self._checkpoint_every)
        path = self.log_dir / segment_name(1)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        line = encode_record(genesis)
        self._write_all(line + b"\n")
        os.fdatasync(self._fd)
        fsync_dir(self.log_dir)
        if self.store is not None:
            self.store.commit([StoredLine(0, 1, 0, line)], ZERO_HASH)
        self.head_seq, self.head_hash = 0, record_hash(line)
        self._head_len = len(line) + 1
        self._segment_size = len(line) + 1
        self._promised_every = self._checkpoint_every
        self._segment_index = 1

    def _append_checkpoint_now(self) -> None:
        """A signed checkpoint written and synced at once (open and recovery only)."""
        t_us = _now_us()
        seq = self.head_seq + 1
        rec = self._signing.checkpoint(
            self.log_id, seq, self.head_hash, t_us, self._last_cp_hash, False, may_rotate=False
        )
        line = encode_record(rec)
        self._write_all(line + b"\n")
        os.fdatasync(self._fd)
        self._after_durable([line])
        self.head_seq, self.head_hash = seq, record_hash(line)
        self._head_len = len(line) + 1
        self._last_cp_hash, self._last_cp_seq, self._since_cp = self.head_hash, seq, 0

    def _quarantine(self, segment: Path, offset: int, reason: str = "torn") -> tuple[bytes, str]:
        """Copy the bytes from ``offset`` to the end of ``segment`` aside, durably."""
        with segment.open("rb") as f:
            f.seek(offset)
            torn = f.read()
        qdir = self.log_dir / QUARANTINE_DIR
        qdir.mkdir(mode=0o700, exist_ok=True)
        qname = f"{segment.name}.{offset}.{_now_us()}.{reason}"
        fd = os.open(qdir / qname, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            self._write_fd(fd, torn)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(qdir)
        fsync_dir(self.log_dir)
        return torn, qname

    def _append_recovery(
        self, segment: Path, offset: int, torn: bytes, qname: str, reason: str
    ) -> None:
        """Record the cut in the chain: the cut bytes' length and hash, where they went, why;
        sealed at once, so the next open adopts it.

        Signs a checkpoint first when the unsigned run is already full: several cuts in one
        open must not stretch it past what the genesis record promised (verify refuses that).
        """
        if self._since_cp >= self._checkpoint_every:
            self._append_checkpoint_now()
        rec = Recovery(
            self.head_seq + 1,
            self.head_hash,
            self.log_id,
            _now_us(),
            segment.name,
            offset,
            len(torn),
            hashlib.sha256(torn).hexdigest(),
            f"{QUARANTINE_DIR}/{qname}",
            reason,
        )
        line = encode_record(rec)
        seq, h = self.head_seq + 2, record_hash(line)
        seal = encode_record(
            Seal(seq, h, self.log_id, seal_tag(self._mac_key, self.log_id, seq, h))
        )
        self._write_all(line + b"\n" + seal + b"\n")
        os.fdatasync(self._fd)
        self.head_seq, self.head_hash = seq, record_hash(seal)
        self._head_len = len(seal) + 1
        self._since_cp += 1
        self.recovered = rec
        self.recoveries.append(rec)
