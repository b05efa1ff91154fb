"""The README's "A first run, by hand" is run exactly as written, so it cannot drift: its shell
block, taken from README.md by its marker, runs in a real bash against the real simulator and
daemon, in a checkout-like directory whose `.venv` is the one running these tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
MARKER = "<!-- first-run:"
#: What a newcomer's shell does not have: a config already chosen, a venv already active, or
#: what systemd gives a service (a runtime directory for the socket, credentials, a socket).
SERVICE_ENV = {
    "BIDE_CONFIG",
    "VIRTUAL_ENV",
    "RUNTIME_DIRECTORY",
    "CREDENTIALS_DIRECTORY",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
}


def first_run_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split(MARKER, 1)
    assert len(after) == 2, f"README.md lost its {MARKER!r} marker before the first-run block"
    block = re.search(r"```sh\n(.*?)```", after[1], re.DOTALL)
    assert block is not None, "README.md has no ```sh block after the first-run marker"
    return block.group(1)


def test_the_first_run_uses_only_paths_the_newcomer_owns() -> None:
    block = first_run_block()
    for root_only in ("/etc/", "/var/", "/run/", "/opt/", "sudo "):
        assert root_only not in block, f"the first run needs {root_only!r}: a newcomer cannot"
    assert ". .venv/bin/activate" in block  # what `make demo` made, so `bide` is on PATH


def test_the_readme_first_run_reaches_a_finished_job(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file() or not (venv / "bin" / "bide").is_file():
        pytest.skip(f"the tests run outside a venv with bide installed ({venv}); make test has one")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(venv)
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}
    env["TMPDIR"] = str(tmp_path)  # mktemp -d makes the newcomer's directory in here
    started = time.monotonic()
    # Into a file, not a pipe: a failed block leaves its background jobs holding the pipe.
    with (tmp_path / "out.txt").open("w") as sink:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", first_run_block()],
            cwd=checkout,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=60)
        finally:
            with suppress(ProcessLookupError):  # the block's background jobs, if it failed
                os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - started
    out = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, out
    assert re.search(r"^first\s+sim/export-1\s+succeeded\b", out, re.MULTILINE), out
    assert "state succeeded, succeeded, results result_url=http://127.0.0.1:" in out, out
    assert "verdict=intact" in out, out
    [workdir] = [p for p in tmp_path.iterdir() if p.name.startswith("tmp.")]
    assert (workdir / "state" / "log").is_dir()  # the log is in the newcomer's own directory
    assert "level=error" not in (workdir / "daemon.log").read_text(), out
    assert took < 30, f"the first run took {took:.1f} s; the README promises about ten"
