"""Shared pieces of the fault tests: mounts, metrics, the notify socket, the intent invariant.

The daemon runs for real (``tests.e2e.harness``); what these helpers add is the host's faults
(a small tmpfs, a read-only bind mount) and ways to watch the daemon from outside (its
``/metrics``, its ``STATUS=`` lines, its RSS), each bounded in time.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from replay.events import StatusRequestIntended
from tests.e2e.harness import Daemon, Workspace, until


def _can_mount() -> str | None:
    """Why mounting a tmpfs is impossible here, or None when it works."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount(8)/umount(8) not installed"
    return None


def require_mount() -> None:
    reason = _can_mount()
    if reason is not None:
        pytest.skip(reason)


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (created), unmounted however the test ends."""
    require_mount()
    path.mkdir(parents=True, exist_ok=True)
    try:
        _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield path
    finally:
        unmount(path)


def unmount(path: Path) -> None:
    """Unmount ``path``; lazily if it is still busy (a daemon that has not exited yet)."""
    proc = subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


@contextmanager
def read_only_over(source: Path, target: Path) -> Iterator[None]:
    """A read-only bind mount of ``source`` stacked on ``target`` until the block ends.

    A plain ``mount -o remount,ro`` is refused (EBUSY) while the daemon holds its segment
    open for writing; a new read-only mount on top has no writers, so it always succeeds.
    Descriptors opened before keep writing to the mount below; every path opened after
    (a new segment, a reopen) meets EROFS: exactly a file system that went read-only.
    """
    require_mount()
    try:
        _run("mount", "--bind", "-o", "ro", str(source), str(target))
    except OSError as exc:
        pytest.skip(f"cannot bind-mount here: {exc}")
    try:
        yield
    finally:
        _run("umount", str(target))


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros to ``directory/name`` until the file system is full (ENOSPC)."""
    path = directory / name
    block = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError:
                break
        while True:  # the last partial block
            try:
                if os.write(fd, b"\0") == 0:
                    break
            except OSError:
                break
    finally:
        os.close(fd)
    return path


def metrics_url(daemon: Daemon) -> str:
    until(
        lambda: re.search(r"address=(http://\S+/metrics)", daemon.output()),
        what="the metrics address in the daemon's log",
    )
    m = re.search(r"address=(http://\S+/metrics)", daemon.output())
    assert m
    return m.group(1)


def scrape(url: str) -> dict[str, float]:
    """Unlabelled and labelled samples of a Prometheus text page, by their full name."""
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class NotifySocket:
    """A ``$NOTIFY_SOCKET`` that keeps every message the daemon sends, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages += data.decode(errors="replace").splitlines()

    def statuses(self) -> list[str]:
        return [m.removeprefix("STATUS=") for m in list(self.messages) if m.startswith("STATUS=")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def intents(ws: Workspace) -> dict[tuple[str, int], StatusRequestIntended]:
    return {
        (e.operation_id, e.request_number): e
        for _, e in ws.log().events
        if isinstance(e, StatusRequestIntended)
    }


def assert_every_request_was_intended(ws: Workspace, jobs: dict[str, str]) -> int:
    """Every status request the provider saw has its intent in the log, written before it.

    ``jobs`` maps job id -> operation id. Returns how many requests were checked.
    """
    recorded = intents(ws)
    checked = 0
    for job, op in jobs.items():
        for n, req in enumerate(ws.sim.requests(kind="status", job_id=job), start=1):
            intent = recorded.get((op, n))
            assert intent is not None, f"request {n} of {op} reached the provider, no intent"
            assert intent.at <= req.wall, f"intent {n} of {op} written after the request"
            checked += 1
    return checked


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a live process, in KiB, from ``/proc/PID/status``."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]
