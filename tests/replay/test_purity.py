"""replay/ is pure: no I/O, clock, randomness or concurrency modules; no Any; honest __all__."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import replay

REPLAY_DIR = pathlib.Path(replay.__file__).parent
FORBIDDEN = {
    "anyio",
    "asyncio",
    "httpx",
    "os",
    "pathlib",
    "random",
    "secrets",
    "select",
    "selectors",
    "shutil",
    "socket",
    "subprocess",
    "threading",
    "time",
    "watchfiles",
    "cryptography",
    "eventlog",
    "daemon",
}


def test_importing_replay_loads_no_forbidden_module() -> None:
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import replay, replay.check, replay.story, replay.decide\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert "replay" in loaded
    assert loaded & FORBIDDEN == set()


def test_replay_sources_import_nothing_forbidden_and_no_any() -> None:
    for path in REPLAY_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.module == "typing":
                    assert "Any" not in {a.name for a in node.names}, path
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, (path.name, name)
        text = path.read_text(encoding="utf-8")
        assert "from __future__ import annotations" in text, path.name
        assert "typing.Any" not in text, path.name


def test_all_is_honest() -> None:
    import types

    exported = set(replay.__all__)
    public = {
        name
        for name in dir(replay)
        if not name.startswith("_")
        and name != "annotations"  # from __future__
        and not isinstance(getattr(replay, name), types.ModuleType)
    }
    assert exported == public
    for name in replay.__all__:
        assert getattr(replay, name) is not None


def test_decide_module_states_its_theory_of_operation() -> None:
    import importlib

    doc = importlib.import_module("replay.decide").__doc__ or ""
    assert "Theory of operation" in doc
    assert "S32" in doc
    assert "S13" in doc
