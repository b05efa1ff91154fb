"""``python -m tests.bench [--quick] [--only append|verify] [--seconds S] [--records N]``.

Prints a table and writes ``bench-out/results.json``. Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from tests.bench import bench_append, bench_verify


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="smoke run in seconds: 0.5 s per append setting, a 50k-record log")
    p.add_argument("--only", choices=["append", "verify"])
    p.add_argument("--seconds", type=float, help="time per append setting (default 3)")
    p.add_argument("--records", type=int, help="records in the verify log (default 1000000)")
    p.add_argument("--out", default="bench-out",
                   help="results and cached logs (default: %(default)s)")
    args = p.parse_args(argv)
    seconds = args.seconds or (0.5 if args.quick else 3.0)
    records = args.records or (50_000 if args.quick else 1_000_000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {
        "command": " ".join(
            ["python -m tests.bench", *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(), "cpus": os.cpu_count(),
    }
    if args.only in (None, "append"):
        work = Path(tempfile.mkdtemp(prefix="append-", dir=out))
        try:
            append = bench_append.run(work, seconds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results["append"] = append
        _print_append(append)
    if args.only in (None, "verify"):
        verify = bench_verify.run(out, records)
        results["verify"] = verify
        _print_verify(verify)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out / 'results.json'}")
    return 0


def _print_append(r: dict[str, object]) -> None:
    sqlite = r["sqlite"]
    assert isinstance(sqlite, dict)
    print(f"\ndurable appends, {r['payload_bytes']}-byte payloads")
    print(f"  {'writer':<34}{'records/s':>12}{'vs sqlite':>11}")
    print(f"  {'sqlite WAL FULL, txn/record, seq.':<34}{sqlite['records_per_s']:>12}{1.0:>10.2f}x")
    rows = r["eventlog"]
    assert isinstance(rows, list)
    for row in rows:
        label = f"eventlog, {row['appenders']} appenders"
        print(f"  {label:<34}{row['records_per_s']:>12}{row['ratio_vs_sqlite']:>10.2f}x")


def _print_verify(r: dict[str, object]) -> None:
    print(f"\nverify {r['records']} records, {r['segments']} segments, "
          f"{int(r['bytes']) / 1e6:.0f} MB (wall time, best of 3)")  # type: ignore[call-overload]
    print(f"  {'command':<28}{'seconds':>9}{'records/s':>12}{'MB/s':>8}{'vs sha256sum':>14}")
    print(f"  {'sha256sum':<28}{r['sha256sum_seconds']:>9}{'':>12}"
          f"{r['sha256sum_mb_per_s']:>8}{1.0:>13.2f}x")
    for key, value in r.items():
        if key.startswith("verify_jobs") and isinstance(value, dict):
            label = f"bide verify --jobs {key.removeprefix('verify_jobs')}"
            print(f"  {label:<28}{value['seconds']:>9}{value['records_per_s']:>12}"
                  f"{value['mb_per_s']:>8}{value['ratio_vs_sha256sum']:>13.2f}x")


if __name__ == "__main__":
    sys.exit(main())
