"""The deploy guide's transcript of an agent and an approver is this test's output, so it cannot
drift from the code.

Two real Unix users run real ``bide`` commands in bash, each as themselves, against a real
daemon and the simulator: ``agent-runner`` (agents) hands a job over and waits, ``alice``
(approvers) answers its escalation with ``extend``. The commands and what they print are
compared with the block between the markers in deploy/README.md, after normalising only what
must differ from run to run (:func:`normalise`): times, paths, the simulator's address, the
test users' and groups' prefix, and seconds elapsed. On a difference the test fails and names
the command that rewrites the block:
``BIDE_REGENERATE_DOCS=1 .venv/bin/pytest tests/e2e/test_deploy_transcript.py``.

The same run checks the figures the transcript shows against the log: the extension added
exactly its 15 minutes and 4 checks to the deadline and budget in force.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from replay.events import OperationRegistered
from replay.text import format_time
from tests.e2e.harness import DEFAULT_CONTRACT, Workspace, workspace
from tests.unixusers import User, python_for_everyone, shared_dir, unix_users, why_not

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "deploy" / "README.md"
BEGIN = "<!-- transcript:agent-and-approver (tests/e2e/test_deploy_transcript.py) -->"
END = "<!-- /transcript:agent-and-approver -->"
REGENERATE = "BIDE_REGENERATE_DOCS=1 .venv/bin/pytest tests/e2e/test_deploy_transcript.py"

#: The test's users and groups carry a prefix of their own (never an operator's real
#: ``alice``); the transcript shows the users without it and the groups as the guide names
#: them (``bide-approvers``).
PREFIX = "bidex-"
GROUPS = (f"{PREFIX}agents", f"{PREFIX}approvers", f"{PREFIX}api")
USERS = {
    f"{PREFIX}agent-runner": (f"{PREFIX}agents", f"{PREFIX}api"),
    f"{PREFIX}alice": (f"{PREFIX}approvers", f"{PREFIX}agents", f"{PREFIX}api"),
}
API = f'socket_group = "{PREFIX}api"\nsocket_mode = "0660"\n'
SPOOL = f'\n[spool]\nagents_group = "{PREFIX}agents"\napprovers_group = "{PREFIX}approvers"\n'
#: Pending twice, a state the profile does not know, then pending until the seventh check.
JOB = "running x2, manual_review, running x3, succeeded with result"
PROFILE = DEFAULT_CONTRACT + "default_max_status_requests = 20\n"


@dataclass(frozen=True)
class Step:
    user: str
    command: str
    comment: str = ""


SCRIPT = (
    Step(
        "agent-runner",
        "bide watch --provider acme --job exp_123 --operation nightly --deadline 40m",
    ),
    Step(
        "agent-runner",
        "bide watch --provider acme --job exp_123 --operation nightly --deadline 40m",
        "a retry: the same receipt, nothing registered twice",
    ),
    Step(
        "agent-runner",
        'bide wait nightly --timeout 10m; echo "exit $?"',
        "exit 3: escalated, a human decides",
    ),
    Step("agent-runner", "bide escalations", "the options, numbered, and the command to decide"),
    Step("agent-runner", "bide decide nightly abandon --escalation 1"),
    Step(
        "alice",
        'bide decide nightly extend --escalation 1 --note "provider says 30 min more"',
        "deadline +15 min, checks 20 -> 24",
    ),
    Step("agent-runner", 'bide wait nightly --timeout 40m; echo "exit $?"'),
    Step(
        "agent-runner",
        "bide story nightly | tail -5",
        'decided "by alice": the new deadline and budget',
    ),
)

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture
def users() -> Iterator[dict[str, User]]:
    with unix_users(USERS, GROUPS) as made:
        yield made


def _bide_on_path(python: Path) -> Path:
    """A ``bide`` command for every user: the shared venv's Python running the CLI."""
    bin_dir = python.parent
    script = bin_dir / "bide"
    script.write_text(f'#!/bin/sh\nexec {python} -m daemon.cli "$@"\n')
    script.chmod(0o755)
    return bin_dir


def _run(ws: Workspace, bin_dir: Path, user: User, command: str) -> str:
    proc = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=90,
        cwd="/",
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": "/nonexistent",
            "LANG": "C.UTF-8",
            "BIDE_CONFIG": str(ws.config),
        },
    )
    ws.outputs += [proc.stdout, proc.stderr]
    return proc.stdout + proc.stderr


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
#: Where the normalised transcript's clock starts: the registration.
SHOWN_START = datetime(2026, 12, 7, 14, 0, tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Run:
    """What varies between runs, and what it is shown as."""

    registered_at: float
    replacements: dict[str, str]


def normalise(text: str, run: Run) -> str:
    """Only what must vary between runs: paths, the simulator's port, the test's name prefix,
    how many seconds passed, and times. A time a whole number of minutes from the registration
    (the registration itself, a deadline) is shown on a clock that starts at 14:00:00Z; any
    other (a poll, the decision) depends on the run's timing and is shown as ``<time>``."""
    for found, shown in run.replacements.items():
        text = text.replace(found, shown)
    text = re.sub(r"(elapsed: +)\d+s", r"\1<n>s", text)

    def clock(match: re.Match[str]) -> str:
        when = datetime.fromisoformat(match.group(0).replace("Z", "+00:00")).timestamp()
        offset = when - run.registered_at
        minutes = round(offset / 60)
        if minutes < 0 or abs(offset - minutes * 60) > 0.002:
            return "<time>"
        return format_time(SHOWN_START + minutes * 60)

    return _TIME.sub(clock, text)


def _block(transcript: list[tuple[Step, str]]) -> str:
    lines = ["```console"]
    for step, output in transcript:
        prompt = f"{step.user}$ {step.command}"
        lines.append(f"{prompt}  # {step.comment}" if step.comment else prompt)
        lines += output.rstrip("\n").splitlines()
    lines.append("```")
    return "\n".join(lines)


def _guide_parts() -> tuple[str, str, str]:
    text = GUIDE.read_text(encoding="utf-8")
    for marker in (BEGIN, END):
        assert marker in text, f"deploy/README.md lost its transcript marker {marker}"
    head, rest = text.split(BEGIN, 1)
    block, tail = rest.split(END, 1)
    return head + BEGIN + "\n", block.strip("\n"), "\n" + END + tail


def test_the_deploy_guide_transcript_is_what_bide_prints(users: dict[str, User]) -> None:
    with shared_dir(prefix="bidex-") as shared:
        python = python_for_everyone(shared)
        bin_dir = _bide_on_path(python)
        root = shared / "ws"
        root.mkdir()
        with workspace(root, jobs={"exp_123": JOB}, config_extra=SPOOL, api=API) as ws:
            ws.write_profile(name="acme", contract=PROFILE)
            (root / "profiles" / "sim.toml").unlink()
            os.chmod(ws.config, 0o644)
            ws.start_daemon()
            transcript = [
                (step, _run(ws, bin_dir, users[PREFIX + step.user], step.command))
                for step in SCRIPT
            ]
            log = ws.log()
            op = log.ops["nightly"]
            [registered] = [e for _, e in log.events if isinstance(e, OperationRegistered)]
        run = Run(
            registered_at=registered.at,
            replacements={
                ws.sim.base_url: "https://api.acme.example",
                str(root): "/var/lib/bide",
                str(shared): "/opt/bide",
                **{name: name.removeprefix(PREFIX) for name in USERS},
                PREFIX: "bide-",
            },
        )
        block = normalise(_block(transcript), run)
        # The figures the transcript shows are the ones the extension put in force.
        assert op.phase == "succeeded", block
        assert (op.status_requests_used, op.max_status_requests) == (7, 24), block
        assert op.deadline_at == registered.deadline_at + 900, block
    head, shown, tail = _guide_parts()
    if os.environ.get("BIDE_REGENERATE_DOCS") == "1":
        GUIDE.write_text(head + block + tail, encoding="utf-8")
        return
    assert shown == block, (
        "deploy/README.md's transcript differs from what bide prints now; if the change is "
        f"intended, rewrite it with: {REGENERATE}\n--- the guide\n{shown}\n--- bide now\n{block}"
    )
