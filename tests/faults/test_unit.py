"""The shipped unit starts with the shipped config (issue 20, finding 6).

``deploy/bide.service`` runs bide with ``SystemCallFilter=~@privileged`` (no ``chown``) and
``RestrictSUIDSGID=yes`` (no setgid bits), so the spool's groups are set up by its
``ExecStartPre=+`` lines. There is no systemd here to run the unit, so the test runs the daemon
under the same two rules as a seccomp filter (``seccomp/unit_filter.c``, built with the C
compiler) and does what the ``ExecStartPre=+`` lines say, read from the unit itself: the daemon
reaches ready and polls. Without those lines it refuses to start, naming the command that fixes
it, instead of dying on ``chown``. A last test keeps the unit, its config and the spool's layout
from drifting apart.
"""

from __future__ import annotations

import grp
import os
import platform
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.spool import Spool
from tests.e2e.harness import BIDE, until, workspace

DEPLOY = Path(__file__).parents[2] / "deploy"
UNIT = (DEPLOY / "bide.service").read_text()
FILTER_SOURCE = Path(__file__).parent / "seccomp" / "unit_filter.c"
AGENTS, APPROVERS = "bidetagents", "bidetapprovers"


def _setup_lines() -> list[tuple[str, str, int, str]]:
    """(owner, group, mode, path) of each ``ExecStartPre=+/usr/bin/install -d`` line."""
    found = []
    for line in UNIT.splitlines():
        m = re.fullmatch(
            r"ExecStartPre=\+/usr/bin/install -d -o (\S+) -g (\S+) -m (\d+) (\S+)", line
        )
        if m:
            found.append((m[1], m[2], int(m[3], 8), m[4]))
    return found


@pytest.fixture(scope="module")
def unit_filter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if platform.machine() != "x86_64" or shutil.which("cc") is None:
        pytest.skip("the seccomp filter is built for x86_64 with a C compiler")
    if os.geteuid() != 0:
        pytest.skip("creates groups (CI runs as root)")
    out = tmp_path_factory.mktemp("seccomp") / "unit_filter"
    subprocess.run(["cc", "-O2", "-o", str(out), str(FILTER_SOURCE)], check=True)
    return out


@pytest.fixture(scope="module")
def groups() -> Iterator[None]:
    for group in (AGENTS, APPROVERS):
        subprocess.run(["groupdel", group], capture_output=True)
        subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        yield
    finally:
        for group in (AGENTS, APPROVERS):
            subprocess.run(["groupdel", group], capture_output=True)


def _config_extra() -> str:
    return f'\n[spool]\nagents_group = "{AGENTS}"\napprovers_group = "{APPROVERS}"\n'


def _group_for(unit_group: str) -> str:
    return {"bide-agents": AGENTS, "bide-approvers": APPROVERS}.get(unit_group, "root")


def test_the_unit_s_setup_lets_the_daemon_start_under_its_filter(
    tmp_path: Path, unit_filter: Path, groups: None
) -> None:
    with workspace(
        tmp_path, {"j": "running, succeeded with result"}, config_extra=_config_extra()
    ) as ws:
        state = tmp_path / "state"
        for _owner, group, mode, path in _setup_lines():  # what ExecStartPre=+ does
            target = Path(path.replace("/var/lib/bide", str(state)))
            target.mkdir(parents=True, exist_ok=True)
            os.chown(target, -1, grp.getgrnam(_group_for(group)).gr_gid)
            os.chmod(target, mode)
        log = tmp_path / "filtered.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(unit_filter), *BIDE, "run", "--config", str(ws.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        try:
            until(
                lambda: "msg=ready" in log.read_text() or proc.poll() is not None,
                timeout=20,
                what="the daemon under the filter to be ready",
            )
            assert proc.poll() is None, log.read_text()
            assert ws.watch("j", "j").returncode == 0
            assert ws.bide("wait", "j", "--timeout", "20s").returncode == 0
        finally:
            proc.terminate()
            assert proc.wait(20) == 0, log.read_text()
        receipts = Spool(state / "spool").receipts
        assert grp.getgrgid(receipts.stat().st_gid).gr_name == AGENTS


def test_without_the_setup_it_refuses_naming_the_fix(
    tmp_path: Path, unit_filter: Path, groups: None
) -> None:
    """Was: PermissionError out of os.chown, a traceback, and a unit that never started."""
    with workspace(tmp_path, config_extra=_config_extra()) as ws:
        done = subprocess.run(
            [str(unit_filter), *BIDE, "run", "--config", str(ws.config)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "install -d" in done.stderr
        assert "Traceback" not in done.stderr


def test_the_unit_sets_up_every_spool_directory_as_the_daemon_expects() -> None:
    assert "SystemCallFilter=~@privileged @resources" in UNIT
    assert "RestrictSUIDSGID=yes" in UNIT
    assert "SystemCallErrorNumber=EPERM" in UNIT
    assert re.search(r"^IPAddressDeny=.*169\.254\.0\.0/16", UNIT, re.M)
    config = tomllib.loads((DEPLOY / "bide.toml").read_text())
    state = Path(config["paths"]["state_dir"])
    spool = Spool(state / "spool")
    layout = spool.layout(config["spool"]["agents_group"], config["spool"]["approvers_group"])
    expected = {path: (group or "bide", mode) for path, mode, group in layout}
    lines = {Path(path): (group, mode) for _, group, mode, path in _setup_lines()}
    assert lines == expected
    assert all(owner == "bide" for owner, *_ in _setup_lines())


def test_the_socket_unit_and_the_config_name_the_same_socket() -> None:
    """systemd holds the socket the daemon serves: one path, one group, one mode."""
    socket_unit = (DEPLOY / "bide.socket").read_text()
    config = tomllib.loads((DEPLOY / "bide.toml").read_text())["api"]

    def setting(name: str) -> str:
        m = re.search(rf"^{name}=(\S+)$", socket_unit, re.M)
        assert m, name
        return m.group(1)

    assert setting("ListenStream") == config["socket"]
    assert setting("SocketGroup") == config["socket_group"]
    assert setting("SocketMode") == config.get("socket_mode", "0660")
    assert setting("Service") == "bide.service"
    assert "Requires=bide.socket" in UNIT
