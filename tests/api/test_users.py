"""Real Unix users, each running ``bide`` as themselves against one daemon.

The test creates three users and two groups, and removes them however it ends:

* alice (agents, approvers) registers a job, waits on it, and may not approve her own;
* bob (agents) cannot see alice's operation (404) nor answer its escalation (403);
* carol (approvers) answers it, and the story names her, as the kernel does.

None of them can read a key: the daemon answers through its socket. Their ``bide`` runs on
the system's Python with a copy of bide and its dependencies (the project's venv may live
under a directory other users cannot enter).
"""

from __future__ import annotations

import grp
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import until, workspace
from tests.unixusers import User, as_user, python_for_everyone, unix_users, why_not
from tests.unixusers import shared_dir as shared_dir_of_users

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("bide-t-agents", "bide-t-approvers", "bide-t-api")
USERS = {
    "bide-t-alice": GROUPS,
    "bide-t-bob": ("bide-t-agents", "bide-t-api"),
    "bide-t-carol": ("bide-t-approvers", "bide-t-api"),
    "bide-t-dave": ("bide-t-api",),
}  # may reach the socket, has no role


pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture
def users() -> Iterator[dict[str, User]]:
    with unix_users(USERS, GROUPS) as made:
        yield made


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with shared_dir_of_users() as path:
        yield path


API = """\
socket_group = "bide-t-api"
socket_mode = "0660"
"""
SPOOL = """
[spool]
agents_group = "bide-t-agents"
approvers_group = "bide-t-approvers"
"""


def test_three_users_their_own_operations_and_approvals(
    users: dict[str, User], shared_dir: Path
) -> None:
    python = python_for_everyone(shared_dir)
    root = shared_dir / "ws"
    root.mkdir()
    with workspace(root, jobs={"j-odd": "mystery"}, config_extra=SPOOL, api=API) as ws:
        os.chmod(ws.config, 0o644)
        ws.start_daemon()
        alice, bob, carol = (users[n] for n in ("bide-t-alice", "bide-t-bob", "bide-t-carol"))
        key = root / "keys" / "data.key"
        assert as_user(ws, python, alice, "status").returncode == 0  # no key needed
        assert (
            subprocess.run(
                ["cat", str(key)], user=alice.uid, group=alice.gid, capture_output=True, check=False
            ).returncode
            != 0
        )

        first = as_user(
            ws,
            python,
            alice,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j-odd",
            "--operation",
            "op-alice",
        )
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stdout.strip() == "op-alice"
        again = as_user(
            ws,
            python,
            alice,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j-odd",
            "--operation",
            "op-alice",
        )
        assert again.returncode == 0, again.stdout + again.stderr
        waited = as_user(ws, python, alice, "wait", "op-alice", "--timeout", "30s")
        assert waited.returncode == 3, waited.stdout + waited.stderr  # escalated

        hidden = as_user(ws, python, bob, "status", "op-alice")
        assert hidden.returncode == 2
        assert "no operation 'op-alice'" in hidden.stderr
        assert as_user(ws, python, bob, "escalations").stdout.strip() == "no open escalations"
        not_approver = as_user(
            ws, python, bob, "decide", "op-alice", "abandon", "--escalation", "1"
        )
        assert not_approver.returncode == 1
        assert "approver role" in not_approver.stdout

        nobody = as_user(ws, python, users["bide-t-dave"], "status")
        assert nobody.returncode == 2
        assert "has no role here" in nobody.stderr
        assert "agent: group 'bide-t-agents'" in nobody.stderr

        own = as_user(ws, python, alice, "decide", "op-alice", "abandon", "--escalation", "1")
        assert own.returncode == 1
        assert "allow_self_approval" in own.stdout

        decided = as_user(
            ws,
            python,
            carol,
            "decide",
            "op-alice",
            "abandon",
            "--escalation",
            "1",
            "--note",
            "provider console shows it failed",
        )
        assert decided.returncode == 0, decided.stdout + decided.stderr
        assert (
            as_user(ws, python, alice, "wait", "op-alice", "--timeout", "10s").returncode == 4
        )  # closed
        story = as_user(ws, python, alice, "story", "op-alice").stdout
        assert "for bide-t-alice" in story  # who registered it, from the kernel
        assert "decision by bide-t-carol: abandon" in story

        log = ws.log()
        assert [op.registered_by for op in log.ops.values()] == ["bide-t-alice"]
        assert log.ops["op-alice"].registered_by_uid == alice.uid


def test_an_agent_watch_succeeds_once_and_queues_while_the_daemon_is_down(
    users: dict[str, User], shared_dir: Path
) -> None:
    python = python_for_everyone(shared_dir)
    root = shared_dir / "ws"
    root.mkdir()
    with workspace(
        root, jobs={"j1": "running", "j2": "running"}, config_extra=SPOOL, api=API
    ) as ws:
        os.chmod(ws.config, 0o644)
        daemon = ws.start_daemon()
        bob = users["bide-t-bob"]
        args = ("watch", "--provider", "sim", "--job", "j1", "--operation", "op-bob")
        assert as_user(ws, python, bob, *args).returncode == 0
        assert as_user(ws, python, bob, *args).returncode == 0  # the retry: the same receipt
        assert daemon.stop() == 0
        # The daemon is down: the registration goes to the spool (0730, bob's group may
        # write, not read) and says it is queued, with no permission error.
        queued = as_user(
            ws, python, bob, "watch", "--provider", "sim", "--job", "j2", "--operation", "op-bob-2"
        )
        assert queued.returncode == 75, queued.stdout + queued.stderr
        assert "queued" in queued.stdout
        ws.start_daemon()
        until(lambda: "op-bob-2" in ws.log().ops, what="the queued registration")
        ops = ws.log().ops
        assert sorted(ops) == ["op-bob", "op-bob-2"]
        assert {op.registered_by for op in ops.values()} == {"bide-t-bob"}
        assert grp.getgrnam("bide-t-agents").gr_gid in bob.groups


def test_an_agent_s_mcp_server_sees_only_that_agent_s_operations(
    users: dict[str, User], shared_dir: Path
) -> None:
    pytest.importorskip("mcp", reason="bide[mcp] is not installed")
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    python = python_for_everyone(shared_dir, extras=("mcp",))
    root = shared_dir / "ws"
    root.mkdir()
    with workspace(root, jobs={"j-a": "running"}, config_extra=SPOOL, api=API) as ws:
        os.chmod(ws.config, 0o644)
        ws.start_daemon()
        alice, bob = users["bide-t-alice"], users["bide-t-bob"]
        assert (
            as_user(
                ws,
                python,
                alice,
                "watch",
                "--provider",
                "sim",
                "--job",
                "j-a",
                "--operation",
                "op-alice",
            ).returncode
            == 0
        )

        async def as_mcp(user: User) -> tuple[bool, str, list[str]]:
            params = StdioServerParameters(
                command="setpriv",
                args=[
                    f"--reuid={user.uid}",
                    f"--regid={user.gid}",
                    "--init-groups",
                    "--",
                    str(python),
                    "-m",
                    "daemon.cli",
                    "mcp",
                    "--config",
                    str(ws.config),
                ],
                env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
                cwd="/",
            )
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                got = await s.call_tool("get_operation", {"operation_id": "op-alice"})
                mine = await s.call_tool("list_my_operations", {})
                if mine.is_error or not isinstance(mine.structured_content, dict):
                    return got.is_error, str(got.content[0]), [str(mine.content[0])]
                listed = [o["operation_id"] for o in mine.structured_content["operations"]]
                return got.is_error, str(got.content[0]), listed

        assert anyio.run(as_mcp, alice)[0] is False
        error, text, listed = anyio.run(as_mcp, bob)
        assert error
        assert "no operation 'op-alice'" in text
        assert listed == []
        assert anyio.run(as_mcp, alice)[2] == ["op-alice"]
        error, text, listed = anyio.run(as_mcp, users["bide-t-dave"])
        assert error  # a tool error with the API's words, and the server served on
        assert "has no role here" in text
        assert "has no role here" in listed[0]
