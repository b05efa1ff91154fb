"""Intake, the one door: each refusal carries its kind, and the authorization rules hold,
checked on a real engine (a real log in a temporary directory, real profiles) built in the
test process: no daemon process, no root, no Unix users."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from daemon.api.service import STATUS_OF
from daemon.config import ApiConfig, Config, ConfigFile, PathsConfig, SpoolConfig
from daemon.engine.intake import Authority, Decide, Fetch, Register, Withdraw
from daemon.engine.supervisor import Supervisor
from daemon.errors import RefusalKind, Refused
from daemon.spool import FetchFile
from eventlog import keys
from replay.observations import DecisionSubmitted, Registration, Withdrawal

ALICE, BOB, CAROL = 41001, 41002, 41003  # uids with no account: names print as uid:N

PROFILE = """\
[status]
url = "http://127.0.0.1:9/jobs/{job_id}"
timeout_seconds = 2

[credential]
file = "sim.token"

[contract]
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]

[contract.states]
pending = ["queued", "running"]
success = ["succeeded"]
failure = ["failed"]
"""


def config(tmp: Path, *, spool: SpoolConfig | None = None, api: ApiConfig | None = None) -> Config:
    return Config(
        tmp / "bide.toml",
        ConfigFile(
            paths=PathsConfig(
                state_dir="state", keys_dir="keys", profiles_dir="profiles", credentials_dir="creds"
            ),
            spool=spool or SpoolConfig(),
            api=api or ApiConfig(),
        ),
    )


def run_engine(
    tmp: Path, scenario: Callable[[Supervisor], Awaitable[None]], *, api: ApiConfig | None = None
) -> None:
    """Build the engine over a new log in ``tmp``, open its chain, and run ``scenario``."""
    keys.generate(tmp / "keys")
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "sim.toml").write_text(PROFILE)
    (tmp / "creds").mkdir()
    (tmp / "creds" / "sim.token").write_text("t0ken\n")
    os.chmod(tmp / "creds" / "sim.token", 0o600)
    cfg = config(tmp, api=api)
    engine = Supervisor(cfg, keys.load_keyring(tmp / "keys"), keys.load_signer(tmp / "keys"))
    engine.load_profiles()

    async def main() -> None:
        async with engine.chain.opened(None):
            await scenario(engine)

    anyio.run(main)


def registration(op_id: str, job: str = "job-1", provider: str = "sim") -> Registration:
    return Registration(
        operation_id=op_id, provider=provider, provider_job_id=job, deadline_at=time.time() + 3600
    )


async def refusal(call: Awaitable[object]) -> Refused:
    with pytest.raises(Refused) as caught:
        await call
    return caught.value


def decision(option: str = "resume", escalation: int | None = 1) -> DecisionSubmitted:
    return DecisionSubmitted(option=option, approver="someone", escalation_id=escalation)


def test_a_registration_is_recorded_once_and_a_retry_is_the_same_operation(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        op, created = await engine.intake.register(Register(registration("nightly"), ALICE))
        assert created
        assert op.phase == "live"
        assert op.registered_by_uid == ALICE
        again, created = await engine.intake.register(Register(registration("nightly"), ALICE))
        assert not created
        assert again.registered_seq == op.registered_seq
        assert engine.live_by_owner[ALICE] == 1

    run_engine(tmp_path, scenario)


def test_registration_refusals_carry_their_kind(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        door = engine.intake
        await door.register(Register(registration("nightly"), ALICE))
        cases = [
            (registration("nightly", job="job-2"), RefusalKind.CONFLICT, "operation_id_in_use"),
            (registration("x.submit"), RefusalKind.INVALID, "invalid_operation_id"),
            (registration("x~u5"), RefusalKind.INVALID, "invalid_operation_id"),
            (registration("dots", job=".."), RefusalKind.INVALID, "invalid_job_id"),
            (registration("other", provider="nosuch"), RefusalKind.INVALID, "unknown_provider"),
        ]
        for reg, kind, code in cases:
            refused = await refusal(door.register(Register(reg, ALICE)))
            assert (refused.kind, refused.code) == (kind, code), reg
        assert list(engine.ops) == ["nightly"]  # nothing refused was recorded

    run_engine(tmp_path, scenario)


def test_another_principals_id_is_theirs_too_recorded_apart(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        await engine.intake.register(Register(registration("nightly"), ALICE))
        op, created = await engine.intake.register(
            Register(registration("nightly", job="other"), BOB)
        )
        assert created
        assert op.operation_id == f"nightly~u{BOB}"

    run_engine(tmp_path, scenario)


def test_decision_refusals_carry_their_kind(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        door = engine.intake
        await door.register(Register(registration("nightly"), ALICE))
        missing = await refusal(door.decide(Decide("nosuch", decision(), BOB)))
        assert (missing.kind, missing.code) == (RefusalKind.NOT_FOUND, "not_found")
        unnumbered = await refusal(door.decide(Decide("nightly", decision(escalation=None), BOB)))
        assert (unnumbered.kind, unnumbered.code) == (
            RefusalKind.INVALID,
            "escalation_number_required",
        )
        # Nothing is escalated: the decision is recorded as rejected, and refused.
        rejected = await refusal(door.decide(Decide("nightly", decision(), BOB)))
        assert (rejected.kind, rejected.code) == (RefusalKind.CONFLICT, "decision_rejected")

    run_engine(tmp_path, scenario)


def test_an_approver_may_not_answer_their_own_operation_unless_allowed(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        await engine.intake.register(Register(registration("nightly"), ALICE))
        own = await refusal(engine.intake.decide(Decide("nightly", decision(), ALICE)))
        assert (own.kind, own.code) == (RefusalKind.FORBIDDEN, "self_approval")

    run_engine(tmp_path, scenario)

    async def allowed(engine: Supervisor) -> None:
        await engine.intake.register(Register(registration("nightly"), ALICE))
        # Past the self-approval rule: refused only because nothing is escalated.
        refused = await refusal(engine.intake.decide(Decide("nightly", decision(), ALICE)))
        assert refused.code == "decision_rejected"

    other = tmp_path / "allowed"
    other.mkdir()
    run_engine(other, allowed, api=ApiConfig(allow_self_approval=True))


def test_a_withdrawal_stops_the_operation_once(tmp_path: Path) -> None:
    async def scenario(engine: Supervisor) -> None:
        await engine.intake.register(Register(registration("nightly"), ALICE))
        withdrawal = Withdrawal(by="alice", by_uid=ALICE)
        assert await engine.intake.withdraw(Withdraw("nightly", withdrawal)) is True
        assert engine.ops["nightly"].phase == "closed"
        assert engine.live_by_owner[ALICE] == 0
        assert await engine.intake.withdraw(Withdraw("nightly", withdrawal)) is False

    run_engine(tmp_path, scenario)


def test_fetch_refusals_carry_their_kind_and_hide_other_principals_operations(
    tmp_path: Path,
) -> None:
    async def scenario(engine: Supervisor) -> None:
        door = engine.intake
        await door.register(Register(registration("nightly"), ALICE))
        ask = FetchFile(version=1, request_id="0" * 32, kind="fetch", operation_id="nightly")
        other = await refusal(door.fetch(Fetch(ask, BOB)))
        assert (other.kind, other.code) == (RefusalKind.NOT_FOUND, "not_found")
        missing = await refusal(
            door.fetch(
                Fetch(
                    FetchFile(version=1, request_id="0" * 32, kind="fetch", operation_id="nosuch"),
                    BOB,
                )
            )
        )
        # Another principal's operation is refused exactly as a missing one.
        assert (missing.kind, missing.code) == (other.kind, other.code)
        assert str(missing).replace("nosuch", "nightly") == str(other)
        own = await refusal(door.fetch(Fetch(ask, ALICE)))  # live: no result yet
        assert (own.kind, own.code) == (RefusalKind.CONFLICT, "not_fetchable")
        operator = await refusal(door.fetch(Fetch(ask, CAROL, operator=True)))
        assert operator.kind is RefusalKind.CONFLICT  # an operator sees it

    run_engine(tmp_path, scenario)


# -- the rules of who may do what, on their own ----------------------------------------------


def test_without_groups_everyone_is_an_agent_and_an_approver(tmp_path: Path) -> None:
    authority = Authority(config(tmp_path), daemon_uid=4242)
    assert authority.roles(ALICE, ALICE) == ["agent", "approver"]
    assert authority.roles(4242, 4242) == ["agent", "approver", "operator"]
    assert "operator" in authority.roles(0, 0)


def test_with_an_approvers_group_neither_the_daemon_nor_root_approves_by_default(
    tmp_path: Path,
) -> None:
    api = ApiConfig(agents_group="", approvers_group="root")  # gid 0: the test's own group
    authority = Authority(config(tmp_path, api=api), daemon_uid=4242)
    assert "approver" in authority.roles(ALICE, 0)  # a member of the group
    assert "approver" not in authority.roles(BOB, BOB)  # not a member
    assert "approver" not in authority.roles(4242, 0)  # the daemon's own user: never
    assert "approver" not in authority.roles(0, 0)  # root: not unless allowed
    with pytest.raises(Refused, match="root is one only with") as caught:
        authority.need_approver(0, "root", authority.roles(0, 0))
    assert caught.value.kind is RefusalKind.FORBIDDEN

    allow_root = SpoolConfig(allow_root_approval=True)
    root_allowed = Authority(
        Config(
            tmp_path / "bide.toml",
            ConfigFile(paths=PathsConfig(state_dir="state"), spool=allow_root, api=api),
        ),
        daemon_uid=4242,
    )
    assert "approver" in root_allowed.roles(0, 0)


def test_agents_need_their_role_and_only_owners_withdraw(tmp_path: Path) -> None:
    api = ApiConfig(agents_group="root", approvers_group="root")
    authority = Authority(config(tmp_path, api=api), daemon_uid=4242)
    with pytest.raises(Refused, match="takes the agent role") as caught:
        authority.need("bob", authority.roles(BOB, BOB), "agent", "register operations")
    assert caught.value.kind is RefusalKind.FORBIDDEN
    authority.need("op", ["operator"], "agent", "register operations")  # operators act too
    authority.may_withdraw("nightly", ALICE, "alice", ALICE)
    with pytest.raises(Refused, match="only its owner may withdraw") as caught:
        authority.may_withdraw("nightly", ALICE, "alice", BOB)
    assert caught.value.kind is RefusalKind.FORBIDDEN


def test_every_kind_of_refusal_has_one_http_status() -> None:
    assert set(STATUS_OF) == set(RefusalKind)
    assert STATUS_OF[RefusalKind.CONFLICT] == 409
    assert STATUS_OF[RefusalKind.NOT_FOUND] == 404
    assert STATUS_OF[RefusalKind.RATE_LIMITED] == 429


def test_approvers_read_every_operation_but_fetch_only_their_own() -> None:
    alice, bob = 1001, 1002
    assert Authority.may_read(["agent"], alice, alice)
    assert not Authority.may_read(["agent"], alice, bob)
    assert Authority.may_read(["approver"], alice, bob)
    assert not Authority.may_read(["agent"], None, bob)  # nobody's: as a missing one
    assert Authority.may_fetch(alice, alice, operator=False)
    assert not Authority.may_fetch(alice, bob, operator=False)  # even an approver
    assert Authority.may_fetch(alice, bob, operator=True)
    assert not Authority.may_fetch(None, bob, operator=False)
