"""Who may do what through the local API: the socket's directory, the process that answers on
it, and who counts as an approver, with real daemons and real Unix users (prefix ``bidea``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from daemon.api.client import ApiCallError, ApiClient
from tests.api.test_api import api, watch
from tests.e2e.harness import Daemon, until, workspace
from tests.unixusers import as_user, python_for_everyone, shared_dir, unix_users, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")

HOSTILE = textwrap.dedent("""\
    import socket, sys
    path, got = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    open(got + ".ready", "w").close()
    while True:
        conn, _ = s.accept()
        conn.settimeout(2)
        data = b""
        try:
            while b"\\r\\n\\r\\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        with open(got, "ab") as out:
            out.write(data)
        if data:
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n"
                         b"Content-Length: 2\\r\\n\\r\\n{}")
        conn.close()
""")


def test_the_daemon_refuses_a_socket_in_a_directory_others_can_write(tmp_path: Path) -> None:
    with shared_dir() as shared:
        sticky = shared / "tmp"
        sticky.mkdir()
        sticky.chmod(0o1777)  # as /tmp
        exposed = sticky / "api.sock"
        with workspace(tmp_path, api=f'socket = "{exposed}"\n') as ws:
            daemon = ws.start_daemon(ready=False)
            assert daemon.proc.wait(20) != 0
            out = daemon.output()
            assert f"[api] socket {exposed}" in out
            assert "writable by others" in out
            assert "sticky" in out
            assert "/run/bide/api.sock" in out  # the fix
            assert not exposed.exists()
        private = sticky / "bide-own" / "api.sock"  # a directory the daemon creates: its own
        (tmp_path / "ok").mkdir()
        with workspace(tmp_path / "ok", api=f'socket = "{private}"\n') as ws:
            ws.start_daemon()
            with ApiClient(private, timeout=10) as client:
                assert client.call("GET", "/v1/health")["status"] == "ok"
            assert (private.parent.stat().st_mode & 0o777) == 0o755


def test_the_cli_sends_nothing_to_a_socket_another_user_answers(tmp_path: Path) -> None:
    users: dict[str, tuple[str, ...]] = {"bidea-hostile": ()}
    with unix_users(users) as made, shared_dir() as shared:
        hostile = made["bidea-hostile"]
        home = shared / "hostile"
        home.mkdir()
        os.chown(home, hostile.uid, hostile.gid)
        script = home / "listen.py"
        script.write_text(HOSTILE)
        script.chmod(0o644)
        path, got = home / "api.sock", home / "got"
        server = subprocess.Popen(
            ["/usr/bin/python3", str(script), str(path), str(got)],
            user=hostile.uid,
            group=hostile.gid,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            until(lambda: Path(f"{got}.ready").exists(), what="the hostile listener")
            with workspace(tmp_path, api=f'socket = "{path}"\ndaemon_user = "root"\n') as ws:
                for command in (
                    ("status",),
                    ("watch", "--provider", "sim", "--job", "j1", "--operation", "op-secret"),
                ):
                    out = ws.bide(*command)
                    assert out.returncode != 0, out.stdout + out.stderr
                    assert "runs as bidea-hostile" in out.stderr, out.stderr
                    assert "nothing was sent" in out.stderr
                    assert "daemon_user" in out.stderr
                if importlib.util.find_spec("mcp") is not None:
                    assert "runs as bidea-hostile" in anyio.run(_mcp_refusal, ws.config)
            assert not got.exists() or got.read_bytes() == b""  # not one byte of a request
        finally:
            server.kill()
            server.wait(10)


async def _mcp_refusal(config: Path) -> str:
    """What ``bide mcp`` (through the MCP SDK's client) answers a tool call with."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "daemon.cli", "mcp", "--config", str(config)]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        result = await s.call_tool("list_my_operations", {})
        assert result.is_error
        return " ".join(getattr(c, "text", "") for c in result.content)


def test_the_daemon_s_own_user_is_no_approver_even_in_the_approvers_group(tmp_path: Path) -> None:
    # The daemon runs as root here, so root is the daemon's own user: in the approvers' group
    # and with allow_root_approval, it still never answers an escalation (as in the spool).
    groups = ("bidea-appr",)
    with unix_users({}, groups, root_in=groups):
        config = "[spool]\nallow_root_approval = true\n"
        with workspace(
            tmp_path,
            jobs={"odd": "mystery"},
            config_extra=config,
            api='approvers_group = "bidea-appr"\nagents_group = ""\nallow_self_approval = true\n',
        ) as ws:
            ws.start_daemon()
            with api(ws) as client:
                watch(client, "op-odd", "odd")
                view = client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
                assert view["phase"] == "escalated"
                with pytest.raises(ApiCallError) as refused:
                    client.call(
                        "POST",
                        "/v1/operations/op-odd/decision",
                        body={"option": "abandon", "escalation_id": 1},
                    )
                assert refused.value.status == 403
                assert "the daemon's own user is never an approver" in refused.value.detail
            assert ws.log().ops["op-odd"].phase == "escalated"


def test_root_approves_over_the_api_only_with_allow_root_approval(tmp_path: Path) -> None:
    # The daemon runs as its own user here; root and that user are both in the approvers'
    # group, and neither may answer an escalation (root: allow_root_approval is off).
    groups = ("bidea-appr2",)
    with (
        unix_users({"bidea-daemon": groups}, groups, root_in=groups) as users,
        shared_dir() as shared,
    ):
        daemon_user = users["bidea-daemon"]
        python = python_for_everyone(shared)
        root = shared / "ws"
        root.mkdir()
        with workspace(
            root,
            jobs={"odd": "mystery"},
            api='approvers_group = "bidea-appr2"\nagents_group = ""\n'
            'allow_self_approval = true\nsocket_group = ""\n'
            'socket_mode = "0666"\n',
        ) as ws:
            subprocess.run(
                ["chown", "-R", f"{daemon_user.uid}:{daemon_user.gid}", str(root)], check=True
            )
            log_path = root / "daemon-as-user.log"
            with log_path.open("wb") as out:
                proc = subprocess.Popen(
                    [str(python), "-m", "daemon.cli", "run", "--config", str(ws.config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=root,
                    user=daemon_user.uid,
                    group=daemon_user.gid,
                    extra_groups=daemon_user.groups,
                    env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
                )
            daemon = Daemon(proc, log_path)
            ws.daemons.append(daemon)
            daemon.wait_ready()
            with api(ws) as client:
                assert client.call("GET", "/v1/health")["you"]["uid"] == 0
                watch(client, "op-odd", "odd")
                view = client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
                assert view["phase"] == "escalated"
                with pytest.raises(ApiCallError) as refused:
                    client.call(
                        "POST",
                        "/v1/operations/op-odd/decision",
                        body={"option": "abandon", "escalation_id": 1},
                    )
                assert refused.value.status == 403
                assert "allow_root_approval" in refused.value.detail
            own = as_user(
                ws, python, daemon_user, "decide", "op-odd", "abandon", "--escalation", "1"
            )
            assert own.returncode == 1, own.stdout + own.stderr
            assert "the daemon's own user is never an approver" in own.stdout
            with api(ws) as client:
                assert client.call("GET", "/v1/operations/op-odd")["phase"] == "escalated"
            daemon.stop()
            subprocess.run(["chown", "-R", "0:0", str(root)], check=True)  # root's to read
