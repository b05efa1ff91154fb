"""Whether other users can run bide's Python (issue 37): a venv behind a directory closed to
them fails for the agents and the service user with `Permission denied`. The check is held
against the kernel's own answer for a real venv and a real unprivileged user, and `bide run`
warns with it at start."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.interpreter_access import closed_to_others, interpreter_unreachable_by_others
from tests.e2e.harness import workspace
from tests.unixusers import SYSTEM_PYTHON, shared_dir, unix_users, why_not

ROOT = Path(__file__).parents[1]
AGENT = "bidefd-agent"

ASK = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from daemon.interpreter_access import interpreter_unreachable_by_others as f; print(f())"
)


@pytest.fixture
def system_venv() -> Iterator[Path]:
    """A venv made from the system interpreter, in a directory other users can enter."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} (a system interpreter) is missing")
    with shared_dir("bide-firstday-") as shared:
        venv = shared / "venv"
        subprocess.run(
            [str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield venv


def ask_inside(venv: Path) -> str:
    """What interpreter_unreachable_by_others() says when run on the venv's interpreter."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", ASK.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_a_venv_behind_a_closed_directory_is_named_with_the_fix(system_venv: Path) -> None:
    assert ask_inside(system_venv) == "None"
    assert closed_to_others([system_venv / "bin" / "python"]) is None
    system_venv.chmod(0o700)  # as a venv under a 0700 home is
    said = ask_inside(system_venv)
    assert f"{system_venv} is mode 0700: other users cannot enter it" in said
    assert "Permission denied" in said
    assert "/usr/bin/python3 -m venv" in said  # the fix


def test_the_verdict_is_the_kernels_for_a_real_unprivileged_user(system_venv: Path) -> None:
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    python = system_venv / "bin" / "python"
    with unix_users({AGENT: ()}):

        def run_as_agent() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["runuser", "-u", AGENT, "--", str(python), "-c", "print('ran')"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        assert closed_to_others([python]) is None
        opened = run_as_agent()
        assert opened.returncode == 0, opened.stderr
        assert opened.stdout.strip() == "ran"
        system_venv.chmod(0o700)
        assert closed_to_others([python]) is not None
        closed = run_as_agent()
        assert closed.returncode != 0
        assert "Permission denied" in closed.stderr


def test_bide_run_warns_at_start_when_others_cannot_run_its_python(tmp_path: Path) -> None:
    """The daemon runs on this very interpreter: its warning is the function's verdict."""
    expected = interpreter_unreachable_by_others()
    with workspace(tmp_path, {"j": "running"}) as ws:
        daemon = ws.start_daemon()
        warned = "other users cannot run this Python" in daemon.output()
        assert warned == (expected is not None), daemon.output()
        if expected is not None:
            assert "level=warn" in daemon.output()
            assert "deploy/README.md, section 2" in daemon.output()
        assert daemon.stop() == 0
