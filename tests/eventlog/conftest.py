"""Fixtures of the event-log tests: keys and small real logs with many segments."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.eventlog._logtools import KeySet, build_log, make_keys


@pytest.fixture
def ks(tmp_path: Path) -> KeySet:
    return make_keys(tmp_path / "keys")


@dataclass(frozen=True)
class BaseLogs:
    keys: KeySet
    log: Path  # 60 events, ~11 segments, a checkpoint every 5 events, closed cleanly
    other: Path  # a second log made with the same keys


@pytest.fixture(scope="session")
def base_logs(tmp_path_factory: pytest.TempPathFactory) -> BaseLogs:
    root = tmp_path_factory.mktemp("base")
    keys = make_keys(root / "keys")
    build_log(root / "log", keys, 60)
    build_log(root / "other", keys, 60)
    return BaseLogs(keys, root / "log", root / "other")


@pytest.fixture
def log(base_logs: BaseLogs, tmp_path: Path) -> Path:
    """A private copy of the base log, to damage."""
    dst = tmp_path / "log"
    shutil.copytree(base_logs.log, dst)
    return dst
