"""The relay: a write for a shard this node does not hold, carried to the shard's holder
through the catalog's ``bide_intake`` table, and its answer carried back.

Theory of operation. An agent only ever talks to the daemon on its own host, but only the
holder of a shard's lease records anything in that shard. So the node the agent asked
(the *forwarder*) writes the request into ``bide_intake`` and waits; the holder takes it,
answers it with its engine's API exactly as if its own agent had asked, and writes the
answer into the same row; the forwarder reads it, deletes the row and answers its agent.

- **Sealed both ways.** A row's request (method, path, query, headers, body, the agent's
  uid/gid/pid and the roles the forwarder computed from the agent's groups: the holder
  cannot see that host's groups) and its answer are sealed with the log's data key
  (:mod:`eventlog.sealed`), the associated data binding them to the catalog's schema, the
  shard, the row's random id (``rid``, unique in the table) and the direction. So a
  registration's body is never in clear in the database, and a row that was forged (not
  sealed with the key), moved to another shard or copied under another id fails to open:
  the holder answers it ``400 relay_refused`` and never executes it.
- **Woken, and polled.** The forwarder ``NOTIFY``s ``bide_intake_<k>``; the holder
  ``NOTIFY``s ``bide_intake_answered`` (payload: the schema and the row's ``rid``). Each side
  also looks every :data:`POLL_SECONDS`, so a lost notification costs a second, not the
  request. One ``LISTEN`` connection per node (:meth:`Relay.run`) serves every wait.
- **Taken, not locked.** The holder marks a batch of rows taken (``FOR UPDATE SKIP LOCKED``,
  in id order) and answers them concurrently (at most :data:`IN_FLIGHT` at once). A holder
  that dies mid-row leaves it taken and unanswered: the next holder of the shard clears the
  marks when its :meth:`Relay.serve` starts and takes the row again. Writes are safe to run
  twice: a registration or a submit is idempotent by its digest (the second answer is the
  ``200`` of a retry), a second decision or withdrawal is refused or changes nothing, as
  the API answers them; only a fetch runs again (a second fetch action is recorded and the
  result downloaded again). Only the first answer is written.
- **Bounded.** The forwarder waits ``[api] request_timeout_seconds`` (plus the request's own
  ``?wait=``, at most 60 s); then it withdraws the row if it was not taken and answers
  ``503`` with ``Retry-After``, saying whether the holder may still record it. Answered rows
  are deleted by their forwarder after reading; rows older than an hour (a forwarder that
  died while waiting) are pruned by the shard's holder.
"""

from __future__ import annotations

import collections
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.abc
import msgspec
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from daemon import logfmt
from daemon.api.peer import Peer, user_name
from daemon.api.server import Handler, Relayed, Request, Response, error
from daemon.engine.intake import Authority
from daemon.errors import UsageError
from daemon.inputs import parse_duration
from eventlog import pgstore
from eventlog.errors import DecryptError, StoreError
from eventlog.keys import KeyRing
from eventlog.pglink import pooled
from eventlog.sealed import open_blob, seal_blob
from eventlog.shards import Layout

REQUEST_DOMAIN = b"bide.intake.request.v1\n"
ANSWER_DOMAIN = b"bide.intake.answer.v1\n"
ANSWERED_CHANNEL = "bide_intake_answered"
#: The longest either side goes without looking at the table when no notification comes.
POLL_SECONDS = 1.0
#: Rows a holder marks taken in one statement, and answers at once at most.
TAKE_BATCH = 64
IN_FLIGHT = 64
#: A row older than this is pruned by its shard's holder: its forwarder is gone.
PRUNE_AFTER_SECONDS = 3600.0
PRUNE_EVERY_SECONDS = 60.0
#: The longest ``?wait=`` a relayed request adds to the forwarder's bound.
MAX_WAIT_SECONDS = 60.0


def work_channel(shard: int) -> str:
    """The channel a forwarder wakes shard ``shard``'s holder on."""
    return f"bide_intake_{shard}"


class _Forwarded(msgspec.Struct, frozen=True):
    """A relayed request, as sealed into its row."""

    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    uid: int
    gid: int
    pid: int
    name: str
    roles: list[str]
    node: str


class _Answer(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    headers: list[tuple[str, str]]
    content_type: str
    #: The holder's head of the shard's log once it answered a write 2xx (so at or after
    #: the record it committed for it): the forwarder's copy has the write once it folded
    #: this far. -1: not known (a read, a refusal, a holder before this field).
    head: int = -1


_forwarded = msgspec.msgpack.Decoder(_Forwarded)
_answer = msgspec.msgpack.Decoder(_Answer)
_encode = msgspec.msgpack.Encoder().encode


def _bound(base: str, shard: int, rid: str) -> bytes:
    """What a row's sealed request and answer are bound to (the domain says which)."""
    return f"{base}\n{shard}\n{rid}".encode()


#: The relay's connections commit without waiting for the WAL flush (``synchronous_commit
#: = off``), but for the request's row itself: a take, an answer or a delete lost with a
#: crash of the server puts a row back as it was, and it is taken and answered again (as
#: after a holder's death: see the module's docstring), while the row itself must outlive
#: the crash once acknowledged.
_ASYNC_COMMIT = "SET synchronous_commit = off"
_INSERT = """
WITH durable AS (SELECT set_config('synchronous_commit', 'on', true)),
row AS (
    INSERT INTO bide_intake (shard, kind, op_id, request, from_node, rid)
    VALUES (%s, %s, '', %s, %s, %s) RETURNING id
)
SELECT row.id, pg_notify(%s, %s) FROM row, durable
"""
#: An answered row is read and deleted at once (the forwarder is its only reader).
_ANSWER_OF = "DELETE FROM bide_intake WHERE id = %s AND answered_at IS NOT NULL RETURNING answer"
#: By the row's random id: a row whose insert was cut off before its id came back is found too.
_WITHDRAW = "DELETE FROM bide_intake WHERE rid = %s AND taken_at IS NULL RETURNING id"
_TAKE = """
UPDATE bide_intake SET taken_at = now() WHERE id IN (
    SELECT id FROM bide_intake
    WHERE shard = %s AND answered_at IS NULL AND taken_at IS NULL
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
) RETURNING id, rid, request
"""
_UNTAKE = (
    "UPDATE bide_intake SET taken_at = NULL "
    "WHERE shard = %s AND answered_at IS NULL AND taken_at IS NOT NULL"
)
_ANSWER = """
WITH row AS (
    UPDATE bide_intake SET answered_at = now(), status = %s, answer = %s
    WHERE id = %s AND answered_at IS NULL RETURNING id
)
SELECT id, pg_notify(%s, %s) FROM row
"""
_PRUNE = (
    "DELETE FROM bide_intake WHERE shard = %s AND created_at < now() - make_interval(secs => %s)"
)


@dataclass
class _Listening:
    """The waits the node's one ``LISTEN`` connection wakes."""

    answers: dict[str, anyio.Event] = field(default_factory=dict)
    work: dict[int, anyio.Event] = field(default_factory=dict)


class _Outage:
    """Says once that a shard's relayed requests cannot be reached, and once that they can
    again (not once a second while the database is away)."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, shard: int, exc: StoreError) -> None:
        if self.since is None:
            self.since = time.monotonic()
            logfmt.warn(
                "relay: cannot take this shard's relayed requests; trying every second",
                shard=shard,
                error=str(exc)[:200],
            )

    def over(self) -> None:
        if self.since is not None:
            logfmt.info(
                "relay: taking relayed requests again",
                seconds=f"{time.monotonic() - self.since:.1f}",
            )
            self.since = None


class Relay:
    """One node's side of the relay, for every shard: :meth:`forward` for shards held
    elsewhere, :meth:`serve` for each shard it holds, :meth:`run` (the connections and the
    ``LISTEN``) for as long as the node runs."""

    def __init__(
        self,
        settings: pgstore.PgSettings,
        layout: Layout,
        node_name: str,
        keyring: KeyRing,
        *,
        authority: Authority,
        timeout: float = 10.0,
    ) -> None:
        self.settings = settings  # the base schema's (the catalog's)
        self.layout = layout
        self.node = node_name
        self.keyring = keyring
        self.authority = authority
        self.timeout = timeout
        self._pool: AsyncConnectionPool[Any] | None = None
        self._listening = _Listening()
        #: What happened to relayed requests, for the node's metrics: ``forwarded`` (rows
        #: written here), ``answered`` (their answers read back), ``unanswered`` (a bound
        #: ran out), ``unavailable`` (the database failed), ``served`` (rows this node
        #: answered as a holder), ``refused`` (rows that did not open: never executed).
        self.counts: collections.Counter[str] = collections.Counter()
        self._opened = anyio.Event()

    # -- the node's connections --------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the pool and the ``LISTEN`` connection, then wake waits on notifications
        until cancelled. While the database is away, waits fall back to their poll."""
        kwargs = pgstore.connect_kwargs(self.settings)

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(_ASYNC_COMMIT)

        self._pool = AsyncConnectionPool(
            self.settings.dsn,
            kwargs={**kwargs, "autocommit": True},
            min_size=1,
            max_size=16,
            open=False,
            configure=configure,
            name="bide-relay",
            timeout=max(1.0, self.settings.connect_timeout),
            reconnect_timeout=86_400.0,
        )
        await self._pool.open(wait=False)
        self._opened.set()
        task_status.started()
        warned = False
        try:
            while True:
                try:
                    await self._listen()
                except (pgstore.DatabaseError, StoreError) as exc:
                    if not warned:
                        logfmt.warn(
                            "relay: cannot listen for notifications; polling meanwhile",
                            error=pgstore.reason(exc),
                        )
                    warned = True
                    await anyio.sleep(POLL_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                pool, self._pool = self._pool, None
                await pool.close()

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.settings.dsn, autocommit=True, **pgstore.connect_kwargs(self.settings)
        )
        try:
            channels = [ANSWERED_CHANNEL, *(work_channel(k) for k in range(self.layout.count))]
            for channel in channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self._wake_all()  # notifications missed while not listening: everyone looks
            base = self.layout.base
            async for note in conn.notifies():
                if note.payload.partition(":")[0] != base:
                    continue  # another log's relay in the same database
                if note.channel == ANSWERED_CHANNEL:
                    waiting = self._listening.answers.get(note.payload.partition(":")[2])
                    if waiting is not None:
                        waiting.set()
                elif note.channel.startswith("bide_intake_"):
                    try:
                        work = self._listening.work.get(int(note.channel.rsplit("_", 1)[1]))
                    except ValueError:
                        continue
                    if work is not None:
                        work.set()
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    def _wake_all(self) -> None:
        for event in (*self._listening.answers.values(), *self._listening.work.values()):
            event.set()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        await self._opened.wait()
        async with pooled(self._pool, "the relay's connection pool is closed") as conn:
            yield conn

    async def _row(self, statement: str, params: tuple[object, ...]) -> tuple[Any, ...] | None:
        async with self._connection() as conn:
            cur = await conn.execute(statement, params)
            return await cur.fetchone()

    # -- the forwarder's side ----------------------------------------------------------------

    async def forward(self, shard: int, request: Request) -> Response:
        """Relay ``request`` to shard ``shard``'s holder and answer with what it answered;
        ``503`` with ``Retry-After`` when it does not answer in time (or the database is
        away)."""
        return (await self.forward_at(shard, request))[0]

    async def forward_at(self, shard: int, request: Request) -> tuple[Response, int]:
        """:meth:`forward`, with the holder's head of the shard's log as of a write it
        answered 2xx (-1 when not known): what this node's copy must have folded before its
        agent reads its own write here."""
        bound = self.timeout + self._wait_of(request)
        rid = secrets.token_hex(16)
        peer = request.peer
        forwarded = _Forwarded(
            method=request.method,
            path=request.path,
            raw_path=request.raw_path,
            query=request.query,
            headers=request.headers,
            body=request.body,
            uid=peer.uid,
            gid=peer.gid,
            pid=peer.pid,
            name=user_name(peer.uid),
            roles=list(self.authority.roles(peer.uid, peer.gid)),
            node=self.node,
        )
        blob = seal_blob(
            self.keyring, REQUEST_DOMAIN, _bound(self.layout.base, shard, rid), _encode(forwarded)
        )
        answered = self._listening.answers[rid] = anyio.Event()
        row_id: int | None = None
        try:
            with anyio.move_on_after(bound):
                row = await self._row(
                    _INSERT,
                    (
                        shard,
                        _kind(request),
                        blob,
                        self.node,
                        rid,
                        work_channel(shard),
                        self.layout.base,
                    ),
                )
                assert row is not None
                row_id = int(row[0])
                self.counts["forwarded"] += 1
                while True:
                    with anyio.move_on_after(POLL_SECONDS):
                        await answered.wait()
                    answered = self._listening.answers[rid] = anyio.Event()
                    got = await self._row(_ANSWER_OF, (row_id,))
                    if got is not None:
                        self.counts["answered"] += 1
                        return self._opened_answer(shard, rid, bytes(got[0]))
            self.counts["unanswered"] += 1
            return await self._unanswered(shard, rid, bound), -1
        except StoreError as exc:
            self.counts["unavailable"] += 1
            logfmt.warn("relay: the database failed a relayed request", error=str(exc)[:200])
            return _unavailable(
                f"this node cannot reach the database to relay the request to shard "
                f"{shard}'s holder ({exc}); send it again"
            ), -1
        except anyio.get_cancelled_exc_class():
            # The agent left: take the row back (one left is pruned within the hour).
            with anyio.move_on_after(5.0, shield=True), contextlib.suppress(StoreError):
                await self._row(_WITHDRAW, (rid,))
            raise
        finally:
            self._listening.answers.pop(rid, None)

    async def _unanswered(self, shard: int, rid: str, bound: float) -> Response:
        """The holder did not answer within ``bound``: withdraw the row unless it was taken."""
        withdrawn = False
        with anyio.move_on_after(5.0, shield=True):
            try:
                withdrawn = await self._row(_WITHDRAW, (rid,)) is not None
            except StoreError:
                withdrawn = False
        if withdrawn:
            detail = (
                f"no node holding shard {shard} took the request within {bound:g}s (the "
                f"shard may be moving between nodes); it was withdrawn and nothing was "
                f"recorded: send it again"
            )
        else:
            detail = (
                f"shard {shard}'s holder did not answer within {bound:g}s; the request may "
                f"yet be recorded: send the same request again (a registration's retry is "
                f"answered 200 once it is recorded)"
            )
        return _unavailable(detail)

    def _opened_answer(self, shard: int, rid: str, blob: bytes) -> tuple[Response, int]:
        try:
            plain = open_blob(
                self.keyring,
                ANSWER_DOMAIN,
                _bound(self.layout.base, shard, rid),
                blob,
                where=f"the relayed answer from shard {shard}",
            )
            answer = _answer.decode(plain)
        except (DecryptError, msgspec.DecodeError) as exc:
            logfmt.error("relay: an answer failed authentication; not used", error=str(exc))
            return _unavailable(
                f"shard {shard}'s answer could not be authenticated; it was not used: "
                f"send the request again"
            ), -1
        response = Response(
            answer.status,
            answer.body,
            headers=list(answer.headers),
            content_type=answer.content_type,
        )
        return response, answer.head

    @staticmethod
    def _wait_of(request: Request) -> float:
        wait = request.query.get("wait")
        if wait is None:
            return 0.0
        try:
            seconds = parse_duration(wait, "wait", allow_zero=True, maximum=86400.0)
        except UsageError:
            return 0.0  # the holder refuses it as the API does
        return min(seconds, MAX_WAIT_SECONDS)

    # -- the holder's side -------------------------------------------------------------------

    async def serve(self, shard: int, handler: Handler) -> None:
        """Answer shard ``shard``'s relayed requests with ``handler`` (the shard's engine
        API) until cancelled: run by the shard's holder for as long as it holds it."""
        work = self._listening.work[shard] = anyio.Event()
        untaken = False
        limiter = anyio.Semaphore(IN_FLIGHT)
        pruned = float("-inf")
        outage = _Outage()
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    if not untaken:  # rows a previous holder took and never answered
                        untaken = await self._untake(shard, outage)
                    if untaken and time.monotonic() - pruned >= PRUNE_EVERY_SECONDS:
                        await self._prune(shard)
                        pruned = time.monotonic()
                    rows: list[tuple[int, str, bytes]] = []
                    if untaken:
                        try:
                            rows = await self._take(shard)
                            outage.over()
                        except StoreError as exc:
                            outage.failed(shard, exc)
                    for row_id, rid, blob in rows:
                        await limiter.acquire()
                        tg.start_soon(self._answer_row, shard, handler, row_id, rid, blob, limiter)
                    if len(rows) == TAKE_BATCH:
                        continue  # more waiting
                    with anyio.move_on_after(POLL_SECONDS):
                        await work.wait()
                    work = self._listening.work[shard] = anyio.Event()
        finally:
            if self._listening.work.get(shard) is work:
                del self._listening.work[shard]

    async def _untake(self, shard: int, outage: _Outage) -> bool:
        try:
            async with self._connection() as conn:
                await conn.execute(_UNTAKE, (shard,))
        except StoreError as exc:
            outage.failed(shard, exc)
            return False
        return True

    async def _take(self, shard: int) -> list[tuple[int, str, bytes]]:
        async with self._connection() as conn:
            cur = await conn.execute(_TAKE, (shard, TAKE_BATCH))
            rows = await cur.fetchall()
        return sorted((int(r[0]), str(r[1] or ""), bytes(r[2])) for r in rows)

    async def _prune(self, shard: int) -> None:
        try:
            async with self._connection() as conn:
                cur = await conn.execute(_PRUNE, (shard, PRUNE_AFTER_SECONDS))
                if cur.rowcount:
                    logfmt.info(
                        "relay: old relayed requests pruned", shard=shard, rows=cur.rowcount
                    )
        except StoreError as exc:
            logfmt.warn("relay: cannot prune relayed requests", error=str(exc)[:200])

    async def _answer_row(
        self,
        shard: int,
        handler: Handler,
        row_id: int,
        rid: str,
        blob: bytes,
        limiter: anyio.Semaphore,
    ) -> None:
        try:
            response, head = await self._answer_of(shard, handler, rid, blob)
            answer = _Answer(
                status=response.status,
                body=response.body,
                headers=list(response.headers),
                content_type=response.content_type,
                head=head,
            )
            sealed = seal_blob(
                self.keyring, ANSWER_DOMAIN, _bound(self.layout.base, shard, rid), _encode(answer)
            )
            try:
                await self._row(
                    _ANSWER,
                    (
                        answer.status,
                        sealed,
                        row_id,
                        ANSWERED_CHANNEL,
                        f"{self.layout.base}:{rid}",
                    ),
                )
            except StoreError as exc:  # the next holder (or this one's next term) answers it
                logfmt.warn("relay: cannot write an answer", error=str(exc)[:200])
        finally:
            limiter.release()

    async def _answer_of(
        self, shard: int, handler: Handler, rid: str, blob: bytes
    ) -> tuple[Response, int]:
        """The handler's answer to the row's request, and the shard's head once it answered
        a write 2xx (-1 otherwise); a row that does not open is refused and never handed to
        the handler."""
        try:
            plain = open_blob(
                self.keyring,
                REQUEST_DOMAIN,
                _bound(self.layout.base, shard, rid),
                blob,
                where=f"relayed request {rid[:12] or '(no id)'} of shard {shard}",
            )
            asked = _forwarded.decode(plain)
        except (DecryptError, msgspec.DecodeError) as exc:
            self.counts["refused"] += 1
            logfmt.error("relay: a relayed request failed authentication; refused", error=str(exc))
            return error(
                400,
                "relay_refused",
                "the relayed request failed authentication (not sealed with this log's data "
                "key for this shard and row); it was not executed",
            ), -1
        request = Request(
            method=asked.method,
            path=asked.path,
            raw_path=asked.raw_path,
            query=dict(asked.query),
            headers=dict(asked.headers),
            body=asked.body,
            peer=Peer(pid=asked.pid, uid=asked.uid, gid=asked.gid),
            relayed=Relayed(node=asked.node, name=asked.name, roles=tuple(asked.roles)),
        )
        self.counts["served"] += 1
        try:
            response = await handler(request)
        except Exception as exc:  # the barrier, as the API server's: a bug answers 500
            logfmt.error("relay: internal error", path=asked.path, error=type(exc).__name__)
            return error(
                500,
                "internal_error",
                f"bide failed answering ({type(exc).__name__}) on shard {shard}'s holder; "
                f"see its journal",
            ), -1
        if response.file is not None:
            return error(
                503,
                "relay_no_files",
                "a file cannot be relayed; ask the node holding the shard",
                headers=[("Retry-After", "1")],
            ), -1
        if request.method in ("GET", "HEAD") or not 200 <= response.status < 300:
            return response, -1
        return response, await self._head_after(handler, request)

    @staticmethod
    async def _head_after(handler: Handler, request: Request) -> int:
        """The shard's head as the holder's engine gives it (its health), asked as the
        write's agent after the write was answered: at or after the write's record."""
        health = await handler(
            replace(
                request, method="GET", path="/v1/health", raw_path="/v1/health", query={}, body=b""
            )
        )
        if health.status != 200:
            return -1
        try:
            return msgspec.json.decode(health.body, type=_Head).log_head_sequence
        except msgspec.DecodeError:
            return -1


class _Head(msgspec.Struct):
    log_head_sequence: int = -1


def _kind(request: Request) -> str:
    """What a row asks, for an operator reading the table: the method and the endpoint,
    without the operation's id or the body (``POST operations``, ``POST operations/decision``)."""
    parts = request.raw_path.strip("/").split("/")
    endpoint = parts[1] if len(parts) > 1 else ""
    if len(parts) > 3:
        endpoint += "/" + parts[-1]
    return f"{request.method} {endpoint}"[:64]


def _unavailable(detail: str) -> Response:
    return error(503, "relay_unanswered", detail, headers=[("Retry-After", "1")])
