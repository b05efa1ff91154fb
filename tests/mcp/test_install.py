"""The core install stays free of the MCP SDK: everything but ``bide mcp`` runs without it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_MCP = "import sys; sys.modules.update(mcp=None, mcp_types=None, pydantic=None); "


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MCP + code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_the_core_dependencies_do_not_name_the_sdk() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "mcp" not in core
    assert "pydantic" not in core
    assert any(d.startswith("mcp") for d in project["optional-dependencies"]["mcp"])


def test_every_module_but_the_mcp_server_imports_without_the_sdk() -> None:
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for package in ("daemon", "eventlog", "replay")
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py" and p.stem != "__main__"
    )
    modules.remove("daemon.mcp")
    done = _python(
        "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]", *modules
    )
    assert done.returncode == 0, done.stderr


def test_bide_mcp_without_the_sdk_names_the_install_command(tmp_path: Path) -> None:
    config = tmp_path / "bide.toml"
    config.write_text('[paths]\nstate_dir = "state"\n')
    done = _python(
        "from daemon.cli import main; sys.exit(main(sys.argv[1:]))", "mcp", "--config", str(config)
    )
    assert done.returncode == 2
    assert "pip install 'bide[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr
    helped = _python("from daemon.cli import main; sys.exit(main(sys.argv[1:]))", "--help")
    assert helped.returncode == 0
    assert "mcp" in helped.stdout
