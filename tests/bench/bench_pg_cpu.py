"""CPU per status request with the log in PostgreSQL, against the file store and the bare httpx
loop in the same run (issue 18; goal: no worse than 1.2x the file store's):
``python -m tests.bench --only pg-cpu [--repeat 3] [--window S] [--dsn DSN]``.

Each repeat runs the scale benchmark's daemon (``bench_scale.run_one``: 10,000 live operations
against the simulator, saturated at a 2,000/s target) twice, in alternating order so drift on a
shared machine does not always favour the same store:

    files       the file store, as ``--only goals`` runs it
    postgresql  one ``bide run`` node on a fresh schema (``--dsn``, default
                ``$BIDE_TEST_POSTGRES_DSN``, else the local server), holding the lease
                (``bench_scale.PG_LEASE`` s, renewed every ``bench_scale.PG_RENEW`` s): every
                write round is the local fdatasync plus one transaction

Each daemon run has its own baseline: the bare loop (``tests.bench.bare_loop``) sending the
same number of requests at the daemon's achieved rate to the same simulator right after it;
the file run also times the bare loop unpaced (its saturation). Per run:

    CPU/request         daemon utime+stime / status requests sent in the window
    loop/request        the main thread's (the event loop's) CPU alone
    other/request       the rest: the log writer thread (encryption, fdatasync, the commit)
    database/request    the CPU of the PostgreSQL backends serving the node's connections
                        (not the daemon's; on this host they share its two cores)
    requests/s          what the daemon reached, and the bare loop unpaced
    ratios              PostgreSQL / files, each / its bare baseline, and the goal's ratio:
                        (PostgreSQL / its bare) / (files / its bare), <= 1.2

and the table gives, per row, the best repeat and the spread (lowest to highest).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import bench_scale
from tests.bench.bench_pg import fresh_schema
from tests.bench.goals import span
from tests.pgsupport import base_dsn

OPERATIONS = 10_000
RATE = 2_000.0
CONCURRENCY = 8
GOAL = 1.2


def _daemon(out: Path, window: float, operations: int, dsn: str | None) -> dict[str, Any]:
    """One saturated daemon run; the file store's also times the bare loop unpaced."""
    if dsn is None:
        return bench_scale.run_one(
            out, operations, window, RATE, CONCURRENCY, 0, bare_saturated=True
        )
    with fresh_schema(dsn) as scoped:
        return bench_scale.run_one(out, operations, window, RATE, CONCURRENCY, 0, dsn=scoped)


def _per_request(row: dict[str, Any], prefix: str) -> dict[str, float]:
    cpu = float(row["daemon_cpu_per_request_us"])
    loop = float(row["daemon_loop_thread_per_request_us"])
    return {
        f"{prefix}_cpu_us": cpu,
        f"{prefix}_loop_us": loop,
        f"{prefix}_other_us": round(cpu - loop, 1),
        f"{prefix}_bare_us": float(row["bare_loop"]["cpu_per_request_us"]),
        f"{prefix}_req_s": float(row["requests_per_s"]),
        f"{prefix}_flushes": float(row["log_flushes_per_request"]),
    }


def summary(files: dict[str, Any], pg: dict[str, Any]) -> dict[str, float]:
    """One repeat's figures and ratios from its two daemon runs."""
    r = {
        **_per_request(files, "files"),
        **_per_request(pg, "pg"),
        "pg_db_us": float(pg.get("db_backend_cpu_per_request_us", "nan")),
        "bare_req_s": float(files["bare_saturated"]["requests_per_s"]),
    }
    r["pg_with_db_us"] = round(r["pg_cpu_us"] + r["pg_db_us"], 1)

    def ratio(a: str, b: str) -> float:
        return round(r[a] / r[b], 2) if r[b] else float("nan")

    r |= {
        "pg_vs_files_cpu": ratio("pg_cpu_us", "files_cpu_us"),
        "pg_vs_files_loop": ratio("pg_loop_us", "files_loop_us"),
        "pg_vs_files_other": ratio("pg_other_us", "files_other_us"),
        "pg_vs_files_req_s": ratio("pg_req_s", "files_req_s"),
        "pg_with_db_vs_files": ratio("pg_with_db_us", "files_cpu_us"),
        "files_vs_bare": ratio("files_cpu_us", "files_bare_us"),
        "pg_vs_bare": ratio("pg_cpu_us", "pg_bare_us"),
        "files_req_vs_bare": ratio("files_req_s", "bare_req_s"),
        "pg_req_vs_bare": ratio("pg_req_s", "bare_req_s"),
    }
    r["goal_ratio"] = round(r["pg_vs_bare"] / r["files_vs_bare"], 2)
    return r


def run(
    out: Path, repeat: int, window: float, dsn: str | None = None, operations: int = OPERATIONS
) -> dict[str, Any]:
    dsn = dsn or base_dsn()
    runs, rows = [], []
    for i in range(repeat):
        order = [None, dsn] if i % 2 == 0 else [dsn, None]
        got = {
            ("files" if d is None else "postgresql"): _daemon(out, window, operations, d)
            for d in order
        }
        rows.append(got)
        runs.append(summary(got["files"], got["postgresql"]))
        print(f"  pg-cpu run {i + 1}/{repeat} ({' then '.join(got)}): {runs[-1]}", file=sys.stderr)
    return {
        "operations": operations,
        "rate": RATE,
        "concurrency": CONCURRENCY,
        "lease_seconds": bench_scale.PG_LEASE,
        "renew_seconds": bench_scale.PG_RENEW,
        "goal": GOAL,
        "runs": runs,
        "rows": rows,
    }


#: (label, key, which repeat is best) per printed row.
ROWS: tuple[tuple[str, str, Callable[..., float]], ...] = (
    ("daemon CPU/request, files, us", "files_cpu_us", min),
    ("daemon CPU/request, postgresql, us", "pg_cpu_us", min),
    ("bare httpx CPU/request, paced as files, us", "files_bare_us", min),
    ("bare httpx CPU/request, paced as postgresql, us", "pg_bare_us", min),
    ("loop thread CPU/request, files, us", "files_loop_us", min),
    ("loop thread CPU/request, postgresql, us", "pg_loop_us", min),
    ("other threads CPU/request, files, us", "files_other_us", min),
    ("other threads CPU/request, postgresql, us", "pg_other_us", min),
    ("database backends CPU/request, postgresql, us", "pg_db_us", min),
    ("daemon + database backends CPU/request, us", "pg_with_db_us", min),
    ("requests/s at saturation, files", "files_req_s", max),
    ("requests/s at saturation, postgresql", "pg_req_s", max),
    ("requests/s, bare httpx unpaced", "bare_req_s", max),
    ("log flushes/request, files", "files_flushes", min),
    ("log flushes/request, postgresql", "pg_flushes", min),
    ("postgresql / files, CPU/request", "pg_vs_files_cpu", min),
    ("postgresql / files, loop thread", "pg_vs_files_loop", min),
    ("postgresql / files, other threads", "pg_vs_files_other", min),
    ("postgresql / files, requests/s", "pg_vs_files_req_s", max),
    ("postgresql + its backends / files, CPU/request", "pg_with_db_vs_files", min),
    ("files / bare, CPU/request", "files_vs_bare", min),
    ("postgresql / bare, CPU/request", "pg_vs_bare", min),
    ("files / bare unpaced, requests/s", "files_req_vs_bare", max),
    ("postgresql / bare unpaced, requests/s", "pg_req_vs_bare", max),
    (f"goal: (postgresql/bare) / (files/bare) <= {GOAL}", "goal_ratio", min),
)


def print_table(r: dict[str, Any]) -> None:
    runs = r["runs"]
    print(
        f"\nCPU per status request, log in PostgreSQL vs files, {r['operations']} operations "
        f"saturated ({r['rate']:g}/s target), lease {r['lease_seconds']:g} s renewed every "
        f"{r['renew_seconds']:g} s; {len(runs)} run(s): best (spread), all from the same runs"
    )
    for label, key, best in ROWS:
        print(f"  {label:<56}{span(runs, key, best):>24}")
