"""A private PostgreSQL cluster (initdb in a temporary directory, its own port on 127.0.0.1),
for tests that restart or crash the server: the shared server is never touched."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.pgsupport import unavailable


@dataclass
class Cluster:
    data: Path
    port: int
    bindir: Path
    user: str | None  # run the server's tools as this user (root may not run postgres)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=90)

    def start(self) -> None:
        self.ctl(
            "-l",
            str(self.data / "server.log"),
            "-o",
            f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1",
            "start",
        )

    def restart_immediate(self) -> None:
        """As after a crash: an immediate shutdown (no checkpoint), then WAL recovery."""
        self.ctl("-m", "immediate", "stop")
        self.start()


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    bindir = _bindir()
    if bindir is None:
        unavailable("no initdb to create a private cluster (install postgresql)")
        raise AssertionError("unreachable")
    user = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("running as root and there is no postgres user to run a cluster")
            raise
        user = "postgres"
    root = Path(tempfile.mkdtemp(prefix="bide-pg-"))
    data = root / "data"
    try:
        if user is not None:
            os.chown(root, pw.pw_uid, pw.pw_gid)
        cmd = [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        cluster = Cluster(data, port, bindir, user)
        cluster.start()
        try:
            yield cluster
        finally:
            with suppress(subprocess.CalledProcessError):
                cluster.ctl("-m", "immediate", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
