"""Calling the daemon's local API from the CLI (and ``bide mcp``): one Unix socket, JSON in
and out, the daemon's errors raised as :class:`ApiCallError` with its words.

No key is needed or read: the daemon knows the caller from the socket's peer credentials.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

import httpx
import msgspec

from daemon.errors import DaemonError

#: A call's own time, beyond any server-side wait it asks for.
CALL_TIMEOUT = 30.0


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


class ApiClient:
    def __init__(self, socket_path: Path, *, timeout: float = CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path), retries=0),
            base_url="http://bide", timeout=timeout, follow_redirects=False, trust_env=False)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def answers(self) -> bool:
        """Whether something listens on the socket (a running daemon, or systemd holding
        the socket for it). A socket this user may not open is an error naming the fix."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except PermissionError:
            raise DaemonError(
                f"cannot connect to the daemon's API socket {self.socket_path}: permission "
                f"denied; ask an administrator to add you to the socket's group ([api] "
                f"socket_group, bide-agents by default)") from None
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
                return False
            raise DaemonError(f"cannot connect to {self.socket_path}: {exc.strerror}") from None
        finally:
            probe.close()
        return True

    def call(self, method: str, path: str, *, body: Any = None,
             params: dict[str, str] | None = None, timeout: float | None = None) -> Any:
        """One call; the decoded JSON answer (or text, for text/plain)."""
        content = msgspec.json.encode(body) if body is not None else None
        try:
            response = self._client.request(
                method, path, content=content, params=params,
                headers={"Content-Type": "application/json"} if content is not None else None,
                timeout=timeout if timeout is not None else self.timeout)
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise DaemonUnavailable(
                f"the daemon does not answer on {self.socket_path} ({exc}); start it "
                f"(systemctl start bide, or bide run), or read the log offline with --offline"
            ) from None
        except httpx.TimeoutException:
            raise DaemonError(f"the daemon did not answer within "
                              f"{timeout or self.timeout:g}s on {self.socket_path}") from None
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"the connection to the daemon broke ({exc}); it may have "
                                    f"stopped") from None
        return answer_of(response)


def answer_of(response: httpx.Response) -> Any:
    """The decoded answer (text for text/plain); an error answer as :class:`ApiCallError`."""
    if response.headers.get("content-type", "").startswith("text/plain"):
        data: Any = response.text
    else:
        try:
            data = msgspec.json.decode(response.content) if response.content else None
        except msgspec.DecodeError:
            raise DaemonError(f"the daemon answered {response.status_code} with a body "
                              f"that is not JSON") from None
    if response.status_code >= 400:
        if isinstance(data, dict):
            raise ApiCallError(response.status_code, str(data.get("error", "error")),
                               str(data.get("detail", "")), data.get("field"))
        raise ApiCallError(response.status_code, "error", str(data))
    return data


class AsyncApiClient:
    """The same calls from async code (``bide mcp``): one connection pool on the socket."""

    def __init__(self, socket_path: Path, *, timeout: float = CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path), retries=0),
            base_url="http://bide", timeout=timeout, follow_redirects=False, trust_env=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, *, body: Any = None,
                   params: dict[str, str] | None = None,
                   answer_within: float | None = None) -> Any:
        """One call; ``answer_within`` overrides the client's timeout (for a long wait)."""
        content = msgspec.json.encode(body) if body is not None else None
        try:
            response = await self._client.request(
                method, path, content=content, params=params,
                headers={"Content-Type": "application/json"} if content is not None else None,
                timeout=answer_within if answer_within is not None
                else httpx.USE_CLIENT_DEFAULT)
        except (httpx.ConnectError, FileNotFoundError):
            raise DaemonUnavailable(
                f"the bide daemon is not running: nothing answers on {self.socket_path}; a "
                f"person must start it (systemctl start bide)") from None
        except httpx.TimeoutException:
            raise DaemonError("the bide daemon did not answer in time") from None
        except httpx.TransportError as exc:
            raise DaemonUnavailable(f"the connection to the bide daemon broke ({exc})") from None
        return answer_of(response)
