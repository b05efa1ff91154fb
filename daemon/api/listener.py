"""The API's listening socket: inherited from systemd, or bound here.

Under socket activation (``deploy/bide.socket``) systemd owns the socket: it exists before the
daemon starts and across its restarts, so clients queue in its backlog instead of failing.
Without systemd the daemon binds the path itself: a socket file left by a crashed daemon (no
one answers) is replaced; one that answers belongs to a live daemon, and starting is refused,
as the log lock refuses a second writer. The socket gets the configured mode and group.
"""

from __future__ import annotations

import contextlib
import grp
import os
import socket
import stat
from pathlib import Path

import anyio.abc

from daemon import logfmt, systemd
from daemon.errors import ConfigError


def _inherited() -> socket.socket | None:
    for fd in systemd.listen_fds():
        sock = socket.socket(fileno=fd)
        if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM:
            return sock
        sock.detach()
        logfmt.warn("ignoring an inherited socket that is not a Unix stream socket", fd=fd)
    return None


def _in_use(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # a timeout or a permission problem: someone is there; do not steal it
    finally:
        probe.close()
    return True


def _bind(path: Path, mode: int, group: str) -> socket.socket:
    if len(os.fsencode(path)) > 107:  # sun_path holds 108 bytes with the terminating NUL
        raise ConfigError(f"[api] socket {path} is longer than a Unix socket path may be (107 "
                          f"bytes); set [api] socket to a shorter path")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"[api] socket {path} exists and is not a socket; remove it or "
                              f"choose another path")
        if _in_use(path):
            raise ConfigError(f"[api] socket {path} is answered by another process (a daemon "
                              f"already running?); stop it first")
        path.unlink()
        logfmt.info("replaced a stale API socket left by a daemon that died", socket=path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment in which the socket is open to more than its owner
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            logfmt.warn("the API socket's group does not exist; only the daemon's user and "
                        "root can connect", group=group, socket=path)
        else:
            with contextlib.suppress(PermissionError):
                os.chown(path, -1, gid)
    os.chmod(path, mode)
    sock.listen(1024)
    return sock


async def open_listener(path: Path, *, mode: int, group: str
                        ) -> tuple[anyio.abc.SocketListener, str, bool]:
    """The listener, the path it serves, and whether this process bound it (and so removes
    it when it stops)."""
    sock = _inherited()
    bound = sock is None
    if sock is None:
        sock = _bind(path, mode, group)
    sock.setblocking(False)
    name = sock.getsockname()
    where = name if isinstance(name, str) else str(path)
    return await anyio.abc.SocketListener.from_socket(sock), where, bound
