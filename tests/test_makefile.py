"""What each make target installs (issue 37): `make demo` the core only, the others the test
stack with every extra, in either order on one venv. Read from `make -n` (what make would run),
so nothing is installed here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(venv: Path, target: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"VENV={venv}", target],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if "pip install" in line]


def fake_venv(tmp_path: Path, *stamps: str) -> Path:
    """A venv as make sees one: its interpreter and the stamps of what was installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    for stamp in stamps:
        (venv / stamp).touch()
    return venv


def test_make_demo_installs_the_core_only(tmp_path: Path) -> None:
    installs = planned(tmp_path / "fresh", "demo")
    assert any(line.endswith("pip install --quiet -e .") for line in installs), installs
    assert not any("[test]" in line for line in installs), installs


@pytest.mark.parametrize("target", ["test", "lint", "bench", "audit"])
def test_the_other_targets_install_the_test_stack(tmp_path: Path, target: str) -> None:
    installs = planned(fake_venv(tmp_path, ".installed-core"), target)  # after make demo
    assert any("-e '.[test]'" in line for line in installs), installs


def test_make_demo_after_make_test_installs_nothing_more(tmp_path: Path) -> None:
    assert planned(fake_venv(tmp_path, ".installed", ".installed-core"), "demo") == []


def test_the_test_extra_pulls_every_runtime_extra() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for extra in ("mcp", "postgres", "aws"):
        assert f'"bide[{extra}]"' in pyproject
