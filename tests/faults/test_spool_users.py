"""The spool as ``deploy/README.md`` sets it up, with real Unix users (issue 34).

The daemon runs as its own service user (``bides-svc``: primary group ``bides-svc``, in the
agents' and approvers' groups as supplementary groups, as ``useradd --groups`` and the unit's
``SupplementaryGroups=`` make it), under the unit's filter on ``chown`` and setgid bits where
that filter can be built, in a state directory laid out by the unit's own ``ExecStartPre=+``
lines. The agents and the approver are users whose role group is a supplementary group, each
with a private primary group and the usual umask, running ``bide`` as themselves.

Was: a registration or decision dropped while the daemon was down was told "queued", and the
daemon, starting, rejected it ("cannot open: Permission denied": the file had the user's
private group and mode 0640, and the daemon is neither its owner nor in that group); the CLI
said "queued" even where the daemon could never open the file; and every agent read every
other agent's receipts (0640, group ``bide-agents``).
"""

from __future__ import annotations

import grp
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.readers import LoadedLog, load_log
from eventlog.keys import load_keyring
from replay.events import DecisionRecorded
from tests.e2e.harness import Daemon, Workspace, until, workspace
from tests.unixusers import User, as_user, python_for_everyone, run, shared_dir, unix_users, why_not

DEPLOY = Path(__file__).parents[2] / "deploy"
FILTER_SOURCE = Path(__file__).parent / "seccomp" / "unit_filter.c"
AGENTS, APPROVERS, SERVICE = "bides-agents", "bides-approvers", "bides-svc"
#: The deploy guide's users: the daemon's (in both role groups), one it forgot to add to the
#: agents' group, two agents and an approver (who is in bide-agents too, for the socket).
USERS: dict[str, tuple[str, ...]] = {
    "bides-svc": (AGENTS, APPROVERS),
    "bides-svc2": (APPROVERS,),
    "bides-agent": (AGENTS,),
    "bides-agent2": (AGENTS,),
    "bides-appr": (APPROVERS, AGENTS),
}
SPOOL = f'\n[spool]\nagents_group = "{AGENTS}"\napprovers_group = "{APPROVERS}"\n'
NO_API = "enabled = false\n"  # the CLI falls back to the spool, as when the socket is silent

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture(scope="module")
def people() -> Iterator[dict[str, User]]:
    """The groups and users of deploy/README.md section 1, removed however the tests end."""
    service = {name: SERVICE for name in USERS if name.startswith("bides-svc")}
    with unix_users(USERS, (AGENTS, APPROVERS, SERVICE), primary=service) as made:
        yield made


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A directory every user can enter (pytest's own tmp is root's alone)."""
    with shared_dir("bides-spool-") as path:
        yield path


@pytest.fixture(scope="module")
def python(shared: Path) -> Path:
    """A Python every user can run, holding bide (the daemon's and the users')."""
    return python_for_everyone(shared)


@pytest.fixture(scope="module")
def unit_filter(shared: Path) -> list[str]:
    """The unit's rules on chown and setgid bits as a seccomp wrapper, where it can be built."""
    if platform.machine() != "x86_64" or shutil.which("cc") is None:
        return []
    out = shared / "unit_filter"
    run("cc", "-O2", "-o", str(out), str(FILTER_SOURCE))
    out.chmod(0o755)
    return [str(out)]


@pytest.fixture
def root(shared: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir=shared))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _unit_spool_lines() -> list[tuple[str, str, int, str]]:
    """(owner, group, mode, path) of each ``ExecStartPre=+/usr/bin/install -d`` line."""
    pattern = r"ExecStartPre=\+/usr/bin/install -d -o (\S+) -g (\S+) -m (\d+) (\S+)"
    return [
        (m[1], m[2], int(m[3], 8), m[4])
        for line in (DEPLOY / "bide.service").read_text().splitlines()
        if (m := re.fullmatch(pattern, line))
    ]


def deploy(ws: Workspace, service: User, *, old_unit: bool = False) -> None:
    """What the guide's install and the unit do: the daemon's user owns its keys, its
    credentials and its state directory, and the spool is made by the unit's lines (with
    ``old_unit``, by the lines of the unit before issue 34: role directories 0730)."""
    groups = {"bide": SERVICE, "bide-agents": AGENTS, "bide-approvers": APPROVERS}
    shutil.copytree(ws.root / "keys", ws.root / "service-keys")  # root keeps its own copy
    for tree in (ws.root / "service-keys", ws.root / "creds"):
        for path in (tree, *tree.rglob("*")):
            os.chown(path, service.uid, service.gid)
    ws.config.write_text(
        ws.config.read_text().replace('keys_dir = "keys"', 'keys_dir = "service-keys"')
    )
    os.chmod(ws.config, 0o644)
    state = ws.root / "state"
    state.mkdir(mode=0o751)
    os.chown(state, service.uid, service.gid)
    os.chmod(state, 0o751)  # StateDirectoryMode=0751
    for _owner, group, mode, where in _unit_spool_lines():
        target = Path(where.replace("/var/lib/bide", str(state)))
        target.mkdir(exist_ok=True)
        os.chown(target, service.uid, grp.getgrnam(groups[group]).gr_gid)
        os.chmod(target, 0o730 if old_unit and mode & 0o7000 else mode)


def start_as(ws: Workspace, python: Path, wrapper: list[str], service: User) -> Daemon:
    """``bide run`` as the service user with its groups, as the unit starts it."""
    log_path = ws.root / f"daemon-{len(ws.daemons)}.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [*wrapper, str(python), "-m", "daemon.cli", "run", "--config", str(ws.config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            user=service.uid,
            group=service.gid,
            extra_groups=service.groups,
            umask=0o077,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
        )
    daemon = Daemon(proc, log_path)
    ws.daemons.append(daemon)
    daemon.wait_ready()
    return daemon


def log_of(ws: Workspace) -> LoadedLog:
    """The log as root reads it, with root's copy of the keys."""
    return load_log(ws.root / "state" / "log", load_keyring(ws.root / "keys"))


def read_as(user: User, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["cat", str(path)],
        capture_output=True,
        text=True,
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups,
        check=False,
        timeout=30,
    )


def _rejected(ws: Workspace) -> dict[str, str]:
    folder = ws.root / "state" / "spool" / "rejected"
    return {p.name: p.read_text() for p in folder.glob("*.reason")}


def test_requests_dropped_while_the_daemon_is_down_are_taken_when_it_starts(
    people: dict[str, User], python: Path, unit_filter: list[str], root: Path
) -> None:
    service, agent, approver = (people[n] for n in ("bides-svc", "bides-agent", "bides-appr"))
    with workspace(root, jobs={"j-odd": "mystery"}, config_extra=SPOOL, api=NO_API) as ws:
        deploy(ws, service)
        queued = as_user(
            ws,
            python,
            agent,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j-odd",
            "--operation",
            "op-a",
            "--wait-seconds",
            "0",
        )
        assert queued.returncode == 75, queued.stdout + queued.stderr
        assert "queued op-a" in queued.stdout

        daemon = start_as(ws, python, unit_filter, service)
        until(
            lambda: "op-a" in log_of(ws).ops or _rejected(ws),
            what="the queued registration to be taken",
        )
        assert _rejected(ws) == {}
        until(lambda: log_of(ws).ops["op-a"].phase == "escalated", what="the escalation")
        assert log_of(ws).ops["op-a"].registered_by == agent.name
        assert daemon.stop() == 0, daemon.output()

        decided = as_user(
            ws,
            python,
            approver,
            "decide",
            "op-a",
            "abandon",
            "--escalation",
            "1",
            "--note",
            "the provider's console says failed",
            "--wait-seconds",
            "0",
            "--json",
        )
        assert decided.returncode == 75, decided.stdout + decided.stderr
        assert json.loads(decided.stdout)["status"] == "queued"

        start_as(ws, python, unit_filter, service)
        until(
            lambda: log_of(ws).ops["op-a"].phase == "closed" or _rejected(ws),
            what="the queued decision to be recorded",
        )
        assert _rejected(ws) == {}
        decisions = [e for _, e in log_of(ws).events if isinstance(e, DecisionRecorded)]
        assert [(d.approver, d.option_id) for d in decisions] == [(approver.name, "abandon")]
        receipt = (
            ws.root
            / "state"
            / "spool"
            / "decided"
            / f"{json.loads(decided.stdout)['request_id']}.json"
        )
        assert json.loads(read_as(approver, receipt).stdout)["status"] == "recorded"
        other_approver = people["bides-svc2"]  # in the approvers' group, as the directory is
        assert read_as(other_approver, receipt).returncode != 0


def test_the_cli_refuses_to_queue_what_the_daemon_could_not_open(
    people: dict[str, User], python: Path, root: Path
) -> None:
    """The daemon's user is not in the agents' group, which spool/incoming gives its files:
    the daemon could never open them. Was: "queued", then rejected when the daemon started."""
    forgotten, agent = people["bides-svc2"], people["bides-agent"]
    with workspace(root, jobs={"j": "running"}, config_extra=SPOOL, api=NO_API) as ws:
        deploy(ws, forgotten)
        incoming = ws.root / "state" / "spool" / "incoming"
        refused = as_user(
            ws,
            python,
            agent,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j",
            "--operation",
            "op-never",
            "--wait-seconds",
            "0",
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "queued" not in refused.stdout
        assert f"{forgotten.name} (who owns {incoming}) is not in group {AGENTS}" in (
            refused.stderr
        )
        assert f"usermod -aG {AGENTS} {forgotten.name}" in refused.stderr
        assert list(incoming.iterdir()) == []  # nothing left behind, not even a dot-file


def test_an_agent_s_receipt_is_readable_by_that_agent_alone(
    people: dict[str, User], python: Path, unit_filter: list[str], root: Path
) -> None:
    service, alice, bob = (people[n] for n in ("bides-svc", "bides-agent", "bides-agent2"))
    with workspace(root, jobs={"j1": "running"}, config_extra=SPOOL, api=NO_API) as ws:
        deploy(ws, service)
        start_as(ws, python, unit_filter, service)
        taken = as_user(
            ws,
            python,
            alice,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j1",
            "--operation",
            "op-alice",
            "--json",
            "--wait-seconds",
            "30",
        )
        assert taken.returncode == 0, taken.stdout + taken.stderr  # alice read her receipt
        receipt = json.loads(taken.stdout)
        assert receipt["status"] == "registered"
        path = ws.root / "state" / "spool" / "receipts" / f"{receipt['request_id']}.json"

        assert json.loads(read_as(alice, path).stdout)["operation_id"] == "op-alice"
        other = read_as(bob, path)
        assert other.returncode != 0, other.stdout
        assert "Permission denied" in other.stderr
        assert "op-alice" not in other.stdout


def test_a_spool_made_by_the_older_unit_still_takes_what_agents_drop(
    people: dict[str, User], python: Path, unit_filter: list[str], root: Path
) -> None:
    """incoming/ 0730 without the setgid bit (the unit before issue 34): the CLI gives the
    file the directory's group itself, and the daemon, which may not set the bit under the
    unit, says how to and takes the file."""
    service, agent = people["bides-svc"], people["bides-agent"]
    with workspace(root, jobs={"j": "running"}, config_extra=SPOOL, api=NO_API) as ws:
        deploy(ws, service, old_unit=True)
        queued = as_user(
            ws,
            python,
            agent,
            "watch",
            "--provider",
            "sim",
            "--job",
            "j",
            "--operation",
            "op-old",
            "--wait-seconds",
            "0",
        )
        assert queued.returncode == 75, queued.stdout + queued.stderr
        daemon = start_as(ws, python, unit_filter, service)
        until(
            lambda: "op-old" in log_of(ws).ops or _rejected(ws),
            what="the queued registration to be taken",
        )
        assert _rejected(ws) == {}
        if unit_filter:
            assert "spool directory is not setgid" in daemon.output()
            assert "install -d -m 3730 -g bides-agents" in daemon.output()
