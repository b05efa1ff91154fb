"""The writer under a file system that turns read-only between two segments (no daemon).

A batch that crosses a segment boundary writes its first records into the open segment, then
cannot create the next one (EROFS), and cannot cut what it wrote either (``truncate`` by path
meets EROFS too). No caller was told those records are durable and the caller appends them
again after ``reopen``: they must be cut there, copied to ``quarantine/`` and named by a
``recovery`` record, never left in the chain twice.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import anyio
import pytest

from eventlog import keys
from eventlog.envelope import Recovery
from eventlog.errors import LogIOError
from eventlog.reader import LogReader
from eventlog.segments import QUARANTINE_DIR
from eventlog.verify import verify_log
from eventlog.writer import LogWriter


def _erofs(*_args: object, **_kwargs: object) -> None:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def test_batch_half_written_before_a_read_only_rotation_is_not_doubled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys.generate(tmp_path / "keys")
    keyring, signer = keys.load_keyring(tmp_path / "keys"), keys.load_signer(tmp_path / "keys")
    log = tmp_path / "log"
    real_open = os.open
    read_only = False

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: int) -> int:
        if read_only and flags & (os.O_WRONLY | os.O_RDWR):
            _erofs()
        return real_open(path, flags, mode, **kw)

    batch = [b"retried %d " % i + b"x" * 300 for i in range(12)]  # ~6 KiB: crosses a segment

    async def run() -> Recovery | None:
        nonlocal read_only
        async with LogWriter(
            log,
            keyring,
            signer,
            segment_bytes=4096,
            checkpoint_every=10_000,
            checkpoint_interval=3600,
        ) as w:
            await w.append_many([b"before %d" % i for i in range(3)])
            monkeypatch.setattr(os, "open", open_)
            monkeypatch.setattr(os, "truncate", _erofs)
            monkeypatch.setattr(os, "unlink", _erofs)
            read_only = True
            with pytest.raises(LogIOError, match="Read-only"):
                await w.append_many(batch)
            with pytest.raises(OSError, match="Read-only"):
                await w.reopen()  # still read-only: nothing changes, the writer stays failed
            assert w.failed is not None
            read_only = False
            monkeypatch.undo()
            await w.reopen()
            recovered = w.recovered
            await w.append_many(batch)  # the caller's retry
            await w.append(b"after")
        return recovered

    recovered = anyio.run(run)
    payloads = [p for _, p in LogReader(log, keyring).payloads()]
    assert payloads == [*(b"before %d" % i for i in range(3)), *batch, b"after"]
    report = verify_log(log, keys.load_verify_key(tmp_path / "keys" / "verify.pub"))
    assert report.damage is None
    assert report.torn is None
    assert recovered is not None, "the cut is recorded in the chain"
    assert recovered.cut_len > 0
    kept = (log / recovered.quarantine).read_bytes()
    assert len(kept) == recovered.cut_len
    assert b'"kind":"event"' in kept
    assert (log / QUARANTINE_DIR).is_dir()
