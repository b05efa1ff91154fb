"""The kernel's fdatasync (eventlog.aio): submitted without a thread, answered on an eventfd."""

from __future__ import annotations

import errno
import os
import platform
import select
from pathlib import Path

import pytest

from eventlog.aio import open_ring


def test_a_submitted_fdatasync_completes_on_the_eventfd(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ring = open_ring(fd)
    assert ring is not None, "this kernel and file system take IOCB_CMD_FDSYNC (Linux >= 4.18)"
    try:
        for i in range(3):
            os.write(fd, b"record %d\n" % i)
            ring.submit(fd)
            assert ring.in_flight
            readable, _, _ = select.select([ring.fileno()], [], [], 10.0)
            assert readable == [ring.fileno()]
            assert ring.reap() == 0
            assert not ring.in_flight
        assert ring.reap() is None  # nothing more completes
    finally:
        ring.close()
        os.close(fd)
    assert (tmp_path / "seg").read_bytes() == b"record 0\nrecord 1\nrecord 2\n"


def test_the_kernel_refusing_a_descriptor_is_an_oserror(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT, 0o600)
    ring = open_ring(fd)
    assert ring is not None
    os.close(fd)
    try:
        with pytest.raises(OSError, match="io_submit") as caught:
            ring.submit(fd)  # closed: EBADF from io_submit itself
        assert caught.value.errno == errno.EBADF
        assert not ring.in_flight
    finally:
        ring.close()
    ring.close()  # closing twice is harmless


def test_a_file_without_fsync_gets_no_ring() -> None:
    """A pipe has no fsync: the kernel refuses the probe, so the writer keeps its thread."""
    r, w = os.pipe()
    try:
        assert open_ring(w) is None
    finally:
        os.close(r)
        os.close(w)


def test_the_ring_is_not_offered_where_the_numbers_are_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "s390x")
    fd = os.open(tmp_path / "seg", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert open_ring(fd) is None
    finally:
        os.close(fd)
