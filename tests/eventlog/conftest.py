"""Fixtures of the event-log tests: keys and small real logs with many segments."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventlog.epochs import EpochPolicy
from tests.eventlog._logtools import EVERY_3, KeySet, build_log, make_keys

#: The signing modes every suite over ``base_logs`` runs in: format 2 (one signing key) and
#: format 3 (forward-secure: a new epoch key every 3 checkpoints, so several epochs).
MODES: dict[str, EpochPolicy | None] = {"single_key": None, "epochs": EVERY_3}


@pytest.fixture
def ks(tmp_path: Path) -> KeySet:
    return make_keys(tmp_path / "keys")


@dataclass(frozen=True)
class BaseLogs:
    keys: KeySet
    log: Path  # 60 events, ~11 segments, a checkpoint every 5 events, closed cleanly
    other: Path  # a second log made with the same keys
    mode: str = "single_key"  # or "epochs": format 3, a new epoch key every 3 checkpoints


@pytest.fixture(scope="session", params=sorted(MODES))
def base_logs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> BaseLogs:
    mode: str = request.param
    root = tmp_path_factory.mktemp(f"base-{mode}")
    keys = make_keys(root / "keys")
    build_log(root / "log", keys, 60, epochs=MODES[mode])
    build_log(root / "other", keys, 60, epochs=MODES[mode])
    return BaseLogs(keys, root / "log", root / "other", mode)


@pytest.fixture
def log(base_logs: BaseLogs, tmp_path: Path) -> Path:
    """A private copy of the base log, to damage."""
    dst = tmp_path / "log"
    shutil.copytree(base_logs.log, dst)
    return dst
