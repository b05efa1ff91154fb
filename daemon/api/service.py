"""The local API's endpoints: who may do what, answered from the daemon's memory.

Every answer comes from the engine's live state (operations, actions, the in-memory
histories of :mod:`daemon.history`), never from a fold of the log. Every write goes through
the engine's one door (:mod:`daemon.engine.intake`), as the spool's do, and is answered only
once its event is durable. A refusal's kind gives its HTTP status (:data:`STATUS_OF`).

Who may do what (the rules of :class:`daemon.engine.intake.Authority`): an agent registers,
submits, reads, waits on and withdraws its own operations, and another principal's operation
answers 404 as a missing one does; approvers and operators read every operation; approvers
answer escalations, never of an operation they registered unless ``[api] allow_self_approval``;
a principal in no role gets 403 naming the groups that would admit it.
"""

from __future__ import annotations

import collections
import hashlib
import math
import re
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, unquote

import anyio
import msgspec

from daemon import __version__, logfmt, scoping
from daemon.actions import ActionRunner, action_escalation_text
from daemon.api.openapi import openapi_document
from daemon.api.peer import Peer, user_name
from daemon.api.provider_text import (
    bounded,
    escalation_parts,
    provider_error,
    provider_results,
)
from daemon.api.schema import (
    ApiPhase,
    DecisionAnswer,
    DecisionRequest,
    EscalationList,
    EscalationView,
    FetchAnswer,
    FetchRequest,
    Health,
    LeaseHealth,
    OperationPage,
    OperationView,
    OptionView,
    Principal,
    Receipt,
    Story,
    StoryLine,
    SubmitRequest,
    WatchRequest,
    WithdrawAnswer,
    WithdrawRequest,
)
from daemon.api.server import Request, Response, error
from daemon.config import Config
from daemon.engine.intake import Decide, Fetch, Intake, Register, Role, Submit, Withdraw
from daemon.errors import RefusalKind, Refused, UsageError, retired_refusal
from daemon.history import Histories
from daemon.inputs import parse_duration
from daemon.metrics import Metrics
from daemon.spool import FetchFile, SubmitFile, new_request_id
from daemon.timers import RateQuota
from eventlog.keys import KeyRing
from eventlog.position import LogPosition
from replay.actions import Action, action_story
from replay.decide import format_time
from replay.events import (
    ActionEvent,
    ActionFailed,
    ActionSucceeded,
    EscalationRaised,
    LogEvent,
    Option,
)
from replay.observations import DecisionSubmitted, Registration, Withdrawal
from replay.retention import Tombstone
from replay.state import Operation
from replay.story import story_json


class LeaseView(Protocol):
    def health(self) -> tuple[str, int, float]: ...


class Daemon(Protocol):
    """What the API takes from the engine (daemon.supervisor, which imports this module: no
    cycle): its memory to answer from, and its one door (``intake``) for every write."""

    config: Config
    runner: ActionRunner
    histories: Histories
    metrics: Metrics
    intake: Intake

    @property
    def ops(self) -> dict[str, Operation]: ...
    @property
    def live_by_owner(self) -> collections.Counter[int | None]: ...
    @property
    def keyring(self) -> KeyRing: ...
    @property
    def position(self) -> LogPosition | None: ...
    @property
    def lease(self) -> LeaseView | None: ...
    def clock(self) -> float: ...
    def retired(self, op_id: str) -> Tombstone | None: ...
    async def next_event_of(self, op_id: str) -> None: ...
    def spawn_task(self, task: Callable[[], Coroutine[Any, Any, None]]) -> None: ...


#: The HTTP status of each kind of refusal (the one place that maps them).
STATUS_OF: dict[RefusalKind, int] = {
    RefusalKind.MALFORMED: 400,
    RefusalKind.FORBIDDEN: 403,
    RefusalKind.NOT_FOUND: 404,
    RefusalKind.CONFLICT: 409,
    RefusalKind.GONE: 410,
    RefusalKind.INVALID: 422,
    RefusalKind.RATE_LIMITED: 429,
    RefusalKind.UNAVAILABLE: 503,
}

T = TypeVar("T")
_OP_PATH = re.compile(r"^/v1/operations/([^/]+)(/story|/withdrawal|/decision|/fetch)?$")
_FETCH_PATH = re.compile(r"^/v1/fetches/([^/]+)(/content)?$")
_PAGE_LIMIT = 500


@dataclass
class Caller:
    peer: Peer
    name: str
    roles: list[Role]

    def principal(self) -> Principal:
        return Principal(
            name=self.name,
            uid=self.peer.uid,
            gid=self.peer.gid,
            pid=self.peer.pid,
            roles=list(self.roles),
        )


class Api:
    def __init__(self, supervisor: Daemon) -> None:
        self.sup = supervisor
        self.cfg = supervisor.config.api
        self.intake = supervisor.intake
        self.authority = supervisor.intake.authority
        self.groups = self.authority.groups
        self._registrations: dict[int, RateQuota] = {}
        self._loading: anyio.Event | None = None

    # -- dispatch ----------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        caller = self._caller(request.peer) if request.relayed is None else _relayed(request)
        path, method = request.path, request.method
        if path == "/v1/openapi.json" and method == "GET":
            return Response(200, openapi_document())
        if not caller.roles:
            self.sup.metrics.api_rejections["no_role"] += 1
            wanted = "; ".join(
                f"{role}: {self.groups.describe(role)}"
                for role in ("agent", "approver", "operator")
            )
            return error(
                403,
                "no_role",
                f"user {caller.name} has no role here; the groups that admit one: {wanted}",
            )
        try:
            response = await self._route(caller, request, method, path)
        except Refused as exc:
            self.sup.metrics.api_rejections[exc.code] += 1
            headers = (
                [("Retry-After", str(max(1, math.ceil(exc.retry_after))))]
                if exc.retry_after is not None
                else []
            )
            response = error(STATUS_OF[exc.kind], exc.code, exc.detail, exc.field, headers)
        return _shown_to(caller, response)

    async def _route(self, caller: Caller, request: Request, method: str, path: str) -> Response:
        if path == "/v1/health":
            return self._only(method, "GET") or _json(200, self._health(caller))
        if path == "/v1/operations":
            if method == "POST":
                return await self._watch(caller, request)
            return self._only(method, "GET") or _json(200, self._list(caller, request.query))
        if path == "/v1/submissions":
            return self._only(method, "POST") or await self._submit(caller, request)
        if path == "/v1/escalations":
            return self._only(method, "GET") or _json(200, self._escalations(caller))
        fetch = _FETCH_PATH.match(request.raw_path)
        if fetch is not None:
            action_id = self.sup.runner.resolve(unquote(fetch.group(1)), caller.peer.uid)
            if fetch.group(2):
                return self._only(method, "GET") or self._fetched_content(caller, action_id)
            return self._only(method, "GET") or await self._fetch_status(
                caller, action_id, request.query
            )
        # Matched before percent-decoding, so an id holding "/" (sent as %2F) stays one.
        m = _OP_PATH.match(request.raw_path)
        if m is None:
            raise Refused(
                f"no endpoint {path!r}; see GET /v1/openapi.json",
                code="not_found",
                kind=RefusalKind.NOT_FOUND,
                field="path",
            )
        # What the caller calls op_id: its own operation under that id (daemon.scoping).
        op_id, sub = self.sup.runner.resolve(unquote(m.group(1)), caller.peer.uid), m.group(2)
        if sub is None:
            return self._only(method, "GET") or _json(
                200, await self._get(caller, op_id, request.query)
            )
        if sub == "/story":
            return self._only(method, "GET") or await self._story(caller, op_id, request.query)
        if sub == "/withdrawal":
            return self._only(method, "POST") or await self._withdraw(caller, op_id, request)
        if sub == "/fetch":
            return self._only(method, "POST") or await self._fetch(caller, op_id, request)
        return self._only(method, "POST") or await self._decide(caller, op_id, request)

    @staticmethod
    def _only(method: str, allowed: str) -> Response | None:
        if method == allowed:
            return None
        return error(405, "method_not_allowed", f"use {allowed} here", headers=[("Allow", allowed)])

    def _caller(self, peer: Peer) -> Caller:
        return Caller(
            peer=peer, name=user_name(peer.uid), roles=self.authority.roles(peer.uid, peer.gid)
        )

    # -- who sees what -----------------------------------------------------------------------

    def _reads_all(self, caller: Caller) -> bool:
        return self.authority.reads_all(caller.roles)

    def _need(self, caller: Caller, role: Role, doing: str) -> None:
        self.authority.need(caller.name, caller.roles, role, doing)

    def _visible_op(self, caller: Caller, op_id: str) -> Operation | Action:
        """The operation (or the submit that will start it) if the caller may see it; 410
        naming ``bide story OP --offline`` for the caller's operation that was retired
        (``[retention]``); else 404, exactly as for one that does not exist."""
        op = self.sup.ops.get(op_id)
        found: Operation | Action | None = op
        owner = op.registered_by_uid if op is not None else None
        if op is None:
            # A submit not yet answered (by its operation id), or an action by its own id
            # (``OP.submit``, ``OP.fetch.1``): its owner is the submitter or the operation's.
            actions = self.sup.runner.actions
            action = actions.get(f"{op_id}.submit") or actions.get(op_id)
            if action is not None:
                parent = self.sup.ops.get(action.operation_id)
                found = action
                owner = (
                    action.intent.registered_by_uid
                    if action.kind == "submit" or parent is None
                    else parent.registered_by_uid
                )
        if found is None:
            retired = self.sup.retired(op_id)
            if retired is not None and self.authority.may_read(
                caller.roles, retired.owner_uid, caller.peer.uid
            ):
                raise retired_refusal(op_id, retired)
        if found is None or not self.authority.may_read(caller.roles, owner, caller.peer.uid):
            raise Refused(f"no operation {op_id!r}", code="not_found", kind=RefusalKind.NOT_FOUND)
        return found

    # -- writes ------------------------------------------------------------------------------

    def _throttle(self, caller: Caller) -> None:
        quota = self._registrations.get(caller.peer.uid)
        if quota is None:
            quota = self._registrations[caller.peer.uid] = RateQuota(
                self.cfg.registrations_per_second, self.cfg.registrations_burst
            )
        wait = quota.reserve()
        if wait > 0:
            quota.release()
            raise Refused(
                f"user {caller.name} registers faster than [api] "
                f"registrations_per_second = {self.cfg.registrations_per_second:g};"
                f" try again in {wait:.2f}s",
                kind=RefusalKind.RATE_LIMITED,
                code="rate_limited",
                retry_after=math.ceil(wait),
            )
        live = self.sup.live_by_owner[caller.peer.uid]
        if live >= self.cfg.max_live_per_principal:
            raise Refused(
                f"user {caller.name} has {live} live operations, the limit "
                f"([api] max_live_per_principal); wait for some to end",
                kind=RefusalKind.RATE_LIMITED,
                code="rate_limited",
                retry_after=30,
            )

    async def _watch(self, caller: Caller, request: Request) -> Response:
        self._need(caller, "agent", "register operations")
        body = _posix_times(_decode(request.body, WatchRequest))
        now = self.sup.clock()
        op_id = body.operation_id or f"op-{secrets.token_hex(6)}"
        digest = _digest(body, op_id)
        if self.sup.runner.resolve(op_id, caller.peer.uid) not in self.sup.ops:
            self._throttle(caller)
        reg = _registration(
            body,
            op_id,
            body.job_id,
            now,
            request_fingerprint=body.fingerprint,
            started_at=body.started_at,
        )
        op, created = await self.intake.register(Register(reg, caller.peer.uid, digest))
        receipt = Receipt(
            operation_id=op.operation_id,
            status="registered",
            sequence=op.registered_seq,
            created=created,
        )
        return _json(201 if created else 200, receipt)

    async def _submit(self, caller: Caller, request: Request) -> Response:
        self._need(caller, "agent", "submit jobs")
        body = _posix_times(_decode(request.body, SubmitRequest))
        op_id = body.operation_id or f"op-{secrets.token_hex(6)}"
        # Another principal's id is the caller's too, recorded apart (daemon.scoping).
        recorded = scoping.recorded_id(op_id, caller.peer.uid, self.sup.runner.holder)
        action_id = f"{recorded}.submit"
        existing = self.sup.runner.actions.get(action_id)
        if existing is None and self.sup.ops.get(recorded) is None:
            self._throttle(caller)
        now = self.sup.clock()
        reg = _registration(body, op_id, "(submitting)", now)
        sf = SubmitFile(
            version=1,
            request_id=new_request_id(),
            kind="submit",
            registration=reg,
            body=body.body,
            idempotency_key=body.idempotency_key,
            force=body.force,
        )
        sequence = await self.intake.submit(
            Submit(sf, caller.peer.uid, digest=_digest(body, op_id))
        )
        action = self.sup.runner.actions.get(action_id)
        op = self.sup.ops.get(recorded)
        return _json(
            202 if existing is None else 200,
            Receipt(
                operation_id=op_id,
                status="registered" if op is not None else "submitting",
                sequence=sequence
                if sequence is not None
                else (op.registered_seq if op is not None else None),
                created=existing is None and action is not None,
            ),
        )

    async def _withdraw(self, caller: Caller, op_id: str, request: Request) -> Response:
        body = _decode(request.body, WithdrawRequest)
        found = self._visible_op(caller, op_id)
        owner = (
            found.registered_by_uid
            if isinstance(found, Operation)
            else found.intent.registered_by_uid
        )
        self.authority.may_withdraw(op_id, owner, _owner_name(found), caller.peer.uid)
        if not isinstance(found, Operation):
            raise Refused(
                f"operation {op_id} is still being submitted; withdraw it once the "
                f"provider has answered",
                code="submitting",
                kind=RefusalKind.CONFLICT,
            )
        withdrawn = await self.intake.withdraw(
            Withdraw(op_id, Withdrawal(by=caller.name, by_uid=caller.peer.uid, note=body.note))
        )
        return _json(
            200,
            WithdrawAnswer(
                operation_id=op_id, phase=self.sup.ops[op_id].phase, withdrawn=withdrawn
            ),
        )

    async def _decide(self, caller: Caller, op_id: str, request: Request) -> Response:
        # Before the lookup: the same for every id.
        self.authority.need_approver(caller.peer.uid, caller.name, caller.roles)
        body = _decode(request.body, DecisionRequest)
        found = self._visible_op(caller, op_id)
        owner = (
            found.registered_by_uid
            if isinstance(found, Operation)
            else found.intent.registered_by_uid
            if found.kind == "submit"
            else self._owner_of(found.operation_id)
        )
        target = op_id if isinstance(found, Operation) else found.action_id
        observation = DecisionSubmitted(
            option=body.option,
            approver=caller.name,
            note=body.note,
            escalation_id=body.escalation_id,
        )
        escalation = found.escalation if isinstance(found, Operation) else None
        resumes = await self.intake.decide(Decide(target, observation, caller.peer.uid))
        self_approved = owner == caller.peer.uid
        return _json(
            200,
            DecisionAnswer(
                operation_id=op_id,
                escalation_id=escalation.escalation_id if escalation is not None else 1,
                option=body.option,
                approver=caller.name,
                resumes=resumes,
                self_approved=self_approved,
            ),
        )

    # -- fetches -----------------------------------------------------------------------------

    async def _fetch(self, caller: Caller, op_id: str, request: Request) -> Response:
        """Record a fetch of the caller's own operation's result (an operator: anyone's) and
        answer once it ends or ``wait`` runs out; for anyone else the operation is missing."""
        self._need(caller, "agent", "fetch results")
        body = _decode(request.body, FetchRequest)
        seconds = self._wait_seconds(request.query, default="0s")
        ask = FetchFile(
            version=1,
            request_id=new_request_id(),
            kind="fetch",
            operation_id=op_id,
            result=body.result,
        )
        intent = await self.intake.fetch(
            Fetch(ask, caller.peer.uid, operator="operator" in caller.roles)
        )
        action = await self._fetch_waited(intent.action_id, op_id, seconds)
        answer = self._fetch_answer(action)
        return _json(200 if answer.done else 202, answer)

    async def _fetch_status(
        self, caller: Caller, action_id: str, query: dict[str, str]
    ) -> Response:
        action = self._own_fetch(caller, action_id)
        seconds = self._wait_seconds(query, default="0s")
        action = await self._fetch_waited(action_id, action.operation_id, seconds)
        return _json(200, self._fetch_answer(action))

    def _fetched_content(self, caller: Caller, action_id: str) -> Response:
        action = self._own_fetch(caller, action_id)
        outcome = action.outcome
        if not isinstance(outcome, ActionSucceeded) or not outcome.stored_as:
            raise Refused(
                f"fetch {action_id} has not succeeded (it is {action.phase}); no content",
                code="not_fetched",
                kind=RefusalKind.CONFLICT,
            )
        if "/" in outcome.stored_as or outcome.stored_as in (".", ".."):
            raise Refused(
                f"fetch {action_id} names no stored result",
                code="not_fetched",
                kind=RefusalKind.CONFLICT,
            )
        return Response(
            200,
            file=self.sup.runner.results_dir / outcome.stored_as,
            content_type="application/octet-stream",
            headers=[("X-Bide-SHA256", outcome.sha256 or "")],
        )

    def _own_fetch(self, caller: Caller, action_id: str) -> Action:
        """A fetch of the caller's own operation (an operator: any); else 404, as a missing
        one."""
        action = self.sup.runner.actions.get(action_id)
        if action is not None and action.kind == "fetch":
            op = self.sup.ops.get(action.operation_id)
            owner = op.registered_by_uid if op is not None else None
            operator = "operator" in caller.roles
            if self.authority.may_fetch(owner, caller.peer.uid, operator=operator):
                return action
        raise Refused(f"no fetch {action_id!r}", code="not_found", kind=RefusalKind.NOT_FOUND)

    def _wait_seconds(self, query: dict[str, str], *, default: str) -> float:
        try:
            seconds = parse_duration(
                query.get("wait", default), "wait", allow_zero=True, maximum=86400.0
            )
        except UsageError as exc:
            raise Refused(
                str(exc), code="invalid_wait", kind=RefusalKind.MALFORMED, field="wait"
            ) from None
        return min(seconds, self.cfg.max_wait_seconds)

    async def _fetch_waited(self, action_id: str, op_id: str, seconds: float) -> Action:
        actions = self.sup.runner.actions
        with anyio.move_on_after(seconds):
            while actions[action_id].phase == "in_flight":
                await self.sup.next_event_of(op_id)
        return actions[action_id]

    @staticmethod
    def _fetch_answer(action: Action) -> FetchAnswer:
        outcome = action.outcome
        intent = action.intent
        common = dict(
            operation_id=action.operation_id,
            action_id=action.action_id,
            result_name=intent.result_name,
            requested_by=intent.requested_by,
        )
        if isinstance(outcome, ActionSucceeded):
            return FetchAnswer(
                status="fetched",
                done=True,
                size=outcome.size,
                sha256=outcome.sha256,
                content_path=(f"/v1/fetches/{quote(action.action_id, safe='')}/content"),
                **common,  # type: ignore[arg-type]
            )
        if isinstance(outcome, ActionFailed):
            return FetchAnswer(
                status="failed",
                done=True,
                reason=outcome.reason,
                detail=outcome.detail,
                **common,  # type: ignore[arg-type]
            )
        return FetchAnswer(status="in_flight", done=False, **common)  # type: ignore[arg-type]

    # -- reads -------------------------------------------------------------------------------

    def _health(self, caller: Caller) -> Health:
        position = self.sup.position
        live = sum(1 for op in self.sup.ops.values() if op.phase == "live")
        escalated = sum(1 for op in self.sup.ops.values() if op.phase == "escalated")
        return Health(
            status="log_failing" if self.sup.metrics.log_alarm else "ok",
            version=__version__,
            log_head_sequence=position.seq if position is not None else -1,
            log_head_hash=position.hash if position is not None else "",
            live=live,
            escalated=escalated,
            you=caller.principal(),
            **self._lease_health(),
        )

    def _lease_health(self) -> dict[str, Any]:
        if self.sup.lease is None:
            return {}
        node, epoch, remaining = self.sup.lease.health()
        return {
            "log_store": "postgresql",
            "lease": LeaseHealth(node=node, epoch=epoch, remaining_seconds=round(remaining, 3)),
        }

    async def _get(self, caller: Caller, op_id: str, query: dict[str, str]) -> OperationView:
        found = self._visible_op(caller, op_id)
        if "wait" not in query:
            return self._view(found)
        try:
            seconds = parse_duration(query["wait"], "wait", allow_zero=True, maximum=86400.0)
        except UsageError as exc:
            raise Refused(
                str(exc), code="invalid_wait", kind=RefusalKind.MALFORMED, field="wait"
            ) from None
        seconds = min(seconds, self.cfg.max_wait_seconds)
        until = query.get("until", "done")
        if until not in ("done", "registered"):
            raise Refused(
                "until must be done (the default) or registered",
                code="invalid_until",
                kind=RefusalKind.MALFORMED,
                field="until",
            )

        def reached(view: OperationView) -> bool:
            return view.done or (until == "registered" and view.phase != "submitting")

        self.sup.metrics.api_waiters += 1
        try:
            # Events are keyed by their operation's id, an action's too.
            key = found.operation_id if isinstance(found, Action) else op_id
            with anyio.move_on_after(seconds):
                while not reached(self._view(found)):
                    await self.sup.next_event_of(key)
                    found = self._current(op_id) or found
        finally:
            self.sup.metrics.api_waiters -= 1
        return self._view(self._current(op_id) or found)

    def _owner_of(self, op_id: str) -> int | None:
        op = self.sup.ops.get(op_id)
        return op.registered_by_uid if op is not None else None

    def _current(self, op_id: str) -> Operation | Action | None:
        op = self.sup.ops.get(op_id)
        if op is not None:
            return op
        actions = self.sup.runner.actions
        return actions.get(f"{op_id}.submit") or actions.get(op_id)

    def _list(self, caller: Caller, query: dict[str, str]) -> OperationPage:
        phase = query.get("phase")
        if phase is not None and phase not in ("live", "succeeded", "escalated", "closed"):
            raise Refused(
                f"phase {phase!r} is not one of live, succeeded, escalated, closed",
                code="invalid_phase",
                kind=RefusalKind.MALFORMED,
                field="phase",
            )
        try:
            limit = int(query.get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= _PAGE_LIMIT:
            raise Refused(
                f"limit must be a whole number from 1 to {_PAGE_LIMIT}",
                code="invalid_limit",
                kind=RefusalKind.MALFORMED,
                field="limit",
            )
        after = query.get("cursor", "")
        everyone = self._reads_all(caller) and query.get("all") in ("1", "true")
        mine = [
            op
            for op in self.sup.ops.values()
            if (everyone or op.registered_by_uid == caller.peer.uid)
            and (phase is None or op.phase == phase)
        ]
        uid = caller.peer.uid

        def order(op: Operation) -> tuple[float, str]:  # by the ids the caller sees
            return op.registered_at, scoping.shown(op.operation_id, uid)

        mine.sort(key=order)
        if after:
            key = _cursor_key(after)
            mine = [op for op in mine if order(op) > key]
        page = mine[:limit]
        cursor = _cursor(page[-1]) if len(mine) > limit else None
        return OperationPage(operations=[self._view(op) for op in page], next_cursor=cursor)

    def _escalations(self, caller: Caller) -> EscalationList:
        everyone = self._reads_all(caller)
        out: list[tuple[float, EscalationView]] = []
        for op in self.sup.ops.values():
            if (
                op.phase == "escalated"
                and op.escalation is not None
                and (everyone or op.registered_by_uid == caller.peer.uid)
            ):
                out.append((op.escalation.raised_at, self._escalation(op)))
        for action in self.sup.runner.actions.values():
            if (
                action.phase == "escalated"
                and isinstance(action.outcome, ActionFailed)
                and (everyone or action.intent.registered_by_uid == caller.peer.uid)
            ):
                out.append((action.outcome.at, self._action_escalation(action, action.outcome)))
        out.sort(key=lambda e: e[0])
        return EscalationList(escalations=[view for _, view in out])

    async def _story(self, caller: Caller, op_id: str, query: dict[str, str]) -> Response:
        found = self._visible_op(caller, op_id)
        histories = self.sup.histories
        registered_seq = found.registered_seq if isinstance(found, Operation) else None
        if not histories.complete(op_id, registered_seq) and not histories.loaded:
            await self._load_earlier()
        if registered_seq is not None and registered_seq <= histories.archived_seq:
            raise Refused(
                f"the story of {op_id} begins in records archived {histories.archived_where};"
                f" read it offline: bide story {op_id} --offline --archive DEST",
                code="story_archived",
                kind=RefusalKind.GONE,
            )
        kept = histories.events(op_id)
        if kept is None:
            raise Refused(
                f"the story of {op_id} ended too long ago to be kept in memory ([api]"
                f" closed_stories); read it offline: bide story {op_id} --offline",
                code="story_not_kept",
                kind=RefusalKind.GONE,
            )
        events, before_gap, dropped = kept
        if not dropped:
            before_gap = len(events)  # nothing left out: one story, grouped across the head
        lines = _story_lines(events[:before_gap])
        if dropped:
            after = events[before_gap:]
            at = after[0].at if after else events[-1].at
            lines.append(
                {
                    "at": at,
                    "time": format_time(at),
                    "events": [],
                    "text": f"... {dropped} events of this operation are not kept in "
                    f"memory here ([api] story_events_kept); bide story {op_id} "
                    f"--offline shows every one",
                }
            )
        lines += _story_lines(events[before_gap:])
        story = Story(
            operation_id=op_id,
            lines=[
                StoryLine(
                    at=format_time(float(line["at"])),  # type: ignore[arg-type]
                    time=str(line["time"]),
                    text=str(line["text"]),
                    events=list(line.get("events", [])),  # type: ignore[call-overload]
                    provider_text=list(line.get("provider_text", [])),  # type: ignore[call-overload]
                )
                for line in lines
            ],
            text="".join(f"{line['time']} {line['text']}\n" for line in lines),
        )
        if query.get("format") == "text":
            return Response(200, story.text.encode(), content_type="text/plain; charset=utf-8")
        return _json(200, story)

    async def _load_earlier(self) -> None:
        """Load the events recorded before this start, once (see daemon.history): callers
        wait for it up to 20 s, then are told when to come back."""
        if self._loading is None:
            self._loading = anyio.Event()
            self.sup.spawn_task(self._read_earlier)
        with anyio.move_on_after(20.0):
            await self._loading.wait()
        if not self.sup.histories.loaded:
            raise Refused(
                "the daemon is loading the stories recorded before it started; ask again shortly",
                kind=RefusalKind.UNAVAILABLE,
                code="loading",
                retry_after=5,
            )

    async def _read_earlier(self) -> None:
        sup = self.sup
        closed = sorted(
            (op for op in sup.ops.values() if op.phase in ("succeeded", "closed")),
            key=lambda op: op.registered_at,
        )[-sup.histories.closed_limit :]
        kept = {op.operation_id for op in sup.ops.values() if op.phase in ("live", "escalated")} | {
            op.operation_id for op in closed
        }
        kept |= {a.operation_id for a in sup.runner.actions.values()}
        started = time.monotonic()
        loading = self._loading
        assert loading is not None
        try:
            earlier = await anyio.to_thread.run_sync(
                sup.histories.read_earlier, sup.config.log_dir, sup.keyring, kept.__contains__
            )
        except Exception as exc:  # a damaged or shredded log: no stories from before, no crash
            logfmt.error(
                "cannot load the stories recorded before the start; a later story "
                "request tries again",
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            self._loading = None
            loading.set()
            return
        sup.histories.merge(earlier)
        loading.set()
        logfmt.info(
            "stories recorded before the start loaded",
            operations=len(earlier),
            seconds=f"{time.monotonic() - started:.2f}",
        )

    # -- views -------------------------------------------------------------------------------

    def _view(self, found: Operation | Action) -> OperationView:
        if isinstance(found, Action):
            return self._submit_view(found)
        op = found
        now = self.sup.clock()
        live = op.phase == "live"
        next_news = op.next_poll_at if live else None
        return OperationView(
            operation_id=op.operation_id,
            provider=op.provider,
            provider_job_id=bounded(op.provider_job_id),
            registered_by=op.registered_by,
            phase=op.phase,
            done=not live,
            stop_reason=op.stop_reason,
            provider_error=provider_error(op.provider_error),
            provider_error_truncated=op.provider_error_truncated,
            provider_state=_bounded(op.last_state),
            status_requests_used=op.status_requests_used,
            max_status_requests=op.max_status_requests,
            transport_failures_used=op.transport_failures_used,
            rate_limited_used=op.rate_limited_used,
            registered_at=format_time(op.registered_at),
            deadline_at=_instant(op.effective_deadline[0]),
            next_news_at=_instant(next_news),
            retry_after_seconds=(
                min(60.0, max(1.0, round(next_news - now, 3))) if next_news is not None else None
            ),
            provider_results=provider_results(op.results),
            escalation=self._escalation(op) if op.escalation is not None else None,
            sequence=op.registered_seq,
        )

    def _submit_view(self, action: Action) -> OperationView:
        escalated = action.phase == "escalated" and isinstance(action.outcome, ActionFailed)
        # An accepted submit registers its operation in the next append: still submitting.
        phase: ApiPhase = (
            "escalated"
            if escalated
            else "submitting"
            if action.phase in ("in_flight", "succeeded")
            else "closed"
        )
        reg = action.intent.registration
        return OperationView(
            operation_id=action.operation_id,
            provider=action.provider,
            provider_job_id="",
            registered_by=action.intent.registered_by,
            phase=phase,
            done=phase != "submitting",
            stop_reason=(
                action.outcome.reason if isinstance(action.outcome, ActionFailed) else None
            ),
            registered_at=format_time(action.intent.at),
            deadline_at=_instant(reg.deadline_at) if reg is not None else None,
            retry_after_seconds=1.0 if phase == "submitting" else None,
            escalation=(
                self._action_escalation(action, action.outcome)
                if escalated and isinstance(action.outcome, ActionFailed)
                else None
            ),
        )

    def _escalation(self, op: Operation) -> EscalationView:
        esc = op.escalation
        assert esc is not None
        raised = self._raised(op.operation_id, esc.escalation_id)
        detail, text = escalation_parts(raised, op) if raised is not None else ("", "")
        c = raised.context if raised is not None else None
        return EscalationView(
            operation_id=op.operation_id,
            escalation_id=esc.escalation_id,
            reason=esc.reason,
            raised_at=format_time(esc.raised_at),
            options=_options(esc.options),
            registered_by=op.registered_by,
            detail=detail,
            provider_error=provider_error(op.provider_error),
            provider_state=_bounded(c.last_state if c is not None else op.last_state),
            provider_request_id=_bounded(c.last_provider_request_id if c is not None else None),
            provider_job_id=bounded(op.provider_job_id),
            text=text,
            decide_command=f"bide decide {op.operation_id} OPTION --escalation {esc.escalation_id}",
        )

    def _raised(self, op_id: str, number: int) -> EscalationRaised | None:
        kept = self.sup.histories.events(op_id)
        events = kept[0] if kept is not None else []
        return next(
            (
                e
                for e in reversed(events)
                if isinstance(e, EscalationRaised) and e.escalation_id == number
            ),
            None,
        )

    def _action_escalation(self, action: Action, failed: ActionFailed) -> EscalationView:
        return EscalationView(
            operation_id=action.operation_id,
            escalation_id=1,
            reason=failed.reason,
            raised_at=format_time(failed.at),
            options=_options(failed.options),
            registered_by=action.intent.registered_by,
            detail=failed.detail,
            text=action_escalation_text(action, failed),
            decide_command=f"bide decide {action.operation_id} OPTION",
        )


def _relayed(request: Request) -> Caller:
    """The caller of a request relayed from the node its agent asked (the one narrow path
    that takes roles from elsewhere than this host's groups: see
    :class:`daemon.api.server.Relayed`); a role this bide does not know is dropped."""
    relayed = request.relayed
    assert relayed is not None
    known: tuple[Role, ...] = ("agent", "approver", "operator")
    return Caller(
        peer=request.peer,
        name=relayed.name,
        roles=[role for role in known if role in relayed.roles],
    )


def _instant(t: float | None) -> str | None:
    """POSIX seconds as an answer gives them: RFC 3339 in UTC."""
    return None if t is None else format_time(t)


B = TypeVar("B", WatchRequest, SubmitRequest)


def _posix_times(body: B) -> B:
    """The request with its RFC 3339 times as POSIX seconds, the form the daemon records
    (so a retry in either form is the same request)."""
    changes: dict[str, float] = {}
    for name in ("business_deadline_at", "started_at"):
        value = getattr(body, name, None)
        if isinstance(value, datetime):
            changes[name] = value.timestamp()
    return msgspec.structs.replace(body, **changes) if changes else body


def _bounded(text: str | None) -> str | None:
    return None if text is None else bounded(text)


def _shown_to(caller: Caller, response: Response) -> Response:
    """The answer with the caller's own scoped ids under the ids it chose (daemon.scoping):
    nothing in it tells an agent that another agent holds the same id."""
    if response.file is not None:
        return response
    marker = scoping.marker(caller.peer.uid).encode()
    if marker not in response.body:
        return response
    text = scoping.shown(response.body.decode("utf-8", "surrogateescape"), caller.peer.uid)
    response.body = text.encode("utf-8", "surrogateescape")
    return response


def _story_lines(events: list[LogEvent]) -> list[dict[str, object]]:
    return sorted(
        [
            *story_json([e for e in events if not isinstance(e, ActionEvent)]),
            *action_story([e for e in events if isinstance(e, ActionEvent)]),
        ],
        key=lambda line: float(line["at"]),  # type: ignore[arg-type]
    )


def _options(options: Iterable[Option]) -> list[OptionView]:
    return [
        OptionView(number=n, id=o.id, label=o.label, params=dict(o.params))
        for n, o in enumerate(options, start=1)
    ]


def _owner_name(found: Operation | Action) -> str:
    return found.registered_by if isinstance(found, Operation) else found.intent.registered_by


def _decode(body: bytes, kind: type[T]) -> T:
    if not body.strip():
        body = b"{}"
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise Refused(
            f"invalid request: {exc}",
            code="invalid_field",
            kind=RefusalKind.INVALID,
            field=_field_of(str(exc)),
        ) from None
    except msgspec.DecodeError as exc:
        raise Refused(
            f"the body is not valid JSON: {exc}", code="malformed_json", kind=RefusalKind.MALFORMED
        ) from None


def _field_of(message: str) -> str | None:
    m = re.search(r"at `\$\.([A-Za-z_][\w]*)", message)
    if m:
        return m.group(1)
    m = re.search(r"(?:unknown|required) field `(\w+)`", message)
    return m.group(1) if m else None


def _registration(
    body: WatchRequest | SubmitRequest, op_id: str, job_id: str, now: float, **more: Any
) -> Registration:
    """The registration a watch or a submit asks for (a submit's job id comes later)."""
    try:
        return msgspec.convert(
            dict(
                operation_id=op_id,
                provider=body.provider,
                provider_job_id=job_id,
                account_context=body.account,
                expected_terminal_state=body.expected_state,
                deadline_at=now + body.deadline_seconds if body.deadline_seconds else None,
                business_deadline_at=body.business_deadline_at,
                max_status_requests=body.max_status_requests,
                max_transport_failures=body.max_transport_failures,
                max_rate_limited=body.max_rate_limited,
                **more,
            ),
            Registration,
        )
    except msgspec.ValidationError as exc:
        raise Refused(
            f"invalid request: {exc}", code="invalid_field", kind=RefusalKind.INVALID
        ) from None


def _digest(body: WatchRequest | SubmitRequest, op_id: str) -> str:
    """What makes two registrations or submits the same request (with the id the caller
    gave or got)."""
    data = msgspec.json.encode(msgspec.structs.replace(body, operation_id=op_id))
    kind = b"watch" if isinstance(body, WatchRequest) else b"submit"
    return hashlib.sha256(b"bide.api." + kind + b".v1\n" + data).hexdigest()


def _cursor(op: Operation) -> str:
    return f"{op.registered_at!r}~{op.operation_id}"


def _cursor_key(cursor: str) -> tuple[float, str]:
    at, sep, op_id = cursor.partition("~")
    try:
        when = float(at)
    except ValueError:
        when = math.nan
    if not sep or not math.isfinite(when):
        raise Refused(
            "cursor is not one this API handed out",
            code="invalid_cursor",
            kind=RefusalKind.MALFORMED,
            field="cursor",
        )
    return when, op_id


def _json(status: int, value: object) -> Response:
    return Response(status, msgspec.json.encode(value))
