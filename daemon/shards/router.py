"""The node's one API on a sharded log: each request to the shard that holds its operation.

Theory of operation. A sharded node has, for every shard, a handler (``node.handler(k)``):
the shard's engine API while the node holds the shard (it records), else the shard's
standby reads (its copy of the shard's log; writes refused). The router answers the node's
socket with them:

- **By operation id.** ``/v1/operations/{id}...`` and ``/v1/fetches/{action_id}...`` (an
  action's id is its operation's id and a suffix, ``OP.fetch.1``), and a registration's or a
  submit's id read from its JSON body (one without an id gets ``op-`` and 12 hex digits
  here, as the API would give it, so the id decides the shard). A scoped id ``ID~uUID`` is
  in ``ID``'s shard (:meth:`eventlog.shards.Layout.shard_of`).
- **Reads and waits** (``GET``/``HEAD``) go to ``handler(k)`` whatever holds ``k``: every
  node follows every shard, so an agent waits on the daemon of its own host. **Writes** go
  to ``handler(k)`` when this node holds ``k``, else through the relay
  (:mod:`daemon.shards.relay`) to the shard's holder.
- **Read your writes.** A relayed write answered 2xx is answered to the agent only once this
  node's copy of the shard has folded the holder's head as of that answer (so the record
  the write made), at most :attr:`ShardRouter.catch_up` seconds: an agent that registers
  here and at once waits here finds its operation, not a 404. Past the bound the answer
  goes anyway (the write is recorded; the copy is late, and a read may lag it). And a read
  of an operation this node's copy does not know (404) while it does not hold the shard
  (written through another node, say) is asked again once the copy has folded the
  shard's head in the database, at most :data:`UNKNOWN_CATCH_UP` seconds: a 404 from a copy
  that is behind is not an answer.
- **Lists** (``GET /v1/operations``, ``GET /v1/escalations``) are merged over every shard's
  handler, in the order one node gives them. A page of operations is a k-way merge of
  each shard's page by (registered_at, id); its ``next_cursor`` is *shard-aware*
  (``s1.`` and each shard's own cursor, base64url JSON), because the key a shard's cursor
  holds is finer than the view's time; a plain cursor (one node's) is applied to every
  shard. Any shard's refusal (a bad ``limit``, no role, a shard still loading) is the answer.
- **Health** is the node's: the shards it holds and follows, the sum of their live and
  escalated operations, ``role`` active while it holds any shard.
- Everything else (the OpenAPI document, an unknown path, a method an endpoint does not
  take) is answered by a shard's API exactly as one node answers it.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar
from urllib.parse import unquote

import anyio
import msgspec

from daemon import __version__
from daemon.actions import ACTION_ID
from daemon.api.schema import Health, ShardsHealth
from daemon.api.server import Handler, Request, Response, error
from eventlog.shards import Layout

_OP_PATH = re.compile(r"^/v1/operations/([^/]+)(?:/story|/withdrawal|/decision|/fetch)?$")
_FETCH_PATH = re.compile(r"^/v1/fetches/([^/]+)(?:/content)?$")
_READS = ("GET", "HEAD")
_CURSOR_PREFIX = "s1."
#: The longest a read of an unknown operation waits for this node's copy to catch up.
UNKNOWN_CATCH_UP = 2.0

T = TypeVar("T")


class ShardHost(Protocol):
    """What the router takes from the sharded node (:mod:`daemon.shards.runtime`)."""

    @property
    def name(self) -> str: ...
    def held(self) -> set[int]: ...
    def handler(self, shard: int) -> Handler: ...
    async def folded(self, shard: int, seq: int) -> None:
        """Return once this node's answers for ``shard`` show record ``seq`` (at once
        while it holds the shard)."""
        ...

    async def caught_up(self, shard: int) -> None:
        """Return once this node's answers for ``shard`` show the shard's head in the
        database as this node last saw it (at once while it holds the shard)."""
        ...


class Forwarder(Protocol):
    """What the router takes from the relay (:class:`daemon.shards.relay.Relay`)."""

    async def forward_at(self, shard: int, request: Request) -> tuple[Response, int]: ...


class _Key(msgspec.Struct):
    """The fields a merged list is ordered by (the rest of a view is passed on untouched)."""

    operation_id: str
    registered_at: str = ""
    raised_at: str = ""


class _Page(msgspec.Struct):
    operations: list[msgspec.Raw]
    next_cursor: str | None = None


class _PageKeys(msgspec.Struct):
    operations: list[_Key]


class _Escalations(msgspec.Struct):
    escalations: list[msgspec.Raw]


class _EscalationKeys(msgspec.Struct):
    escalations: list[_Key]


class ShardRouter:
    def __init__(
        self, layout: Layout, node: ShardHost, relay: Forwarder, *, catch_up: float = 10.0
    ) -> None:
        self.layout = layout
        self.node = node
        self.relay = relay
        #: The longest a relayed write's answer waits for this node's copy to show it.
        self.catch_up = catch_up

    async def handle(self, request: Request) -> Response:
        path, method = request.path, request.method
        if path == "/v1/health" and method == "GET":
            return await self._health(request)
        if path == "/v1/operations" and method in _READS and self.layout.sharded:
            return await self._list(request)
        if path == "/v1/escalations" and method == "GET" and self.layout.sharded:
            return await self._escalations(request)
        if path in ("/v1/operations", "/v1/submissions") and method == "POST":
            return await self._registration(request)
        shard = self._shard_of_path(request.raw_path)
        if shard is None:
            return await self._to(self._any_shard(), request)
        return await self._to(shard, request)

    # -- one shard ---------------------------------------------------------------------------

    def _shard_of_path(self, raw_path: str) -> int | None:
        m = _OP_PATH.match(raw_path) or _FETCH_PATH.match(raw_path)
        if m is None:
            return None
        return self.shard_of(unquote(m.group(1)))

    def shard_of(self, op_or_action_id: str) -> int:
        """The shard of an operation, or of an action by its operation (``OP.fetch.1``)."""
        m = ACTION_ID.search(op_or_action_id)
        op_id = op_or_action_id[: m.start()] if m is not None else op_or_action_id
        return self.layout.shard_of(op_id)

    def _any_shard(self) -> int:
        held = self.node.held()
        return min(held) if held else 0

    async def _to(self, shard: int, request: Request) -> Response:
        if shard in self.node.held():
            return await self.node.handler(shard)(request)
        if request.method in _READS:
            response = await self.node.handler(shard)(request)
            if response.status != 404:
                return response
            with anyio.move_on_after(UNKNOWN_CATCH_UP) as bound:  # a copy behind (docstring)
                await self.node.caught_up(shard)
            if bound.cancelled_caught:
                return response
            return await self.node.handler(shard)(request)  # a wait waits its own time
        response, head = await self.relay.forward_at(shard, request)
        if head >= 0 and 200 <= response.status < 300:
            with anyio.move_on_after(self.catch_up):  # read your writes (module docstring)
                await self.node.folded(shard, head)
        return response

    async def _registration(self, request: Request) -> Response:
        """A registration or a submit: to its id's shard (an id chosen here when the body
        names none, so the id decides where it is recorded)."""
        try:
            body = msgspec.json.decode(request.body or b"{}")
        except msgspec.DecodeError:
            body = None
        if not isinstance(body, dict):
            return await self._to(self._any_shard(), request)  # refused as the API refuses it
        op_id = body.get("operation_id")
        if op_id is None or op_id == "":
            op_id = body["operation_id"] = f"op-{secrets.token_hex(6)}"
            request = replace(request, body=msgspec.json.encode(body))
        if not isinstance(op_id, str):
            return await self._to(self._any_shard(), request)
        return await self._to(self.shard_of(op_id), request)

    # -- every shard -------------------------------------------------------------------------

    async def _each(
        self, request: Request, query: Callable[[int], dict[str, str] | None]
    ) -> dict[int, Response]:
        """Every shard's answer to ``request`` (with ``query(k)`` as its query; a shard
        whose query is None is not asked), asked at once."""
        answers: dict[int, Response] = {}

        async def ask(k: int, q: dict[str, str]) -> None:
            answers[k] = await self.node.handler(k)(replace(request, query=q))

        async with anyio.create_task_group() as tg:
            for k in range(self.layout.count):
                q = query(k)
                if q is not None:
                    tg.start_soon(ask, k, q)
        return answers

    async def _list(self, request: Request) -> Response:
        given = request.query.get("cursor", "")
        cursors: list[str | None]
        if given.startswith(_CURSOR_PREFIX):
            decoded = self._decode_cursor(given)
            if decoded is None:
                return error(
                    400, "invalid_cursor", "cursor is not one this API handed out", "cursor"
                )
            cursors = decoded
        else:
            cursors = [given] * self.layout.count

        def query_of(k: int, **more: str) -> dict[str, str] | None:
            at = cursors[k]
            if at is None:
                return None  # this shard has no more
            q = {key: v for key, v in request.query.items() if key != "cursor"}
            if at:
                q["cursor"] = at
            q.update(more)
            return q

        answers = await self._each(request, query_of)
        refused = _first_refusal(answers)
        if refused is not None:
            return refused
        limit = int(request.query.get("limit", "100"))  # the shards accepted it
        pages = {k: _decode(_Page, r.body) for k, r in answers.items()}
        keys = {k: _decode(_PageKeys, r.body).operations for k, r in answers.items()}
        merged = heapq.merge(
            *(
                [(_when(key.registered_at), key.operation_id, k, i) for i, key in enumerate(ks)]
                for k, ks in keys.items()
            )
        )
        chosen: list[tuple[int, int]] = []
        for _, _, k, i in merged:
            if len(chosen) == limit:
                break
            chosen.append((k, i))
        used = {k: 0 for k in pages}
        for k, _ in chosen:
            used[k] += 1
        after: list[str | None] = list(cursors)
        partial: dict[int, int] = {}
        for k, page in pages.items():
            n, total = used[k], len(page.operations)
            if n == total:
                after[k] = page.next_cursor  # None: this shard is done
            elif n > 0:
                partial[k] = n
        if partial:  # a shard's cursor after the part of its page taken: ask it for that
            again = await self._each(
                request,
                lambda k: query_of(k, limit=str(partial[k])) if k in partial else None,
            )
            refused = _first_refusal(again)
            if refused is not None:
                return refused
            for k, r in again.items():
                after[k] = _decode(_Page, r.body).next_cursor
        more = any(c is not None for c in after)
        out = _Page(
            operations=[pages[k].operations[i] for k, i in chosen],
            next_cursor=self._encode_cursor(after) if more else None,
        )
        return Response(200, msgspec.json.encode(out))

    def _encode_cursor(self, cursors: list[str | None]) -> str:
        raw = msgspec.json.encode(cursors)
        return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def _decode_cursor(self, text: str) -> list[str | None] | None:
        data = text[len(_CURSOR_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            cursors = msgspec.json.decode(raw, type=list[str | None])
        except (binascii.Error, ValueError, msgspec.DecodeError):
            return None
        return cursors if len(cursors) == self.layout.count else None

    async def _escalations(self, request: Request) -> Response:
        answers = await self._each(request, lambda k: dict(request.query))
        refused = _first_refusal(answers)
        if refused is not None:
            return refused
        merged: list[tuple[datetime, int, int, msgspec.Raw]] = []
        for k, r in answers.items():
            views = _decode(_Escalations, r.body).escalations
            keys = _decode(_EscalationKeys, r.body).escalations
            merged += [(_when(key.raised_at), k, i, views[i]) for i, key in enumerate(keys)]
        merged.sort(key=lambda e: (e[0], e[1], e[2]))
        return Response(200, msgspec.json.encode(_Escalations([e[3] for e in merged])))

    async def _health(self, request: Request) -> Response:
        if not self.layout.sharded:
            return await self.node.handler(0)(request)
        answers = await self._each(request, lambda k: {})
        forbidden = next((r for r in answers.values() if r.status == 403), None)
        if forbidden is not None:
            return forbidden
        healths = {k: _decode(Health, r.body) for k, r in answers.items() if r.status == 200}
        if not healths:
            return next(iter(answers.values()))
        held = self.node.held()
        every = set(range(self.layout.count))
        first = next(iter(healths.values()))
        failing = any(h.status == "log_failing" for h in healths.values())
        health = Health(
            status="log_failing" if failing else "ok",
            version=__version__,
            log_head_sequence=-1,
            log_head_hash="",
            live=sum(h.live for h in healths.values()),
            escalated=sum(h.escalated for h in healths.values()),
            you=first.you,
            log_store="postgresql",
            role="active" if held else "standby",
            shards=ShardsHealth(
                node=self.node.name,
                count=self.layout.count,
                held=sorted(held),
                following=sorted(every - held),
                not_ready=sorted(every - set(healths)),
            ),
        )
        return Response(200, msgspec.json.encode(health))


def _first_refusal(answers: dict[int, Response]) -> Response | None:
    for k in sorted(answers):
        if answers[k].status != 200:
            return answers[k]
    return None


def _decode(kind: type[T], body: bytes) -> T:
    return msgspec.json.decode(body, type=kind)


def _when(instant: str) -> datetime:
    """An answer's RFC 3339 time, comparable (``...05Z`` sorts after ``...05.123Z`` as
    text)."""
    try:
        return datetime.fromisoformat(instant)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
