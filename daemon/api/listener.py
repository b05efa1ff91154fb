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
import pwd
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


def _make_private_parents(directory: Path) -> None:
    """Create the missing directories on the way to the socket, 0755 and the daemon's own."""
    missing = []
    for parent in (directory, *directory.parents):
        if parent.exists():
            break
        missing.append(parent)
    for parent in reversed(missing):
        with contextlib.suppress(FileExistsError):
            parent.mkdir(mode=0o755)


def _private_group(gid: int, uid: int) -> bool:
    """Whether the group ``gid`` holds nobody but ``uid`` (and root): a user-private group."""
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    allowed = {0, uid}
    if any(_uid_of(name) not in allowed for name in members):
        return False
    return all(entry.pw_uid in allowed for entry in pwd.getpwall() if entry.pw_gid == gid)


def _uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _writable_by_others(directory: Path) -> str | None:
    """Why someone other than the daemon's user and root could create or replace a file in
    ``directory`` (None: nobody can). The directory itself may be written by no one else,
    sticky or not; each directory above it may be, only if sticky (as /tmp is: nobody can
    rename or remove what another user owns there)."""
    me = os.geteuid()
    resolved = directory.resolve()
    for n, parent in enumerate((resolved, *resolved.parents)):
        st = parent.stat()
        owner_ok = st.st_uid in (0, me)
        group_writes = bool(st.st_mode & 0o020) and not _private_group(st.st_gid, me)
        writable = st.st_mode & 0o002 or group_writes or not owner_ok
        if not writable:
            continue
        if n > 0 and st.st_mode & stat.S_ISVTX and owner_ok:
            continue
        who = (
            "owned by another user"
            if not owner_ok
            else "writable by others"
            if st.st_mode & 0o002
            else "writable by its group"
        )
        sticky = (
            " (sticky, as /tmp is, still lets anyone create a name in it)"
            if (st.st_mode & stat.S_ISVTX and n == 0)
            else ""
        )
        where = "its directory" if n == 0 else "a directory above it,"
        return f"{where} {parent} is {who}{sticky}"
    return None


def _bind(path: Path, mode: int, group: str) -> socket.socket:
    if len(os.fsencode(path)) > 107:  # sun_path holds 108 bytes with the terminating NUL
        raise ConfigError(
            f"[api] socket {path} is longer than a Unix socket path may be (107 "
            f"bytes); set [api] socket to a shorter path"
        )
    _make_private_parents(path.parent)
    unsafe = _writable_by_others(path.parent)
    if unsafe is not None:
        raise ConfigError(
            f"[api] socket {path}: {unsafe}, so another local user could put their own "
            f"socket there first and receive the agents' requests; set [api] socket to a path "
            f"in a directory only the daemon's user (or root) can write, such as "
            f"/run/bide/api.sock (systemd's RuntimeDirectory=bide) or the state directory, or "
            f"to a path under a directory that does not exist yet (the daemon creates it "
            f"0755, its own)"
        )
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(
                f"[api] socket {path} exists and is not a socket; remove it or choose another path"
            )
        if _in_use(path):
            raise ConfigError(
                f"[api] socket {path} is answered by another process (a daemon "
                f"already running?); stop it first"
            )
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
            logfmt.warn(
                "the API socket's group does not exist; only the daemon's user and "
                "root can connect",
                group=group,
                socket=path,
            )
        else:
            with contextlib.suppress(PermissionError):
                os.chown(path, -1, gid)
    os.chmod(path, mode)
    sock.listen(1024)
    return sock


async def open_listener(
    path: Path, *, mode: int, group: str
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
