"""Real Unix users and groups for the tests of who may do what (prefix ``bidea``), created
for one test and removed however it ends, and a Python every one of them can run bide with."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.api import test_users
from tests.e2e.harness import Workspace


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "creates Unix users: needs root (CI runs as root)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "gpasswd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@dataclass
class User:
    name: str
    uid: int
    gid: int
    groups: list[int]


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextmanager
def unix_users(
    users: dict[str, tuple[str, ...]], groups: tuple[str, ...] = (), root_in: tuple[str, ...] = ()
) -> Iterator[dict[str, User]]:
    """``users`` (name: its groups) and ``groups``; root is made a member of ``root_in``
    (groups of these tests only, so root's other memberships are untouched)."""
    for group in groups:
        subprocess.run(["groupdel", group], capture_output=True, check=False)
        _run("groupadd", group)
    for group in root_in:
        _run("gpasswd", "-a", "root", group)
    made: dict[str, User] = {}
    try:
        for name, member_of in users.items():
            subprocess.run(["userdel", name], capture_output=True, check=False)
            extra = ["--groups", ",".join(member_of)] if member_of else []
            _run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name)
            entry = pwd.getpwnam(name)
            made[name] = User(name, entry.pw_uid, entry.pw_gid, os.getgrouplist(name, entry.pw_gid))
        yield made
    finally:
        for name in users:
            subprocess.run(["userdel", name], capture_output=True, check=False)
        for group in groups:
            subprocess.run(["groupdel", group], capture_output=True, check=False)


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory other users can enter (pytest's own tmp is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="bidea-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def python_for_everyone(where: Path) -> Path:
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        raise AssertionError(f"{system} (a Python other users can run) is missing")
    return test_users._python_for_everyone(where)


def as_user(
    ws: Workspace, python: Path, user: User, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(python), "-m", "daemon.cli", *args, "--config", str(ws.config)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        user=user.uid,
        group=user.gid,
        extra_groups=user.groups,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
    )
    ws.outputs += [proc.stdout, proc.stderr]
    return proc
