"""Calling the daemon's local API from the CLI (and ``bide mcp``): one Unix socket, JSON in
and out, the daemon's errors raised as :class:`ApiCallError` with its words.

No key is needed or read: the daemon knows the caller from the socket's peer credentials.
Before a byte is sent, the client checks the same on its own side: the process that answers
must run as the daemon's configured user (``[api] daemon_user``; without one, the socket
file's owner) or root (systemd, holding the socket for the daemon). Another local user who
bound the socket's path first gets nothing.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpcore
import httpx
import msgspec

from daemon.errors import DaemonError
from replay.text import format_time

#: A call's own time, beyond any server-side wait it asks for.
CALL_TIMEOUT = 30.0


def api_time(value: object) -> datetime:
    """A time from the API's answer, in UTC: RFC 3339 text, or the POSIX seconds a daemon
    from before RFC 3339 answered with (a CLI upgraded before the daemon restarts)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if when.tzinfo is not None:
                return when.astimezone(UTC)
    raise DaemonError(f"the daemon answered with a time that is not RFC 3339: {value!r}")


def shown_time(value: object) -> str:
    """A time from the API's answer as the CLI and the MCP tools show it
    (``2026-12-07T13:04:05.123Z``)."""
    return format_time(api_time(value).timestamp())


class DaemonUnavailable(DaemonError):
    """Nothing answers on the socket: the daemon is not running (or not this config's)."""

    exit_status = 69  # EX_UNAVAILABLE


class ApiCallError(DaemonError):
    """The daemon answered with an error."""

    def __init__(self, status: int, error: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.field = field
        self.exit_status = 1 if status in (409, 422, 410) else 2


_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ImpostorSocket(DaemonError):
    """The process answering on the socket is not the daemon's user: nothing was sent."""


class PeerCheck:
    """Who may answer on the socket: the daemon's configured user (or, without one, the
    socket file's owner), and root."""

    def __init__(self, socket_path: Path, daemon_user: str = "") -> None:
        self.socket_path = socket_path
        self.daemon_user = daemon_user

    def expected_uid(self) -> int:
        if self.daemon_user:
            try:
                return pwd.getpwnam(self.daemon_user).pw_uid
            except KeyError:
                raise DaemonError(
                    f"[api] daemon_user {self.daemon_user!r} is not a user on this "
                    f"machine; set it to the user the daemon runs as"
                ) from None
        try:
            return os.stat(self.socket_path).st_uid
        except OSError as exc:
            raise DaemonError(
                f"cannot stat the API socket {self.socket_path}: {exc.strerror}"
            ) from None

    def check(self, sock: socket.socket) -> None:
        """Raise :class:`ImpostorSocket` unless the connected peer is the daemon's user."""
        pid, uid, _ = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        )
        expected = self.expected_uid()
        if uid in (expected, 0):
            return
        whose = (
            f"[api] daemon_user = {self.daemon_user!r}"
            if self.daemon_user
            else "the socket file's owner"
        )
        raise ImpostorSocket(
            f"the process answering on {self.socket_path} (pid {pid}) runs as "
            f"{_name(uid)}, not as the daemon's user {_name(expected)} ({whose}); nothing was "
            f"sent. Another local user may have bound that path: stop that process, remove the "
            f"socket, put [api] socket in a directory only the daemon's user can write, and "
            f"set [api] daemon_user to the daemon's user"
        )


def _name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


class _CheckedBackend(httpcore.SyncBackend):
    def __init__(self, peer: PeerCheck) -> None:
        self.peer = peer

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        stream = super().connect_unix_socket(path, timeout, socket_options)
        try:
            self.peer.check(stream.get_extra_info("socket"))
        except BaseException:
            stream.close()
            raise
        return stream


class _AsyncCheckedBackend(httpcore.AnyIOBackend):
    def __init__(self, peer: PeerCheck) -> None:
        self.peer = peer

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_unix_socket(path, timeout, socket_options)
        try:
            self.peer.check(stream.get_extra_info("socket"))
        except BaseException:
            await stream.aclose()
            raise
        return stream


def _transport(socket_path: Path, peer: PeerCheck) -> httpx.HTTPTransport:
    transport = httpx.HTTPTransport(uds=str(socket_path), retries=0)
    # httpx takes no network backend; its pool does, and every new connection passes here.
    transport._pool = httpcore.ConnectionPool(
        uds=str(socket_path), retries=0, network_backend=_CheckedBackend(peer)
    )
    return transport


def _async_transport(socket_path: Path, peer: PeerCheck) -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport(uds=str(socket_path), retries=0)
    transport._pool = httpcore.AsyncConnectionPool(
        uds=str(socket_path), retries=0, network_backend=_AsyncCheckedBackend(peer)
    )
    return transport


class ApiClient:
    def __init__(
        self, socket_path: Path, *, timeout: float = CALL_TIMEOUT, daemon_user: str = ""
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.peer = PeerCheck(socket_path, daemon_user)
        self._client = httpx.Client(
            transport=_transport(socket_path, self.peer),
            base_url="http://bide",
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def answers(self) -> bool:
        """Whether something listens on the socket (a running daemon, or systemd holding
        the socket for it). A socket this user may not open is an error naming the fix."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2.0)
            try:
                probe.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError):
                return False
            except PermissionError:
                raise DaemonError(
                    f"cannot connect to the daemon's API socket {self.socket_path}: permission "
                    f"denied; ask an administrator to add you to the socket's group ([api] "
                    f"socket_group, bide-agents by default)"
                ) from None
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
                    return False
                raise DaemonError(f"cannot connect to {self.socket_path}: {exc.strerror}") from None
            self.peer.check(probe)
        return True

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One call; the decoded JSON answer (or text, for text/plain)."""
        content = msgspec.json.encode(body) if body is not None else None
        try:
            response = self._client.request(
                method,
                path,
                content=content,
                params=params,
                headers={"Content-Type": "application/json"} if content is not None else None,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise DaemonUnavailable(
                f"the daemon does not answer on {self.socket_path} ({exc}); start it "
                f"(systemctl start bide, or bide run), or read the log offline with --offline"
            ) from None
        except httpx.TimeoutException:
            raise DaemonError(
                f"the daemon did not answer within "
                f"{timeout or self.timeout:g}s on {self.socket_path}"
            ) from None
        except httpx.TransportError as exc:
            raise DaemonUnavailable(
                f"the connection to the daemon broke ({exc}); it may have stopped"
            ) from None
        return answer_of(response)

    def download(
        self, path: str, write: Callable[[bytes], None], *, timeout: float | None = None
    ) -> httpx.Headers:
        """Stream a binary answer (a fetched result) into ``write``; its headers."""
        try:
            with self._client.stream("GET", path, timeout=timeout or self.timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    answer_of(response)
                for chunk in response.iter_bytes():
                    write(chunk)
                return response.headers
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise DaemonUnavailable(
                f"the daemon does not answer on {self.socket_path} ({exc})"
            ) from None
        except httpx.TimeoutException:
            raise DaemonError(
                f"the daemon stopped sending within {timeout or self.timeout:g}s "
                f"on {self.socket_path}"
            ) from None
        except httpx.TransportError as exc:
            raise DaemonUnavailable(
                f"the connection to the daemon broke ({exc}); it may have stopped"
            ) from None


def answer_of(response: httpx.Response) -> Any:
    """The decoded answer (text for text/plain); an error answer as :class:`ApiCallError`."""
    if response.headers.get("content-type", "").startswith("text/plain"):
        data: Any = response.text
    else:
        try:
            data = msgspec.json.decode(response.content) if response.content else None
        except msgspec.DecodeError:
            raise DaemonError(
                f"the daemon answered {response.status_code} with a body that is not JSON"
            ) from None
    if response.status_code >= 400:
        if isinstance(data, dict):
            raise ApiCallError(
                response.status_code,
                str(data.get("error", "error")),
                str(data.get("detail", "")),
                data.get("field"),
            )
        raise ApiCallError(response.status_code, "error", str(data))
    return data


class AsyncApiClient:
    """The same calls from async code (``bide mcp``): one connection pool on the socket."""

    def __init__(
        self, socket_path: Path, *, timeout: float = CALL_TIMEOUT, daemon_user: str = ""
    ) -> None:
        self.socket_path = socket_path
        self._client = httpx.AsyncClient(
            transport=_async_transport(socket_path, PeerCheck(socket_path, daemon_user)),
            base_url="http://bide",
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        answer_within: float | None = None,
    ) -> Any:
        """One call; ``answer_within`` overrides the client's timeout (for a long wait)."""
        content = msgspec.json.encode(body) if body is not None else None
        try:
            response = await self._client.request(
                method,
                path,
                content=content,
                params=params,
                headers={"Content-Type": "application/json"} if content is not None else None,
                timeout=answer_within if answer_within is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except (httpx.ConnectError, FileNotFoundError):
            raise DaemonUnavailable(
                f"the bide daemon is not running: nothing answers on {self.socket_path}; a "
                f"person must start it (systemctl start bide)"
            ) from None
        except httpx.TimeoutException:
            raise DaemonError("the bide daemon did not answer in time") from None
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"the connection to the bide daemon broke ({exc})") from None
        return answer_of(response)
