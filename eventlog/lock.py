"""The one-writer lock: ``flock`` on ``LOGDIR/LOCK``; the kernel drops it when the holder dies."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from eventlog.errors import LockedError

LOCK_FILE = "LOCK"


class WriterLock:
    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                pid = holder_pid(self.path.parent)
                who = f"pid {pid}" if pid else "another process"
                raise LockedError(
                    f"log {self.path.parent} is locked by {who} (another `bide run`?); "
                    f"stop it first, or point this one at another log"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def holder_pid(log_dir: Path) -> int | None:
    try:
        text = (log_dir / LOCK_FILE).read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def writer_alive(log_dir: Path) -> bool | None:
    """True when some process holds the writer lock right now; None when this user may not
    look (the log directory is the daemon's alone)."""
    try:
        fd = os.open(log_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except PermissionError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
