"""Intake: the one door for what principals ask of the daemon, and who may ask it.

One job: carry out registrations, submits, fetches, decisions and withdrawals, given as typed
commands (:class:`Register`, :class:`Submit`, :class:`Fetch`, :class:`Decide`,
:class:`Withdraw`), and refuse with one refusal type (:class:`~daemon.errors.Refused`) whose
:class:`~daemon.errors.RefusalKind` every door acts on: the API maps it to an HTTP status, the
spool writes its detail beside the refused file. Both the spool
(:mod:`daemon.engine.spooling`) and the API (:mod:`daemon.api.service`) come through here.

The authorization rules live here too (:class:`Authority`): the roles a user's groups give,
who counts as an approver (through the API and through the spool's decisions directory), that
no approver answers their own operation's escalation unless allowed, that only an
operation's owner withdraws it, and who is an operator.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import anyio
import msgspec

from daemon import logfmt, scoping
from daemon.actions import ACTION_ID, ActionRunner
from daemon.config import Config
from daemon.engine.chain import Chain
from daemon.engine.followers import Waiters
from daemon.errors import RefusalKind, Refused, retired_refusal
from daemon.profile import Profile
from daemon.spool import DOTS, FetchFile, SubmitFile, approval_refusal, user_name
from replay.decide import register
from replay.events import (
    ActionIntended,
    DecisionRejected,
    OperationRegistered,
    RegistrationRejected,
)
from replay.observations import DecisionSubmitted, Registration, Withdrawal
from replay.state import Operation

Role = Literal["agent", "approver", "operator"]


# -- commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Register:
    """Wait on a job for ``owner`` (the spool file's owner, or the API's peer). ``digest``
    makes a retried API request the same registration."""

    registration: Registration
    owner: int
    digest: str = ""


@dataclass(frozen=True)
class Submit:
    """Submit a job (then wait on it) for ``owner``."""

    request: SubmitFile
    owner: int
    digest: str = ""


@dataclass(frozen=True)
class Fetch:
    """Fetch an operation's result for ``requester`` (an ``operator`` may fetch anyone's)."""

    request: FetchFile
    requester: int
    operator: bool = False


@dataclass(frozen=True)
class Decide:
    """A human's answer to the open escalation of ``target`` (an operation or an action),
    from ``approver_uid``, whose approver role the door checked (:class:`Authority`)."""

    target: str
    observation: DecisionSubmitted
    approver_uid: int


@dataclass(frozen=True)
class Withdraw:
    """Stop waiting on ``op_id``, for its owner (checked with :meth:`Authority.may_withdraw`)."""

    op_id: str
    withdrawal: Withdrawal


# -- who may do what --------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleGroups:
    """The groups that give each role ("" = everyone who can reach the socket; None for the
    approvers: nobody, when the agents are a group and the approvers are not)."""

    agents: str
    approvers: str | None
    operators: str

    def describe(self, role: Role) -> str:
        if role == "approver" and self.approvers is None:
            return "nobody until [api] approvers_group is set"
        group = {"agent": self.agents, "approver": self.approvers, "operator": self.operators}[role]
        return f"group {group!r}" if group else "anyone"


def groups_of(uid: int, gid: int) -> set[str]:
    """Names of the groups ``uid`` is in (its primary group and supplementary ones)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        gids = [gid]
    else:
        gids = os.getgrouplist(entry.pw_name, entry.pw_gid)
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return names


def roles_of(uid: int, gid: int, groups: RoleGroups, *, daemon_uid: int) -> list[Role]:
    """The roles the groups give ``uid``: agent, approver, operator (root and the daemon's
    own user always operate)."""
    member = groups_of(uid, gid)
    roles: list[Role] = []
    if not groups.agents or groups.agents in member:
        roles.append("agent")
    if groups.approvers is not None and (not groups.approvers or groups.approvers in member):
        roles.append("approver")
    if uid in (0, daemon_uid) or (groups.operators and groups.operators in member):
        roles.append("operator")
    return roles


class Authority:
    """Every authorization rule of the daemon, for the API and the spool alike."""

    def __init__(self, config: Config, *, daemon_uid: int | None = None) -> None:
        self.config = config
        self.daemon_uid = os.geteuid() if daemon_uid is None else daemon_uid
        agents = (
            config.api.agents_group
            if config.api.agents_group is not None
            else config.spool.agents_group
        )
        approvers: str | None = (
            config.api.approvers_group
            if config.api.approvers_group is not None
            else config.spool.approvers_group
        )
        if agents and not approvers:
            approvers = None  # agents are a group, approvers none: nobody approves (closed)
        self.groups = RoleGroups(
            agents=agents, approvers=approvers, operators=config.api.operators_group
        )

    def roles(self, uid: int, gid: int) -> list[Role]:
        """The roles of an API caller. As for the spool's decisions, with an approvers group
        the daemon's own user never approves (it is the one acting on decisions), and root
        only when the config says so, whatever groups either is in."""
        roles = roles_of(uid, gid, self.groups, daemon_uid=self.daemon_uid)
        if self.groups.approvers:
            allow_root = self.config.spool.allow_root_approval
            if uid == self.daemon_uid or (uid == 0 and not allow_root):
                roles = [role for role in roles if role != "approver"]
            elif uid == 0 and "approver" not in roles:
                roles.append("approver")
        return roles

    def need(self, name: str, roles: list[Role], role: Role, doing: str) -> None:
        """Refuse (forbidden) unless the caller has ``role`` (an operator acts as an agent)."""
        if role in roles or (role == "agent" and "operator" in roles):
            return
        raise Refused(
            f"user {name} may not {doing}: that takes the {role} role "
            f"({self.groups.describe(role)})",
            kind=RefusalKind.FORBIDDEN,
            code="forbidden",
        )

    @staticmethod
    def reads_all(roles: list[Role]) -> bool:
        """Approvers and operators read every operation; agents their own."""
        return "operator" in roles or "approver" in roles

    @classmethod
    def may_read(cls, roles: list[Role], owner: int | None, uid: int) -> bool:
        """Whether ``uid`` (with ``roles``) sees an operation registered by ``owner``; for
        anyone else it does not exist (404, as a missing one)."""
        return cls.reads_all(roles) or (owner is not None and owner == uid)

    @staticmethod
    def may_fetch(owner: int | None, requester: int, *, operator: bool) -> bool:
        """Whether ``requester`` may have bide download an operation's result with the
        provider's credential, or see that download: its own registrant, or an operator
        (approvers read every operation, but fetch none)."""
        return operator or (owner is not None and owner == requester)

    def need_approver(self, uid: int, name: str, roles: list[Role]) -> None:
        """Refuse (forbidden) an answer to an escalation from a caller who is no approver,
        saying why when it is the daemon's user or root."""
        if "approver" in roles:
            return
        why = (
            " (the daemon's own user is never an approver)"
            if uid == self.daemon_uid and self.groups.approvers
            else " (root is one only with [spool] allow_root_approval = true)"
            if uid == 0 and self.groups.approvers
            else ""
        )
        raise Refused(
            f"user {name} may not answer escalations: that takes the approver role "
            f"({self.groups.describe('approver')}){why}",
            kind=RefusalKind.FORBIDDEN,
            code="forbidden",
        )

    def spool_approval(self, path: Path, st: os.stat_result) -> str | None:
        """Why a decision file's owner does not count as an approver (S36), or None."""
        cfg = self.config.spool
        return approval_refusal(
            path,
            st,
            approvers_group=cfg.approvers_group,
            daemon_uid=self.daemon_uid,
            allow_root=cfg.allow_root_approval,
        )

    def self_approved(self, target: str, owner: int | None, approver_uid: int) -> bool:
        """Whether the approver answers their own operation's escalation; refused (forbidden)
        unless ``[api] allow_self_approval``."""
        if owner is None or owner != approver_uid:
            return False
        if not self.config.api.allow_self_approval:
            raise Refused(
                f"{target} was registered by {user_name(approver_uid)}; an approver may not "
                f"answer their own operation's escalation ([api] allow_self_approval = "
                f"true allows it, for one-person setups)",
                kind=RefusalKind.FORBIDDEN,
                code="self_approval",
            )
        return True

    @staticmethod
    def may_withdraw(op_id: str, owner: int | None, owner_name: str, uid: int) -> None:
        """Only an operation's owner withdraws it."""
        if owner != uid:
            raise Refused(
                f"operation {op_id} is {owner_name}'s; only its owner may withdraw it",
                kind=RefusalKind.FORBIDDEN,
                code="forbidden",
            )

    def is_operator(self, uid: int, gid: int) -> bool:
        """Root, the daemon's own user, or a member of ``[api] operators_group``."""
        group = self.config.api.operators_group
        return uid in (0, self.daemon_uid) or bool(group and group in groups_of(uid, gid))


# -- the door ---------------------------------------------------------------------------------


class Scheduler(Protocol):
    """What intake asks of the poller: which operations a poll holds, and their timers."""

    busy: set[str]

    def schedule(self, op_id: str) -> None: ...


class Intake:
    def __init__(
        self,
        config: Config,
        chain: Chain,
        waiters: Waiters,
        poller: Scheduler,
        runner: ActionRunner,
        profiles: Callable[[], Mapping[str, Profile]],
        *,
        authority: Authority | None = None,
    ) -> None:
        self.config = config
        self.chain = chain
        self.waiters = waiters
        self.poller = poller
        self.runner = runner
        self._profiles = profiles
        self.authority = authority if authority is not None else Authority(config)
        self._registering: dict[str, anyio.Event] = {}  # op id -> set once it is recorded

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, op_id: str) -> AsyncIterator[None]:
        """Registrations and submits of one operation id, one after the other."""
        while (pending := self._registering.get(op_id)) is not None:
            await pending.wait()
        done = self._registering[op_id] = anyio.Event()
        try:
            yield
        finally:
            del self._registering[op_id]
            done.set()

    # -- registrations ------------------------------------------------------------------------

    async def register(self, cmd: Register) -> tuple[Operation, bool]:
        """Register the job for its owner; returns the operation and whether it is new.

        Idempotent: an operation id already recorded for the same job (from the API: for the
        same request, by its ``digest``) is that operation, not a second registration. Two
        registrations of one id at once are taken one after the other: the second finds the
        first recorded (the check and the append are not atomic across the append's await)."""
        async with self.one_at_a_time(cmd.registration.operation_id):
            return await self._register_once(cmd.registration, cmd.owner, cmd.digest)

    async def _register_once(
        self, reg: Registration, owner: int, digest: str
    ) -> tuple[Operation, bool]:
        ops = self.chain.ops
        if ACTION_ID.search(reg.operation_id):
            raise Refused(
                f"operation id {reg.operation_id!r} ends like an action's id "
                f"(.submit, .fetch.N, .cancel.N); choose another",
                code="invalid_operation_id",
                field="operation_id",
            )
        if self.runner.holder(reg.operation_id) != owner:
            why = scoping.refusal(reg.operation_id)
            if why is not None:
                raise Refused(why, code="invalid_operation_id", field="operation_id")
        # Another principal's id is this owner's too, recorded apart (daemon.scoping).
        reg = msgspec.structs.replace(
            reg, operation_id=scoping.recorded_id(reg.operation_id, owner, self.runner.holder)
        )
        existing = ops.get(reg.operation_id)
        if existing is not None:
            same = (
                (existing.request_digest == digest)
                if digest
                else (existing.provider, existing.provider_job_id)
                == (reg.provider, reg.provider_job_id)
            )
            if same and existing.registered_by_uid in (None, owner):
                return existing, False  # recorded before a crash, or a client's retry
            raise Refused(
                f"operation id {reg.operation_id} is already in use by another request",
                kind=RefusalKind.CONFLICT,
                code="operation_id_in_use",
                field="operation_id",
            )
        retired = self.chain.retired(reg.operation_id)
        if retired is not None:
            same = retired.same_request(digest, reg.provider, reg.provider_job_id)
            if same and retired.owner_uid in (None, owner):
                raise retired_refusal(reg.operation_id, retired)  # a retry: answered alike
            raise Refused(
                f"operation id {reg.operation_id} is already in use by another request "
                f"(an operation that ended and was retired)",
                kind=RefusalKind.CONFLICT,
                code="operation_id_in_use",
                field="operation_id",
            )
        if reg.provider_job_id in DOTS:
            raise Refused(
                f"job id {reg.provider_job_id!r} cannot be one segment of a status URL: a dot "
                f"segment is removed by URL normalisation even percent-encoded (RFC 3986 "
                f"§5.2.4, §6.2.2.2), so the request could reach another path",
                code="invalid_job_id",
                field="job_id",
            )
        if f"{reg.operation_id}.submit" in self.runner.actions:
            raise Refused(
                f"operation id {reg.operation_id} is already in use by a submit",
                kind=RefusalKind.CONFLICT,
                code="operation_id_in_use",
                field="operation_id",
            )
        profiles = self._profiles()
        profile = profiles.get(reg.provider)
        if profile is None:
            known = ", ".join(sorted(profiles)) or "none loaded"
            raise Refused(
                f"no profile for provider {reg.provider!r} (known: {known})",
                code="unknown_provider",
                field="provider",
            )
        events = register(
            reg,
            profile.contract,
            self.chain.clock(),
            registered_by=user_name(owner),
            registered_by_uid=owner,
        )
        rejected = next((e for e in events if isinstance(e, RegistrationRejected)), None)
        if rejected is not None:
            raise Refused(f"{rejected.reason}: {rejected.detail}", code=rejected.reason)
        if digest:
            events = [
                msgspec.structs.replace(e, request_digest=digest)
                if isinstance(e, OperationRegistered)
                else e
                for e in events
            ]
        await self.chain.record(events)
        registered = next(e for e in events if isinstance(e, OperationRegistered))
        logfmt.info(
            "operation registered",
            op=registered.operation_id,
            provider=registered.provider,
            job=registered.provider_job_id,
            by=registered.registered_by,
        )
        self.poller.schedule(registered.operation_id)
        return ops[registered.operation_id], True

    # -- actions ------------------------------------------------------------------------------

    async def submit(self, cmd: Submit) -> int | None:
        """Record the submit's intent and start it; the intent's log sequence number (None
        when this submit was recorded before: a retry)."""
        async with self.one_at_a_time(cmd.request.registration.operation_id):
            return await self.runner.ingest_submit(
                cmd.request.request_id, cmd.request, cmd.owner, digest=cmd.digest
            )

    async def fetch(self, cmd: Fetch, *, spool_request: str = "") -> ActionIntended:
        """Record a fetch and start it; its intent. One at a time per operation: each
        fetch's number follows the recorded ones."""
        async with self.one_at_a_time(f"{cmd.request.operation_id}\x00fetch"):
            op_id = self.runner.resolve(cmd.request.operation_id, cmd.requester)
            op = self.chain.ops.get(op_id)
            owner = op.registered_by_uid if op is not None else None
            if op is None or not self.authority.may_fetch(
                owner, cmd.requester, operator=cmd.operator
            ):
                raise Refused(
                    f"no operation {cmd.request.operation_id!r}",
                    kind=RefusalKind.NOT_FOUND,
                    code="not_found",
                )
            return await self.runner.ingest_fetch(spool_request, cmd.request, cmd.requester)

    # -- decisions and withdrawals ------------------------------------------------------------

    async def decide(self, cmd: Decide) -> bool:
        """Record a human's decision on the open escalation of an operation or an action;
        returns whether polling resumes.

        An approver never answers an escalation of an operation they registered unless
        ``[api] allow_self_approval``; then the decision records it (``self_approved``).
        A poll in flight is let finish first, so the decision meets the state it answers."""
        op_id, observation = cmd.target, cmd.observation
        ops = self.chain.ops
        action = self.runner.actions.get(op_id)
        target = ops.get(action.operation_id if action is not None else op_id)
        owner = (
            action.intent.registered_by_uid
            if action is not None and action.kind == "submit"
            else target.registered_by_uid
            if target is not None
            else None
        )
        if self.authority.self_approved(op_id, owner, cmd.approver_uid):
            observation = msgspec.structs.replace(observation, self_approved=True)
        if action is not None:
            decided = await self.runner.decide(action, observation)
            if not decided.accepted:
                raise Refused(
                    f"decision rejected: {decided.reason}",
                    kind=RefusalKind.CONFLICT,
                    code="decision_rejected",
                    field="option",
                )
            return False
        if ops.get(op_id) is None:
            raise Refused(
                f"no operation or action {op_id!r}", kind=RefusalKind.NOT_FOUND, code="not_found"
            )
        if observation.escalation_id is None and self.config.spool.require_escalation_number:
            raise Refused(
                "the decision names no escalation number: answer with bide decide OP "
                "OPTION --escalation N (N as bide escalations and the outbox show it), "
                "so it cannot land on a later escalation",
                code="escalation_number_required",
                field="escalation_id",
            )
        busy = self.poller.busy
        await self.waiters.wait_until(lambda: op_id not in busy)  # bounded by its timeout
        events = await self.chain.handle(ops[op_id], observation)
        rejected = next((e for e in events if isinstance(e, DecisionRejected)), None)
        if rejected is not None:
            raise Refused(
                f"decision rejected: {rejected.reason}",
                kind=RefusalKind.CONFLICT,
                code="decision_rejected",
                field="option",
            )
        await self.runner.after_decision(list(events))
        self.poller.schedule(op_id)
        return ops[op_id].phase == "live"

    async def withdraw(self, cmd: Withdraw) -> bool:
        """Stop waiting on the operation for its owner: recorded as ``withdrawn_by_owner``,
        no provider call. False when it had already ended."""
        op_id = cmd.op_id
        busy = self.poller.busy
        await self.waiters.wait_until(lambda: op_id not in busy)  # a poll in flight ends first
        busy.add(op_id)  # and none starts until the withdrawal is recorded
        try:
            events = await self.chain.handle(self.chain.ops[op_id], cmd.withdrawal)
        finally:
            busy.discard(op_id)
            self.poller.schedule(op_id)  # cancels its timer, gives back a held quota slot
        if not events:
            return False
        logfmt.info("operation withdrawn by its owner", op=op_id, by=cmd.withdrawal.by)
        return True
