"""Credentials that expire: the real daemon runs a real credential program (a script each test
writes) for the token the simulator demands (``Authorization: Bearer TOKEN``, else 401).

The token is cached across polls until shortly before it expires, then the program runs again;
a program that hangs is killed (with its children) at its timeout, and one that prints garbage or
exits non-zero costs that poll a transport failure, never the job; and neither the token nor
what the program printed reaches the daemon's output, the log or ``bide story``."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from daemon.credentials import CommandCredential
from daemon.profile import CredentialRef
from daemon.secretfiles import CredentialError
from replay.events import OperationStopped, TransportFailed
from tests.e2e.harness import TOKEN, Workspace, drop_registration, until, workspace

#: The program: each run appends a line to RUNS; what it does is the line of SCRIPT for that
#: run (the last line once runs outnumber them). ``{TOKEN}`` is the token.
PROGRAM = """\
#!{python}
import json, os, subprocess, sys, time
runs_file, plan_file = sys.argv[1], sys.argv[2]
with open(runs_file, "a") as f:
    f.write("run\\n")
runs = len(open(runs_file).read().splitlines())
plan = open(plan_file).read().splitlines()
step = plan[min(runs, len(plan)) - 1]
token = {token!r}
if step == "hang":
    child = subprocess.Popen(["sleep", "60"])  # a child holding stdout: killed with the group
    open(runs_file + ".child", "w").write(str(child.pid))
    time.sleep(60)
elif step == "garbage":
    print("not json, but the secret " + token)
elif step.startswith("wrong"):  # a token the provider refuses (revoked), good for an hour
    print(json.dumps({{"token": "revoked-" + str(runs), "expires_in": 3600}}))
elif step == "fail":
    print("error: the secret " + token, file=sys.stderr)
    sys.exit(3)
else:  # "ok SECONDS [DELAY]": a token good for that long, printed after DELAY seconds
    assert os.environ.get("PATH") == "/usr/local/bin:/usr/bin:/bin", os.environ
    assert os.environ.get("TOKEN_AUDIENCE") == "sim", os.environ
    words = step.split()
    time.sleep(float(words[2]) if len(words) > 2 else 0)
    print(json.dumps({{"token": token, "expires_in": float(words[1])}}))
"""


def credential_program(tmp: Path, plan: list[str]) -> tuple[Path, Path, Path]:
    """(program, runs file, plan file), outside the workspace (the program holds the token)."""
    tmp.mkdir()
    program, runs, plan_file = tmp / "get-token", tmp / "runs", tmp / "plan"
    program.write_text(PROGRAM.format(python=sys.executable, token=TOKEN))
    program.chmod(0o700)
    plan_file.write_text("\n".join(plan) + "\n")
    return program, runs, plan_file


def command_profile(ws: Workspace, program: Path, runs: Path, plan: Path, table: str) -> None:
    """The workspace's ``sim`` profile, its credential a command instead of a file."""
    path = ws.root / "profiles" / "sim.toml"
    text = path.read_text()
    command = json.dumps([str(program), str(runs), str(plan)])
    credential = f'[credential]\ncommand = {command}\nenv = {{ TOKEN_AUDIENCE = "sim" }}\n{table}'
    assert '[credential]\nfile = "sim.token"\n' in text
    path.write_text(text.replace('[credential]\nfile = "sim.token"\n', credential))


def run_count(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def assert_secret_kept(ws: Workspace, op: str) -> None:
    story = ws.bide("story", op)
    assert story.returncode == 0, story.stderr
    assert TOKEN not in story.stdout + story.stderr
    for daemon in ws.daemons:
        assert TOKEN not in daemon.output()
        assert "the secret" not in daemon.output()  # nothing the program printed
    assert "the secret" not in story.stdout
    # and ``workspace`` checks every file the run wrote, every command's output, the requests


def test_the_token_is_cached_until_near_expiry_then_the_program_runs_again(
    tmp_path: Path,
) -> None:
    """Each token is good for 61 s and the skew is 60 s, so it is kept for 1 s: the daemon polls
    every 0.2-0.4 s for about 3 s, running the program a few times, never once per poll."""
    program, runs, plan = credential_program(tmp_path / "bin", ["ok 61"])
    steps = [{"state": "running", "times": 10}, {"state": "succeeded", "result": True}]
    (tmp_path / "ws").mkdir()
    with workspace(tmp_path / "ws", {"j1": steps}) as ws:
        command_profile(ws, program, runs, plan, "expiry_skew_seconds = 60\n")
        ws.start_daemon()
        watched = ws.watch("j1", "op1")
        assert watched.returncode == 0, watched.stdout + watched.stderr
        ws.bide("wait", "op1", "--timeout", "30s")
        op = ws.log().ops["op1"]
        assert op.phase == "succeeded"  # every poll carried the program's token (else 401)
        polls = len(ws.sim.requests(kind="status", job_id="j1"))
        assert polls == 11
        assert 2 <= run_count(runs) < polls  # re-run near expiry, cached in between
        assert_secret_kept(ws, "op1")


def test_a_hanging_garbage_or_failing_program_is_a_transport_failure_then_recovers(
    tmp_path: Path,
) -> None:
    """Run 1 hangs (killed at 1 s, its child too), run 2 prints garbage quoting the token, run 3
    exits 3 with the token on stderr: three transport failures of three polls, the job goes
    on, and run 4's token finishes it."""
    program, runs, plan = credential_program(
        tmp_path / "bin", ["hang", "garbage", "fail", "ok 3600"]
    )
    steps = [{"state": "running", "times": 2}, {"state": "succeeded", "result": True}]
    (tmp_path / "ws").mkdir()
    with workspace(tmp_path / "ws", {"j2": steps}) as ws:
        command_profile(ws, program, runs, plan, "timeout_seconds = 1\n")
        ws.start_daemon()
        drop_registration(ws, "op2", "j2", max_transport_failures=5)
        ws.bide("wait", "op2", "--timeout", "30s")
        log = ws.log()
        assert log.ops["op2"].phase == "succeeded"
        failed = [e for _, e in log.events if isinstance(e, TransportFailed)]
        assert [f.kind for f in failed] == ["not_sent"] * 3
        hung, garbage, exited = (f.detail for f in failed)
        assert "did not finish within 1s; killed" in hung
        assert "not JSON" in garbage
        assert "exited with status 3" in exited
        assert log.ops["op2"].transport_failures_used == 3  # the transport budget, not the job
        assert run_count(runs) == 4
        [daemon] = ws.daemons
        assert daemon.output().count('msg="credential command failed"') == 3
        child = int((tmp_path / "bin" / "runs.child").read_text())
        until(lambda: not _alive(child), 5, "the hanging program's child to be killed")
        assert_secret_kept(ws, "op2")


def test_a_program_that_always_fails_spends_the_transport_budget_never_fails_the_job(
    tmp_path: Path,
) -> None:
    program, runs, plan = credential_program(tmp_path / "bin", ["fail"])
    steps = [{"state": "running", "times": 50}]
    (tmp_path / "ws").mkdir()
    with workspace(tmp_path / "ws", {"j3": steps}) as ws:
        command_profile(ws, program, runs, plan, "")
        ws.start_daemon()
        drop_registration(ws, "op3", "j3", max_transport_failures=2)
        ws.bide("wait", "op3", "--timeout", "30s")
        assert ws.log().ops["op3"].phase == "escalated"
        [stopped] = [e for _, e in ws.log().events if isinstance(e, OperationStopped)]
        assert stopped.reason == "delivery_ambiguous"  # never provider_failure
        assert ws.sim.requests(kind="status", job_id="j3") == []  # nothing sent without a token
        assert run_count(runs) == 2
        assert_secret_kept(ws, "op3")


def test_a_token_the_provider_refuses_is_not_kept(tmp_path: Path) -> None:
    """Run 1's token is good for an hour but revoked: the provider answers 401, that operation
    stops (authorization denied), and the next operation's request runs the program again
    rather than sending the refused token until its stated expiry."""
    program, runs, plan = credential_program(tmp_path / "bin", ["wrong", "ok 3600"])
    jobs: dict[str, list[object]] = {
        "j4": [{"state": "running"}],
        "j5": [{"state": "succeeded", "result": True}],
    }
    (tmp_path / "ws").mkdir()
    with workspace(tmp_path / "ws", jobs) as ws:
        command_profile(ws, program, runs, plan, "")
        ws.start_daemon()
        assert ws.watch("j4", "op4").returncode == 0
        ws.bide("wait", "op4", "--timeout", "30s")
        [stopped] = [e for _, e in ws.log().events if isinstance(e, OperationStopped)]
        assert stopped.reason == "authorization_denied"
        assert ws.watch("j5", "op5").returncode == 0
        ws.bide("wait", "op5", "--timeout", "30s")
        assert ws.log().ops["op5"].phase == "succeeded"
        assert run_count(runs) == 2
        assert_secret_kept(ws, "op5")


def test_requests_that_need_the_token_meanwhile_wait_for_the_one_run(tmp_path: Path) -> None:
    """Five requests at once, a program that takes 0.5 s and a token too close to expiry to
    keep: one run, its token for all five; the next request runs the program again."""
    program, runs, plan = credential_program(tmp_path / "bin", ["ok 30 0.5"])
    ref = CredentialRef(command=[str(program), str(runs), str(plan)], env={"TOKEN_AUDIENCE": "sim"})
    credential = CommandCredential("sim", ref)
    tokens: list[str] = []

    async def main() -> None:
        async def one() -> None:
            tokens.append(await credential.token(5.0))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(one)
        assert run_count(runs) == 1
        tokens.append(await credential.token(5.0))  # not cached: 30 s left, skew 60 s

    anyio.run(main)
    assert tokens == [TOKEN] * 6
    assert run_count(runs) == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"  # a zombie is dead, waiting for its reaper


def _printed(tmp_path: Path, output: str) -> CommandCredential:
    """A credential whose program is ``/bin/cat`` of ``output``: what a program printed."""
    path = tmp_path / "out.json"
    path.write_text(output)
    return CommandCredential("sim", CredentialRef(command=["/bin/cat", str(path)]))


def _in(seconds: float) -> str:
    when = datetime.now(UTC) + timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_kubectl_exec_credential_and_expires_at_are_read_and_cached(tmp_path: Path) -> None:
    exec_credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": TOKEN, "expirationTimestamp": _in(3600)},
    }
    for output in (exec_credential, {"token": TOKEN, "expires_at": _in(3600)}):
        credential = _printed(tmp_path, json.dumps(output))
        assert anyio.run(credential.token, 5.0) == TOKEN
        assert anyio.run(credential.token, 5.0) == TOKEN
        assert credential.runs == 1  # good for an hour: the second request used the cache


@pytest.mark.parametrize(
    ("output", "why"),
    [
        ({"token": TOKEN, "expires_at": _in(-5)}, "has already expired"),
        ({"token": TOKEN, "expires_at": "tomorrow " + TOKEN}, "not an RFC 3339 time"),
        ({"token": TOKEN, "expires_in": "soon"}, "expires_in that is not seconds"),
        ({"token": TOKEN + "\r\nX-Evil: 1"}, "cannot be sent in a header"),
        ({"token": ""}, 'printed no "token"'),
        ({"AccessKeyId": "AKIA" + TOKEN, "Version": 1}, "AWS keys"),
        ([TOKEN], "not an object"),
        ("x" * (64 * 1024 + 1), "more than 65536 bytes"),
    ],
)
def test_a_bad_answer_is_refused_without_quoting_it(
    tmp_path: Path, output: object, why: str
) -> None:
    credential = _printed(tmp_path, output if isinstance(output, str) else json.dumps(output))
    with pytest.raises(CredentialError) as info:
        anyio.run(credential.token, 5.0)
    assert why in str(info.value)
    assert TOKEN not in str(info.value)
    assert str(info.value).startswith("credential command /bin/cat for provider sim ")
