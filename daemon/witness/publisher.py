"""The daemon's side of witnessing: every signed head leaves the host by itself.

The writer records each durable checkpoint in ``<state_dir>/heads.jsonl`` (the queue, on
disk) and wakes this publisher, which delivers the heads each target has not had yet, in
order, and keeps a cursor per target in ``<state_dir>/witness/``. Targets ([witness] in the
config):

    file     appends the heads (one JSON line each) to a file, fsynced: a mount of another host
    syslog   one line per head to syslog (journald reads it from /dev/log)
    urls     POST {"heads": [...]} to `bide witness serve`: the heads since the one the
             witness holds, whose checkpoint records prove, with no key, that they extend it

A target that fails is retried a bounded number of times, then again on the next head or
after ``retry_seconds``; appends never wait for it (the publisher is its own task, and the
writer only appends a line to a file). A witness that refuses a head (a fork) is logged as
an error and not sent anything else until the operator looks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import syslog
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import anyio.from_thread
import httpx
import msgspec

from daemon import logfmt
from daemon.config import WitnessConfig
from eventlog.fsync import fsync_dir
from eventlog.heads import Head, HeadStore, encode_head

CURSOR_DIR = "witness"
MAX_HEADS_PER_POST = 256


class Refused(msgspec.Struct, frozen=True):
    status: str
    reason: str = ""
    held: Head | None = None


class HeadPublisher:
    def __init__(self, config: WitnessConfig, state_dir: Path, heads: HeadStore,
                 witness_file: Path | None) -> None:
        self.config = config
        self.heads = heads
        self.cursor_dir = state_dir / CURSOR_DIR
        self.targets: list[str] = []
        if witness_file is not None:
            self.targets.append(f"file:{witness_file}")
        if config.syslog:
            self.targets.append("syslog:")
        self.targets += [f"url:{u}" for u in config.urls]
        self._wake = anyio.Event()
        self._refused: set[str] = set()
        self._failing: set[str] = set()
        #: Deliveries so far, per target (for tests and the benchmark).
        self.delivered: dict[str, int] = {}
        heads.add_listener(self._on_head)

    @property
    def enabled(self) -> bool:
        return bool(self.targets)

    def _on_head(self, head: Head) -> None:
        # Called from the writer's flusher thread, once the head is in heads.jsonl.
        try:
            anyio.from_thread.run_sync(self._wake.set)
        except RuntimeError:  # not in an anyio worker thread (a test calling record())
            self._wake.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        async with httpx.AsyncClient(timeout=self.config.timeout_seconds,
                                     follow_redirects=False) as client, \
                anyio.create_task_group() as tg:
            tg.start_soon(self._loop, client)
            try:
                yield
            finally:
                # The log is closed: one bounded last round for the final checkpoint.
                with anyio.CancelScope(shield=True), anyio.move_on_after(
                        self.config.timeout_seconds):
                    await self.deliver_all(client)
                tg.cancel_scope.cancel()

    async def _loop(self, client: httpx.AsyncClient) -> None:
        while True:
            self._wake = anyio.Event()
            pending = await self.deliver_all(client)
            with anyio.move_on_after(self.config.retry_seconds if pending else 3600.0):
                await self._wake.wait()

    async def deliver_all(self, client: httpx.AsyncClient) -> bool:
        """One round over every target; True when some still have heads to deliver."""
        heads = await anyio.to_thread.run_sync(self.heads.heads)
        pending = False
        for target in self.targets:
            cursor = self._cursor(target)
            if cursor >= len(heads) or target in self._refused:
                continue
            try:
                cursor = await self._deliver(client, target, heads, cursor)
            except (OSError, httpx.HTTPError) as exc:
                if target not in self._failing:
                    logfmt.warn("witness unreachable; heads stay queued on disk",
                                target=_safe(target), error=type(exc).__name__)
                    self._failing.add(target)
                pending = True
                continue
            if target in self._failing:
                logfmt.info("witness reachable again", target=_safe(target))
                self._failing.discard(target)
            self._save_cursor(target, cursor)
            pending |= cursor < len(heads) and target not in self._refused
        return pending

    async def _deliver(self, client: httpx.AsyncClient, target: str, heads: list[Head],
                       cursor: int) -> int:
        kind, _, where = target.partition(":")
        todo = heads[cursor:]
        if kind == "file":
            await anyio.to_thread.run_sync(_append_file, Path(where), todo)
        elif kind == "syslog":
            for h in todo:
                syslog.syslog(syslog.LOG_INFO | syslog.LOG_AUTH,
                              f"bide head log={h.log} seq={h.seq} hash={h.hash} "
                              f"epoch={h.epoch} sig={h.sig}")
        else:
            return await self._post(client, target, where, heads, cursor)
        self.delivered[target] = self.delivered.get(target, 0) + len(todo)
        return len(heads)

    async def _post(self, client: httpx.AsyncClient, target: str, url: str, heads: list[Head],
                    cursor: int) -> int:
        while cursor < len(heads):
            # The head before the batch goes too: the witness finds the one it holds.
            start = max(cursor - 1, 0)
            batch = heads[start:cursor + MAX_HEADS_PER_POST]
            body = msgspec.json.encode({"heads": batch})
            response = await self._send(client, url, body)
            if response.status_code == 200:
                self.delivered[target] = self.delivered.get(target, 0) + len(batch)
                cursor = start + len(batch)
                continue
            if response.status_code == 409:
                refused = msgspec.json.decode(response.content, type=Refused)
                resume = _after(heads, refused.held)
                if resume is not None and resume != cursor:
                    cursor = resume  # it holds an older or newer head of ours: go on from there
                    continue
                logfmt.error("witness refuses our heads: it holds a head this log does not "
                             "extend (a fork or a rollback); nothing more is sent to it",
                             target=_safe(target), reason=refused.reason)
                self._refused.add(target)
                return cursor
            raise httpx.HTTPStatusError(f"witness answered {response.status_code}",
                                        request=response.request, response=response)
        return cursor

    async def _send(self, client: httpx.AsyncClient, url: str, body: bytes) -> httpx.Response:
        delay = 0.1
        for attempt in range(self.config.retries + 1):
            try:
                return await client.post(url, content=body,
                                         headers={"content-type": "application/json"})
            except httpx.TransportError:
                if attempt == self.config.retries:
                    raise
                await anyio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    # -- cursors -------------------------------------------------------------------------------

    def _cursor_path(self, target: str) -> Path:
        return self.cursor_dir / (hashlib.sha256(target.encode()).hexdigest()[:16] + ".cursor")

    def _cursor(self, target: str) -> int:
        try:
            return int(self._cursor_path(target).read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return 0

    def _save_cursor(self, target: str, cursor: int) -> None:
        self.cursor_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._cursor_path(target)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{cursor} {_safe(target)}\n")
        os.replace(tmp, path)


def _after(heads: list[Head], held: Head | None) -> int | None:
    """The index after ``held`` in ``heads``, or None when it is not one of ours."""
    if held is None:
        return 0
    for i, h in enumerate(heads):
        if h.seq == held.seq and h.hash == held.hash and h.log == held.log:
            return i + 1
    return None


def _append_file(path: Path, heads: list[Head]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"".join(encode_head(h) + b"\n" for h in heads))
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        fsync_dir(path.parent)


def _safe(target: str) -> str:
    """A target for a log line: a URL without any userinfo or query."""
    kind, _, where = target.partition(":")
    if kind != "url":
        return target
    try:
        u = httpx.URL(where)
    except (httpx.InvalidURL, ValueError):
        return "url:(invalid)"
    return f"url:{u.scheme}://{u.host}:{u.port or ''}{u.path}"
