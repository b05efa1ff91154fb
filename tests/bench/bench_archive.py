"""``bide log archive`` and ``bide verify`` after it, as whole processes, on a real log.

The log (100,000 event records of 256-byte payloads by default, a checkpoint every 1000,
1 MB segments) is written once with the real LogWriter and cached under ``bench-out/``; each
run archives a copy of it up to its last checkpoint. Baselines measured in the same run:
``gzip -6`` over the same segment files (what compressing them costs at the least), and
``bide verify`` of the whole log before archiving (what verifying costs without archives),
and ``bide --version`` (what starting any bide process costs, which a small live log's verify
is mostly made of).
"""

from __future__ import annotations

import json
import os
import shutil
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
SEGMENT_BYTES = 1024 * 1024


async def _generate(log_dir: Path, key_dir: Path, records: int) -> None:
    async with LogWriter(
        log_dir,
        keys.load_keyring(key_dir),
        keys.load_signer(key_dir),
        checkpoint_every=1000,
        segment_bytes=SEGMENT_BYTES,
    ) as log:
        for start in range(0, records, BATCH):
            n = min(BATCH, records - start)
            await log.append_many([os.urandom(PAYLOAD_BYTES) for _ in range(n)])


def _timed(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode not in ok:
        raise RuntimeError(f"{cmd[:4]}… exited {proc.returncode}: {proc.stderr.decode()}")
    return elapsed, proc.stdout.decode()


def _size(log_dir: Path) -> int:
    return sum(p.stat().st_size for _, p in list_segments(log_dir))


def run(work: Path, records: int, runs: int = 3) -> dict[str, object]:
    root = cache.cached_log(work, "archive-log", records, _generate)
    pub = str(root / "keys" / "verify.pub")
    bide = str(Path(sys.executable).with_name("bide"))
    best: dict[str, float] = {}
    result: dict[str, object] = {}
    for i in range(runs):
        run_dir = work / f"archive-run-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(root / "log", run_dir / "log")
        log, dest = run_dir / "log", run_dir / "archive"
        files = [str(p) for _, p in list_segments(log)]
        before = _size(log)
        gz, _ = _timed(["sh", "-c", 'gzip -6 -c "$@" > /dev/null', "gzip", *files])
        start, _ = _timed([bide, "--version"])  # what any bide command costs to start
        full, _ = _timed([bide, "verify", str(log), "--verify-key", pub, "--jobs", "1"])
        head = json.loads(_timed([bide, "log", "head", str(log), "--json"])[1])["seq"]
        archive = [bide, "log", "archive", "--log-dir", str(log), "--verify-key", pub]
        archived, out = _timed([*archive, "--json", "--before", str(head), str(dest)])
        done = json.loads(out)
        live, _ = _timed([bide, "verify", str(log), "--verify-key", pub, "--jobs", "1"])
        both, _ = _timed(
            [bide, "verify", str(log), "--verify-key", pub, "--jobs", "1", "--archive", str(dest)]
        )
        for name, t in (
            ("process_start_seconds", start),
            ("gzip_seconds", gz),
            ("verify_before_seconds", full),
            ("archive_seconds", archived),
            ("verify_live_seconds", live),
            ("verify_archive_and_live_seconds", both),
        ):
            best[name] = min(best.get(name, float("inf")), t)
        result = {
            "records": records,
            "segments_before": len(files),
            "segments_archived": done["segments"][1] - done["segments"][0] + 1,
            "live_bytes_before": before,
            "live_bytes_after": _size(log),
            "archived_bytes": done["bytes"],
            "archive_bytes_on_disk": sum(p.stat().st_size for p in dest.iterdir()),
            "compression_ratio": round(done["bytes"] / done["compressed_bytes"], 2),
        }
        shutil.rmtree(run_dir, ignore_errors=True)
    result.update({k: round(v, 3) for k, v in best.items()})
    result["archive_vs_gzip"] = round(best["archive_seconds"] / best["gzip_seconds"], 2)
    result["verify_archive_and_live_vs_before"] = round(
        best["verify_archive_and_live_seconds"] / best["verify_before_seconds"], 2
    )
    result["verify_live_vs_before"] = round(
        best["verify_live_seconds"] / best["verify_before_seconds"], 2
    )
    return result


def print_table(r: dict[str, object]) -> None:
    print("archive (bide log archive, then bide verify; best of runs, seconds):")
    for k, v in r.items():
        print(f"  {k:36} {v}")
