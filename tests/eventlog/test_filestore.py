"""The segment-file store's own part of "a round is atomic": a round the disk refuses halfway
(here the file size limit, ``EFBIG``) leaves the files as they were before it."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest

from eventlog.errors import StoreError
from eventlog.filestore import FileStore
from eventlog.segments import list_segments
from eventlog.store import file_lines
from tests.eventlog._logtools import build_log, make_keys


def test_a_round_the_disk_refuses_halfway_leaves_nothing(tmp_path: Path) -> None:
    build_log(tmp_path / "source", make_keys(tmp_path / "keys"), 30, segment_bytes=1 << 20)
    lines = list(file_lines(tmp_path / "source"))
    store = FileStore(tmp_path / "log", snapshot_path=tmp_path / "state.snapshot")
    store.init()
    term = store.take_lease("node-a", 30)
    assert term is not None
    writer = store.writer(term)
    writer.commit(lines[:10], "0" * 64)
    before = {p.name: p.read_bytes() for _, p in list_segments(tmp_path / "log")}
    limit = sum(len(p) for p in before.values()) + len(lines[10].data) + 10
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
        with pytest.raises(StoreError, match="nothing of the round kept"):
            writer.commit(lines[10:20], lines[9].hash)  # the first line fits, not the rest
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert {p.name: p.read_bytes() for _, p in list_segments(tmp_path / "log")} == before
    writer.commit(lines[10:20], lines[9].hash)
    assert store.lines_after(-1) == lines[:20]
    store.close()
