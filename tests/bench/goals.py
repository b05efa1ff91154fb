"""Issue 17's table in one command: ``python -m tests.bench --only goals [--repeat 3]``.

Each repeat measures every row with its baseline in the same run:

    CPU per status request   the daemon at 10,000 live operations, saturated, against the bare
                             httpx loop making the same requests at the same rate; counted
                             per process and on the whole machine less the simulator (what
                             kernel workers do for a process, an AIO fdatasync, counts too)
    saturation               the daemon's requests/s against the bare loop's, unpaced, with the
                             same connections, against the same simulator
    httpx's client layer     CPU per request through ``AsyncClient`` (as the bare loop sends)
                             against its transport (as the daemon sends), alternating in one
                             process (``bench_http``): how much of the two ratios above is the
                             layer the daemon skips
    durable appends          1 and 1,000 appenders against SQLite (WAL, synchronous=FULL, one
                             transaction per record); and one appender's floor, the same run
                             (``bench_floor``): SQLite and a bare write+fdatasync behind the
                             thread hand-off a non-blocking daemon needs; and many appenders'
                             floor (``bench_many_floor``): a record's framing and the event
                             loop's wake-ups, no disk, on one GIL
    full replay              events/s folding the 1,000,000-event log with no snapshot, and a
                             start from a clean stop's snapshot (what the offline readers and a
                             restart do); and its floor, the same run: what the format's
                             unskippable C calls alone allow on one core and on every core,
                             with the fold, the in-order part any framing leaves in one
                             process, and 16 events per sealed record as a what-if

and the summary gives, per row, the best repeat and the spread (lowest to highest).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import bench_append, bench_http, bench_replay, bench_scale

OPERATIONS = 10_000
RATE = 2_000.0


def _one(
    out: Path, seconds: float, window: float, operations: int, replay_records: int
) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="goals-", dir=out))
    try:
        append = bench_append.run(work, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = {r["appenders"]: r for r in append["eventlog"]}  # type: ignore[attr-defined]
    floor = append["floor"]
    assert isinstance(floor, dict)
    scale = bench_scale.run_one(out, operations, window, RATE, 8, 0, bare_saturated=True)
    http = bench_http.run(max(2_000, operations * 2), rounds=1)
    replayed = bench_replay.run(out, replay_records, runs=1)
    replay, replay_floor = replayed["stages"], replayed["floor"]
    assert isinstance(replay, dict)
    assert isinstance(replay_floor, dict)
    ceiling = scale["bare_saturated"]
    assert isinstance(ceiling, dict)
    return {
        "cpu_us": float(scale["daemon_cpu_per_request_us"]),  # type: ignore[arg-type]
        "bare_cpu_us": float(scale["bare_loop"]["cpu_per_request_us"]),  # type: ignore[index]
        "cpu_ratio": float(scale["cpu_ratio_vs_bare"]),  # type: ignore[arg-type]
        # The same counted on the whole machine less the simulator: kernel workers included.
        "machine_us": float(scale["machine_cpu_per_request_us"]),  # type: ignore[arg-type]
        "bare_machine_us": float(scale["bare_machine_cpu_per_request_us"]),  # type: ignore[arg-type]
        "machine_ratio": float(scale["machine_cpu_ratio_vs_bare"]),  # type: ignore[arg-type]
        "req_s": float(scale["requests_per_s"]),  # type: ignore[arg-type]
        "bare_req_s": float(ceiling["requests_per_s"]),
        "saturation_ratio": float(scale["saturation_vs_bare"]),  # type: ignore[arg-type]
        "http_client_us": float(http["client"][0]["cpu_us_per_request"]),  # type: ignore[index]
        "http_transport_us": float(http["transport"][0]["cpu_us_per_request"]),  # type: ignore[index]
        "http_transport_ratio": float(http["transport_vs_client_cpu"]),  # type: ignore[arg-type]
        "append_1": float(rows[1]["records_per_s"]),
        "append_1000": float(rows[1000]["records_per_s"]),
        "sqlite": float(append["sqlite"]["records_per_s"]),  # type: ignore[index]
        "append_1_ratio": float(rows[1]["ratio_vs_sqlite"]),
        "append_1000_ratio": float(rows[1000]["ratio_vs_sqlite"]),
        # One appender's floor (bench_floor), each against SQLite direct in its own rounds.
        "floor_sqlite_handoff": float(floor["sqlite, behind a hand-off"]["ratio_vs_sqlite"]),
        "floor_growing_handoff": float(
            floor["write+fdatasync, growing, behind a hand-off"]["ratio_vs_sqlite"]
        ),
        "floor_prewritten_handoff": float(
            floor["write+fdatasync, pre-written, behind a hand-off"]["ratio_vs_sqlite"]
        ),
        "floor_growing_kernel": float(
            floor["write+fdatasync, growing, through the kernel"]["ratio_vs_sqlite"]
        ),
        "floor_prewritten_kernel": float(
            floor["write+fdatasync, pre-written, through the kernel"]["ratio_vs_sqlite"]
        ),
        # Many appenders' floor (bench_many_floor): a record's CPU on one GIL, no disk.
        "many_floor": float(append["many_floor"]["records_per_s"]),  # type: ignore[index]
        "many_floor_ratio": float(append["many_floor"]["ratio_vs_sqlite"]),  # type: ignore[index]
        "append_1_vs_sqlite_handoff": float(rows[1]["records_per_s"])
        / float(floor["sqlite, behind a hand-off"]["records_per_s"]),
        "replay_ev_s": float(replay["replay, 1 process (the daemon)"]["events_per_s"]),
        "replay_cores_ev_s": float(replay["replay, every core (offline readers)"]["events_per_s"]),
        # What the format's C calls alone allow, nothing else running (bench_replay.c_floor).
        "replay_floor_ev_s": float(replay_floor["cap_one_core"]),
        "replay_floor_cores_ev_s": float(replay_floor["cap_every_core"]),
        # ... with the fold, shared perfectly between the cores; the in-order part alone
        # (decode + fold, whatever the framing); and the what-if of several events per record.
        "replay_fold_cores_ev_s": float(replay_floor["cap_every_core_with_fold"]),
        "replay_in_order_ev_s": float(replay_floor["cap_in_order"]),
        "replay_grouped_cores_ev_s": float(replay_floor["cap_grouped_every_core"]),
        "start_ev_s": float(replay["start, no snapshot"]["events_per_s"]),
        "snapshot_ev_s": float(replay["start, snapshot at the head"]["events_per_s"]),
    }


def run(
    out: Path,
    repeat: int,
    seconds: float,
    window: float,
    operations: int = OPERATIONS,
    replay_records: int = 1_000_000,
) -> dict[str, Any]:
    runs = []
    for i in range(repeat):
        runs.append(_one(out, seconds, window, operations, replay_records))
        print(f"  goals run {i + 1}/{repeat}: {runs[-1]}", file=sys.stderr)
    return {"operations": operations, "rate": RATE, "runs": runs}


def fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def span(runs: list[dict[str, float]], key: str, best: Callable[..., float]) -> str:
    values = [r[key] for r in runs]
    spread = f" ({fmt(min(values))}-{fmt(max(values))})" if len(values) > 1 else ""
    return fmt(best(values)) + spread


def print_table(r: dict[str, Any]) -> None:
    runs = r["runs"]
    print(f"\nissue 17 goals, {len(runs)} run(s): best (spread); baselines from the same runs")
    rows = [
        (
            f"daemon CPU per request, us ({r['operations']} ops, saturated)",
            "cpu_us",
            min,
            "bare httpx",
            "bare_cpu_us",
            "cpu_ratio",
            "<= 1.5x",
        ),
        (
            "  the same, the whole machine less the simulator",
            "machine_us",
            min,
            "bare httpx",
            "bare_machine_us",
            "machine_ratio",
            "(kernel workers counted)",
        ),
        (
            "requests/s at saturation",
            "req_s",
            max,
            "bare, unpaced",
            "bare_req_s",
            "saturation_ratio",
            ">= 0.85x",
        ),
        (
            "  httpx transport (as the daemon sends), us/request",
            "http_transport_us",
            min,
            "AsyncClient",
            "http_client_us",
            "http_transport_ratio",
            "(bench_http)",
        ),
        (
            "durable appends/s, 1 appender",
            "append_1",
            max,
            "SQLite",
            "sqlite",
            "append_1_ratio",
            ">= 1.0x",
        ),
        (
            "  the same against SQLite behind the same thread hand-off",
            "append_1",
            max,
            "",
            "",
            "append_1_vs_sqlite_handoff",
            "(the design's own baseline)",
        ),
        (
            "  floor: SQLite behind a hand-off / SQLite",
            "",
            max,
            "",
            "",
            "floor_sqlite_handoff",
            "(bench_floor)",
        ),
        (
            "  floor: write+fdatasync behind a hand-off / SQLite",
            "",
            max,
            "",
            "",
            "floor_growing_handoff",
            "(growing file, no framing)",
        ),
        (
            "  the same on a pre-written file / SQLite",
            "",
            max,
            "",
            "",
            "floor_prewritten_handoff",
            "(as SQLite's WAL)",
        ),
        (
            "  floor: write + kernel fdatasync, no thread / SQLite",
            "",
            max,
            "",
            "",
            "floor_growing_kernel",
            "(growing file, eventlog.aio)",
        ),
        (
            "  the same on a pre-written file / SQLite",
            "",
            max,
            "",
            "",
            "floor_prewritten_kernel",
            "(as SQLite's WAL)",
        ),
        (
            "durable appends/s, 1000 appenders",
            "append_1000",
            max,
            "SQLite",
            "sqlite",
            "append_1000_ratio",
            ">= 10x",
        ),
        (
            "  floor: framing + the loop's wake-ups, one GIL, no disk",
            "many_floor",
            max,
            "SQLite",
            "sqlite",
            "many_floor_ratio",
            "(bench_many_floor)",
        ),
        ("full replay, no snapshot, events/s", "replay_ev_s", max, "", "", "", ">= 300,000"),
        (
            "full replay, every core (offline readers), events/s",
            "replay_cores_ev_s",
            max,
            "",
            "",
            "",
            ">= 300,000",
        ),
        (
            "  floor: the format's C calls alone, one core, events/s",
            "replay_floor_ev_s",
            max,
            "",
            "",
            "",
            "(bench_replay.c_floor)",
        ),
        (
            "  the same on every core, events/s",
            "replay_floor_cores_ev_s",
            max,
            "",
            "",
            "",
            "(no fold, no hand-off)",
        ),
        (
            "  + the fold, every core, shared perfectly, events/s",
            "replay_fold_cores_ev_s",
            max,
            "",
            "",
            "",
            "(this format's ceiling)",
        ),
        (
            "  decode + fold, in order, one process, events/s",
            "replay_in_order_ev_s",
            max,
            "",
            "",
            "",
            "(any framing)",
        ),
        (
            f"  what-if: {bench_replay.GROUP} events per sealed record, every core",
            "replay_grouped_cores_ev_s",
            max,
            "",
            "",
            "",
            "(bench_replay.grouped_framing)",
        ),
        ("start with no snapshot, events/s", "start_ev_s", max, "", "", "", ""),
        ("start from the snapshot, events/s", "snapshot_ev_s", max, "", "", "", ""),
    ]
    print(f"  {'what':<52}{'measured':>26}  {'baseline':<34}{'ratio':>22}  goal")
    for label, key, best, base_label, base_key, ratio_key, goal in rows:
        base = f"{base_label} {span(runs, base_key, max)}" if base_key else ""
        lower_is_better = key in ("cpu_us", "machine_us", "http_transport_us")
        ratio = span(runs, ratio_key, min if lower_is_better else max) if ratio_key else ""
        measured = span(runs, key, best) if key else ""
        print(f"  {label:<52}{measured:>26}  {base:<34}{ratio:>22}  {goal}")
