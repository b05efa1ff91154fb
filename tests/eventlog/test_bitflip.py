"""Bit-flip sweep: one flipped bit anywhere in a closed log is never reported intact.

A log of 250 events (a few hundred records, ~10 checkpoints, several segments) is flipped at
3000 seeded random bit positions, and at every bit of its final record (the one record no
successor links to: only its signature, canonical encoding and framing protect it).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from eventlog.segments import list_segments
from eventlog.verify import verify_log
from tests.eventlog._logtools import KeySet, build_log, make_keys
from tests.eventlog.conftest import MODES

SEED = 20240602
RANDOM_FLIPS = 3000


@pytest.fixture(scope="module", params=sorted(MODES))
def closed_log(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Path, KeySet]:
    """In both signing modes; with epochs, a new key every 3 checkpoints (3-4 epochs)."""
    root = tmp_path_factory.mktemp(f"bitflip-{request.param}")
    ks = make_keys(root / "keys")
    build_log(
        root / "log",
        ks,
        250,
        segment_bytes=16 * 1024,
        checkpoint_every=25,
        batch=7,
        epochs=MODES[request.param],
    )
    return root / "log", ks


def _sweep(log: Path, ks: KeySet, flips: list[tuple[Path, int, int]]) -> list[str]:
    key = ks.verify_key()
    originals = {path: path.read_bytes() for _, path in list_segments(log)}
    slipped = []
    for path, pos, bit in flips:
        data = bytearray(originals[path])
        data[pos] ^= 1 << bit
        path.write_bytes(bytes(data))
        report = verify_log(log, key, writer_live=False)
        if report.exit_status == 0:
            slipped.append(f"{path.name} byte {pos} bit {bit}: {report.summary()}")
        path.write_bytes(originals[path])
    return slipped


def test_the_unflipped_log_is_intact(closed_log: tuple[Path, KeySet]) -> None:
    log, ks = closed_log
    report = verify_log(log, ks.verify_key())
    assert report.verdict == "intact"
    assert report.checkpoints >= 10
    assert report.format == 2 or report.epoch >= 3  # with epochs: several of them
    assert report.segments >= 4
    assert report.records >= 250


def test_random_bit_flips_never_verify(closed_log: tuple[Path, KeySet], tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(closed_log[0], log)
    segments = [path for _, path in list_segments(log)]
    sizes = [path.stat().st_size for path in segments]
    rng = random.Random(SEED)
    places = [
        (path, pos) for path, size in zip(segments, sizes, strict=True) for pos in range(size)
    ]
    flips = [(*rng.choice(places), rng.randrange(8)) for _ in range(RANDOM_FLIPS)]
    assert _sweep(log, closed_log[1], flips) == []


def test_every_bit_of_the_final_record(closed_log: tuple[Path, KeySet], tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(closed_log[0], log)
    last = list_segments(log)[-1][1]
    data = last.read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    flips = [(last, pos, bit) for pos in range(start, len(data)) for bit in range(8)]
    assert len(flips) > 1500
    assert _sweep(log, closed_log[1], flips) == []
