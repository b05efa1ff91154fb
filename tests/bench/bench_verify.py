"""``bide verify`` throughput vs ``sha256sum`` over the same segment files, as whole processes.

The log (1,000,000 event records of 256-byte payloads by default, a checkpoint every 1000) is
written once with the real LogWriter in large ``append_many`` batches and cached under
``bench-out/``. Both commands are timed by wall clock, best of 3, with the files in page cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from eventlog import keys
from eventlog.segments import list_segments
from eventlog.writer import LogWriter
from tests.bench import cache

PAYLOAD_BYTES = 256
BATCH = 10_000


async def _generate(log_dir: Path, key_dir: Path, records: int) -> None:
    payload = os.urandom(PAYLOAD_BYTES)
    async with LogWriter(
        log_dir, keys.load_keyring(key_dir), keys.load_signer(key_dir), checkpoint_every=1000
    ) as log:
        for start in range(0, records, BATCH):
            await log.append_many([payload] * min(BATCH, records - start))


def cached_log(work: Path, records: int) -> tuple[Path, Path]:
    """(log dir, verify.pub) of a closed log with ``records`` events, made once and kept."""
    root = cache.cached_log(work, "verify-log", records, _generate)
    return root / "log", root / "keys" / "verify.pub"


def _best_of(cmd: list[str], runs: int, ok: tuple[int, ...] = (0,)) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - started
        if proc.returncode not in ok:
            raise RuntimeError(f"{cmd[:3]}… exited {proc.returncode}: {proc.stderr.decode()}")
        best = min(best, elapsed)
    return best


def run(work: Path, records: int, runs: int = 3) -> dict[str, object]:
    log_dir, verify_pub = cached_log(work, records)
    files = [str(p) for _, p in list_segments(log_dir)]
    total_bytes = sum(os.path.getsize(f) for f in files)
    bide = str(Path(sys.executable).with_name("bide"))
    sha = _best_of(["sha256sum", *files], runs)
    results: dict[str, object] = {
        "records": records,
        "bytes": total_bytes,
        "segments": len(files),
        "sha256sum_seconds": round(sha, 3),
        "sha256sum_mb_per_s": round(total_bytes / sha / 1e6, 1),
    }
    for jobs in (1, os.cpu_count() or 1):
        cmd = [bide, "verify", str(log_dir), "--verify-key", str(verify_pub), "--jobs", str(jobs)]
        t = _best_of(cmd, runs)
        results[f"verify_jobs{jobs}"] = {
            "command": " ".join(
                ["bide", "verify", "LOG", "--verify-key", "verify.pub", "--jobs", str(jobs)]
            ),
            "seconds": round(t, 3),
            "records_per_s": round(records / t),
            "mb_per_s": round(total_bytes / t / 1e6, 1),
            "ratio_vs_sha256sum": round(sha / t, 2),
        }
    return results
