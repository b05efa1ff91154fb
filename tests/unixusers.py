"""Real Unix users and groups for the tests of who may do what, created for one test (or one
module) and removed however it ends, and a Python every one of them can run bide with.

Each test file names its users with a prefix of its own (``bide-t-``, ``bidea-``, ``bides-``),
so two files never delete each other's users.
"""

from __future__ import annotations

import importlib.metadata
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.harness import Workspace

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


def why_not() -> str | None:
    """Why these tests cannot run here (they skip, saying so), or None."""
    if os.geteuid() != 0:
        return "creates Unix users: needs root (CI runs as root)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "gpasswd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not SYSTEM_PYTHON.exists():
        return f"{SYSTEM_PYTHON} (a Python other users can run, of this minor version) is missing"
    return None


@dataclass
class User:
    name: str
    uid: int
    gid: int
    groups: list[int]


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@contextmanager
def unix_users(
    users: Mapping[str, tuple[str, ...]],
    groups: tuple[str, ...] = (),
    *,
    root_in: tuple[str, ...] = (),
    primary: Mapping[str, str] | None = None,
) -> Iterator[dict[str, User]]:
    """``users`` (name: its supplementary groups) and ``groups``, made afresh. A user's
    primary group is its own private one unless ``primary`` names one; root is made a member
    of ``root_in`` (groups of these tests only, so root's other memberships are untouched).
    What an interrupted earlier run left behind is removed first, users before groups (a
    group that is a leftover user's primary group cannot be deleted)."""
    for name in users:
        subprocess.run(["userdel", name], capture_output=True, check=False)
    for group in groups:
        subprocess.run(["groupdel", group], capture_output=True, check=False)
        run("groupadd", group)
    for group in root_in:
        run("gpasswd", "-a", "root", group)
    made: dict[str, User] = {}
    try:
        for name, member_of in users.items():
            subprocess.run(["userdel", name], capture_output=True, check=False)
            extra = ["--groups", ",".join(member_of)] if member_of else []
            if primary and name in primary:
                extra += ["--gid", primary[name]]
            run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", *extra, name)
            entry = pwd.getpwnam(name)
            made[name] = User(name, entry.pw_uid, entry.pw_gid, os.getgrouplist(name, entry.pw_gid))
        yield made
    finally:
        for name in users:
            subprocess.run(["userdel", name], capture_output=True, check=False)
        for group in groups:
            subprocess.run(["groupdel", group], capture_output=True, check=False)


@contextmanager
def shared_dir(prefix: str = "bide-users-") -> Iterator[Path]:
    """A directory other users can enter (pytest's own tmp is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _requirements(dist: str, extras: tuple[str, ...] = ()) -> set[str]:
    """The installed distributions ``dist`` (with ``extras``) needs, itself included."""
    seen: set[str] = set()
    todo = [(dist, extras)]
    while todo:
        name, wanted = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(key)
        for line in requires:
            requirement, _, marker = line.partition(";")
            extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", marker)
            if extra and extra.group(1) not in wanted:
                continue
            m = re.match(r"\s*([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?", requirement)
            if m:
                todo.append(
                    (
                        m.group(1),
                        tuple(e.strip() for e in (m.group(2) or "").split(",") if e.strip()),
                    )
                )
    return seen


def python_for_everyone(where: Path, extras: tuple[str, ...] = ()) -> Path:
    """A venv on the system's Python holding a copy of bide and the distributions it needs
    (with ``extras``): the checkout and its venv may be under a directory other users cannot
    enter (/root)."""
    env = where / "env"
    run(str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(env))
    site = next((env / "lib").glob("python*/site-packages"))
    for package in ("daemon", "eventlog", "replay"):
        shutil.copytree(
            ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in _requirements("bide", extras) - {"bide"}:
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file)))
            if file.parts[0].endswith(".data") or not source.is_file() or ".." in file.parts:
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return env / "bin" / "python"


def as_user(
    ws: Workspace, python: Path, user: User, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``bide ARGS --config`` run as ``user`` (its groups included), on ``python``."""
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
