"""One writer per log: a second process fails at once naming the holder; SIGKILL frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from eventlog.errors import LockedError
from eventlog.lock import writer_alive
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet

HOLD = """
import sys, anyio
from pathlib import Path
from eventlog.keys import load_keyring, load_signer
from eventlog.writer import LogWriter

async def main() -> None:
    keys = Path(sys.argv[2])
    async with LogWriter(Path(sys.argv[1]), load_keyring(keys), load_signer(keys)):
        print("ready", flush=True)
        await anyio.sleep(3600)

anyio.run(main)
"""

TRY = """
import sys, anyio
from pathlib import Path
from eventlog.errors import LockedError
from eventlog.keys import load_keyring, load_signer
from eventlog.writer import LogWriter

async def main() -> None:
    keys = Path(sys.argv[2])
    try:
        async with LogWriter(Path(sys.argv[1]), load_keyring(keys), load_signer(keys)):
            print("opened")
    except LockedError as exc:
        print(f"locked: {exc}")

anyio.run(main)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path.cwd())}


def test_second_writer_in_another_process_fails_at_once(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"

    async def hold() -> tuple[float, str]:
        async with LogWriter(log, ks.keyring(), ks.signer()):
            started = time.monotonic()
            proc = await anyio.run_process(
                [sys.executable, "-c", TRY, str(log), str(ks.directory)], env=_env()
            )
            return time.monotonic() - started, proc.stdout.decode()

    elapsed, out = anyio.run(hold)
    assert out.startswith("locked: ")
    assert f"locked by pid {os.getpid()}" in out
    assert elapsed < 10  # it did not wait for the lock (interpreter start-up included)


def test_lock_is_free_after_the_holder_is_killed(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(log), str(ks.directory)],
        stdout=subprocess.PIPE,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        assert writer_alive(log)

        async def try_open() -> None:
            async with LogWriter(log, ks.keyring(), ks.signer()):
                pass

        with pytest.raises(LockedError, match=f"locked by pid {proc.pid}"):
            anyio.run(try_open)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert not writer_alive(log)
    anyio.run(try_open)  # the kernel dropped the lock with the process
