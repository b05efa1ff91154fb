"""The systemd notify protocol, spoken directly: one datagram on ``$NOTIFY_SOCKET``.

A no-op without ``NOTIFY_SOCKET`` (not under systemd, or ``Type=simple``). ``READY=1`` after
replay and scheduling, ``STATUS=`` as things change, ``WATCHDOG=1`` at half of
``$WATCHDOG_USEC`` while the loop is healthy, ``STOPPING=1`` on shutdown. No dependency: the
protocol is a few lines (see sd_notify(3)).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import anyio


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]  # abstract namespace
    return addr


def notify(*assignments: str) -> bool:
    """Send ``KEY=VALUE`` lines in one datagram; False when there is no socket to send to."""
    addr = _address()
    if addr is None:
        return False
    payload = "\n".join(assignments).encode("utf-8", errors="replace")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(addr)
            sock.sendall(payload)
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half the configured timeout), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None


SD_LISTEN_FDS_START = 3


def listen_fds() -> list[int]:
    """The sockets systemd passed (socket activation, sd_listen_fds(3)): fds 3, 4, ... when
    ``$LISTEN_PID`` is this process; the variables are removed so no child inherits them."""
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if pid != str(os.getpid()) or not count:
        return []
    try:
        n = int(count)
    except ValueError:
        return []
    fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + max(0, n)))
    for fd in fds:
        os.set_inheritable(fd, False)
    return fds


async def report_status(status_line: Callable[[], str]) -> None:
    """Until cancelled: ping the watchdog (when the unit has one) and send ``STATUS=`` when the
    line changed; every :func:`watchdog_interval`, and at least every 5 s."""
    interval = watchdog_interval()
    period = min(interval, 5.0) if interval else 5.0
    last = ""
    while True:
        line = status_line()
        messages = ["WATCHDOG=1"] if interval else []
        if line != last:
            messages.append(f"STATUS={line}")
            last = line
        if messages:
            notify(*messages)
        await anyio.sleep(period)
