"""The daemon's side of witnessing: every signed head leaves the host by itself.

The writer records each durable checkpoint in ``<state_dir>/heads.jsonl`` (the queue, on
disk) and wakes this publisher, which delivers the heads each target has not had yet, in
order, and keeps a cursor per target in ``<state_dir>/witness/``. Targets ([witness] in the
config):

    file     appends the heads (one JSON line each) to a file, fsynced: a mount of another host
    syslog   one line per head to syslog (journald reads it from /dev/log)
    urls     POST {"heads": [...]} to `bide witness serve`: the heads since the one the
             witness holds, whose checkpoint records prove, with no key, that they extend it;
             with the log's token (``token_file``) as a bearer token, and, on first contact,
             the proof the witness needs to check their signatures from the log's verify.pub
             (the genesis record and the key certificates before the first head)

A witness that rejects the publisher (401: the token; 403: a log it does not trust, or keys
it does not take) is logged as an error with its reason and retried like one that is down.
A target that fails is retried a bounded number of times, then again on the next head or
after ``retry_seconds``; appends never wait for it (the publisher is its own task, and the
writer only appends a line to a file). A witness that refuses a head (a fork) is logged as
an error and not sent anything else until the operator looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import syslog
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
import httpx
import msgspec

from daemon import logfmt
from daemon.config import WitnessConfig
from daemon.witness.remote import tls_context
from eventlog.fsync import fsync_dir
from eventlog.headchain import Proof
from eventlog.heads import Head, HeadStore, encode_head

CURSOR_DIR = "witness"
MAX_HEADS_PER_POST = 256
#: Certificates per body of a proof (about 460 bytes each): a proof longer than that goes in
#: parts ahead of the heads, each well under the witness's body limit (1 MiB).
CERTS_PER_POST = 1000


class Refused(msgspec.Struct, frozen=True):
    status: str
    reason: str = ""
    held: Head | None = None


class Rejected(Exception):
    """A witness answered with a refusal that is not a fork: the message says why."""


class HeadPublisher:
    def __init__(
        self,
        config: WitnessConfig,
        state_dir: Path,
        heads: HeadStore,
        witness_file: Path | None,
        ca_file: Path | None = None,
        *,
        token: bytes | None = None,
        proof_for: Callable[[int], Proof] | None = None,
        certs_per_post: int = CERTS_PER_POST,
    ) -> None:
        self.config = config
        self.certs_per_post = certs_per_post
        self.ca_file = ca_file
        self._token = token
        self._proof_for = proof_for
        self.heads = heads
        self.cursor_dir = state_dir / CURSOR_DIR
        self.targets: list[str] = []
        if witness_file is not None:
            self.targets.append(f"file:{witness_file}")
        if config.syslog:
            self.targets.append("syslog:")
        self.targets += [f"url:{u}" for u in config.urls]
        self._wake = anyio.Event()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._refused: set[str] = set()
        self._failing: set[str] = set()
        #: Deliveries so far, per target (for tests and the benchmark).
        self.delivered: dict[str, int] = {}
        heads.add_listener(self._on_head)

    @property
    def enabled(self) -> bool:
        return bool(self.targets)

    @property
    def failing(self) -> int:
        """Targets whose last delivery failed or that refuse our heads (for the metrics)."""
        return len(self._failing | self._refused)

    def _on_head(self, head: Head) -> None:
        # Called from the log's writer thread once the head is in heads.jsonl: the event
        # loop sets the event (an anyio Event is not thread-safe).
        loop = self._event_loop
        if loop is None:
            return  # not running: the first round reads the file anyway
        with contextlib.suppress(RuntimeError):  # the loop closed
            loop.call_soon_threadsafe(lambda: self._wake.set())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        self._event_loop = asyncio.get_running_loop()
        async with (
            httpx.AsyncClient(
                timeout=self.config.timeout_seconds,
                follow_redirects=False,
                trust_env=False,
                verify=tls_context(self.ca_file),
            ) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(self._loop, client)
            try:
                yield
            finally:
                # The log is closed: one bounded last round for the final checkpoint.
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(self.config.timeout_seconds),
                ):
                    await self.deliver_all(client)
                tg.cancel_scope.cancel()

    async def _loop(self, client: httpx.AsyncClient) -> None:
        while True:
            self._wake = anyio.Event()
            pending = await self.deliver_all(client)
            with anyio.move_on_after(self.config.retry_seconds if pending else 3600.0):
                await self._wake.wait()

    async def deliver_all(self, client: httpx.AsyncClient) -> bool:
        """One round over every target; True when some still have heads to deliver.

        A target's cursor is the byte offset of the last head it took in ``heads.jsonl``
        (-1: none yet), so a round reads only the heads after it, never the whole file."""
        pending = False
        for target in self.targets:
            if target in self._refused:
                continue
            cursor = self._cursor(target)
            try:
                for _ in range(3):  # a witness holding another head of ours: go on from it
                    rows = await anyio.to_thread.run_sync(self.heads.read_from, max(cursor, 0))
                    prev = rows[0][1] if rows and rows[0][0] == cursor else None
                    todo = rows[1:] if prev is not None else rows
                    if not todo:
                        break
                    moved = await self._deliver(client, target, prev, todo)
                    if moved is None:
                        break
                    cursor = moved
                    self._save_cursor(target, cursor)
            except Rejected as exc:
                if target not in self._failing:
                    logfmt.error(
                        "witness rejects our heads; they stay queued on disk",
                        target=_safe(target),
                        reason=str(exc),
                    )
                    self._failing.add(target)
                pending = True
                continue
            except (OSError, httpx.HTTPError) as exc:
                if target not in self._failing:
                    logfmt.warn(
                        "witness unreachable; heads stay queued on disk",
                        target=_safe(target),
                        error=type(exc).__name__,
                    )
                    self._failing.add(target)
                pending = True
                continue
            if target in self._failing:
                logfmt.info("witness reachable again", target=_safe(target))
                self._failing.discard(target)
            pending |= target not in self._refused and bool(
                self.heads.read_from(max(cursor, 0))[1 if cursor >= 0 else 0 :]
            )
        return pending

    async def _deliver(
        self,
        client: httpx.AsyncClient,
        target: str,
        prev: Head | None,
        todo: list[tuple[int, Head]],
    ) -> int | None:
        """Deliver ``todo``; the new cursor, or None where the target refused (a fork)."""
        kind, _, where = target.partition(":")
        heads = [h for _, h in todo]
        if kind == "file":
            await anyio.to_thread.run_sync(_append_file, Path(where), heads)
        elif kind == "syslog":
            for h in heads:
                syslog.syslog(
                    syslog.LOG_INFO | syslog.LOG_AUTH,
                    f"bide head log={h.log} seq={h.seq} hash={h.hash} epoch={h.epoch} sig={h.sig}",
                )
        else:
            return await self._post(client, target, where, prev, todo)
        self.delivered[target] = self.delivered.get(target, 0) + len(heads)
        return todo[-1][0]

    async def _post(
        self,
        client: httpx.AsyncClient,
        target: str,
        url: str,
        prev: Head | None,
        todo: list[tuple[int, Head]],
    ) -> int | None:
        cursor = -1
        for i in range(0, len(todo), MAX_HEADS_PER_POST):
            chunk = todo[i : i + MAX_HEADS_PER_POST]
            # The head before the batch goes too: the witness finds the one it holds.
            batch = ([prev] if prev is not None else []) + [h for _, h in chunk]
            proof = None
            # A proof covers the key certificates before any head of the batch: the witness
            # uses those before the first head it does not hold yet.
            upto = chunk[-1][1].seq
            if prev is None and self._proof_for is not None:
                proof = await self._send_proof(client, url, upto)
            response = await self._send(client, url, _body(batch, proof))
            if response.status_code == 428 and self._proof_for is not None:
                # The witness holds no key state for this log yet: the proof, then again.
                proof = await self._send_proof(client, url, upto)
                response = await self._send(client, url, _body(batch, proof))
            if response.status_code == 200:
                self.delivered[target] = self.delivered.get(target, 0) + len(batch)
                cursor, prev = chunk[-1]
                continue
            if response.status_code == 409:
                refused = msgspec.json.decode(response.content, type=Refused)
                resume = await anyio.to_thread.run_sync(self._offset_of, refused.held)
                if (
                    resume is not None
                    and resume != todo[0][0]
                    and (prev is None or resume != cursor)
                ):
                    return resume  # it holds an older or newer head of ours: go on from there
                logfmt.error(
                    "witness refuses our heads: it holds a head this log does not "
                    "extend (a fork or a rollback); nothing more is sent to it",
                    target=_safe(target),
                    reason=refused.reason,
                )
                self._refused.add(target)
                return None
            if response.status_code in (400, 401, 403, 413, 428, 429, 507):
                raise Rejected(f"{response.status_code}: {_reason(response)}")
            raise httpx.HTTPStatusError(
                f"witness answered {response.status_code}",
                request=response.request,
                response=response,
            )
        return cursor

    async def _send_proof(self, client: httpx.AsyncClient, url: str, upto: int) -> Proof | None:
        """The proof for heads up to ``upto``, to send with them; or, when it holds more
        certificates than one body should, sent ahead in parts (then None)."""
        assert self._proof_for is not None
        proof = await anyio.to_thread.run_sync(self._proof_for, upto)
        n = self.certs_per_post
        if len(proof.certs) <= n:
            return proof
        for i in range(0, len(proof.certs), n):
            part = Proof(proof.genesis if i == 0 else "", proof.certs[i : i + n])
            response = await self._send(client, url, _body([], part))
            if response.status_code != 202:
                raise Rejected(f"{response.status_code}: {_reason(response)}")
        return None

    def _offset_of(self, held: Head | None) -> int | None:
        """Where ``held`` is in ``heads.jsonl`` (-1 for none held), or None when it is not
        one of ours. Reads the whole file: only after a witness answered 409."""
        if held is None:
            return -1
        for offset, h in self.heads.read_from(0):
            if h.seq == held.seq and h.hash == held.hash and h.log == held.log:
                return offset
        return None

    async def _send(self, client: httpx.AsyncClient, url: str, body: bytes) -> httpx.Response:
        delay = 0.1
        for attempt in range(self.config.retries + 1):
            try:
                headers = {"content-type": "application/json"}
                if self._token is not None:
                    headers["authorization"] = "Bearer " + self._token.decode("ascii", "replace")
                return await client.post(url, content=body, headers=headers)
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
            return -1

    def _save_cursor(self, target: str, cursor: int) -> None:
        self.cursor_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._cursor_path(target)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{cursor} {_safe(target)}\n")  # the byte offset of the last head sent
        os.replace(tmp, path)


def _body(batch: list[Head], proof: Proof | None) -> bytes:
    if proof is None:
        return msgspec.json.encode({"heads": batch})
    return msgspec.json.encode({"heads": batch, "proof": proof})


def _reason(response: httpx.Response) -> str:
    """What a witness said when it refused (bounded; it never echoes the token)."""
    try:
        body = msgspec.json.decode(response.content, type=dict[str, object])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "(no reason given)"
    return str(body.get("reason") or body.get("error") or "(no reason given)")[:300]


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
