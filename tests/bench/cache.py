"""Benchmark logs are slow to make: each is generated once under ``bench-out`` and kept."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from eventlog import keys

Generate = Callable[[Path, Path, int], Awaitable[None]]


def cached_log(work: Path, name: str, records: int, generate: Generate) -> Path:
    """The root of a closed log (``root/log``, keys in ``root/keys``), made once and kept."""
    root = work / f"{name}-{records}"
    done = root / "complete"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        keys.generate(root / "keys")
        started = time.perf_counter()
        anyio.run(generate, root / "log", root / "keys", records)
        print(
            f"  generated a {records}-record {name} in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        done.write_text("ok\n")
    return root
