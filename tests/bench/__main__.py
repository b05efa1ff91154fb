"""``python -m tests.bench [--quick]
[--only append|verify|replay|scale|api|http|goals|pg|pg-cpu|retention|archive|shards]
[--seconds S]
[--records N] [--replay-records N] [--scale 1000,10000,100000] [--rate 2000,100]
[--window S] [--concurrency C] [--repeat N] [--dsn DSN] [--ended 1000,100000] [--traced]``.

Prints a table and writes ``bench-out/results.json``. Nothing here is a pass/fail test.
The full scale run (100,000 operations) takes several minutes; ``--quick`` runs 1,000.
``--only pg`` and ``--only pg-cpu`` need a PostgreSQL server (``--dsn``) and are not part of
the default run: ``pg-cpu`` is the daemon's CPU per status request with the log in PostgreSQL
against the file store and the bare httpx loop, ``--repeat`` times (``tests.bench.bench_pg_cpu``).
``--only retention`` is issue 38's churn: memory, snapshot and restart against the operations
that ever ended, the live count fixed (``--ended``; ``tests.bench.bench_retention``).
``--only shards`` is issue 39's: 1, 2 and 3 ``bide run`` nodes on a 16-shard log in a private
PostgreSQL cluster (initdb), registrations through a non-holder, shard move times
(``tests.bench.bench_shards``); not part of the default run.
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
from typing import Any

from tests.bench import (
    bench_api,
    bench_append,
    bench_archive,
    bench_epochs,
    bench_http,
    bench_replay,
    bench_retention,
    bench_scale,
    bench_verify,
    goals,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run in seconds: 0.5 s per append setting, a 50k-record log",
    )
    p.add_argument(
        "--only",
        choices=[
            "append",
            "verify",
            "replay",
            "scale",
            "api",
            "epochs",
            "http",
            "goals",
            "pg",
            "pg-cpu",
            "retention",
            "archive",
            "shards",
        ],
        help="one benchmark; 'goals' is issue 17's table (10,000 operations "
        "saturated, appends, the 1M-event replay), not part of the default run",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of --only goals and --only pg-cpu, for best and spread (default %(default)s)",
    )
    p.add_argument("--seconds", type=float, help="time per append setting (default 3)")
    p.add_argument("--records", type=int, help="records in the verify log (default 1000000)")
    p.add_argument(
        "--replay-records",
        type=int,
        help="events in the replay log (default 1000000; --quick 100000)",
    )
    p.add_argument(
        "--scale",
        help="live operations per scale run, comma-separated "
        "(default 1000,10000,100000; --quick 1000)",
    )
    p.add_argument(
        "--rate",
        default="2000",
        help="target status requests/s, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--window", type=float, help="measured seconds per scale run (default 20; --quick 5)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="the profile's max_in_flight, and the bare loop's (default 8)",
    )
    p.add_argument(
        "--ended",
        help="--only retention: ended operations per run, comma-separated "
        "(default 1000,10000,100000,200000; --quick 1000,10000)",
    )
    p.add_argument(
        "--traced",
        action="store_true",
        help="--only retention: also trace what the model holds (tracemalloc; twice as slow)",
    )
    p.add_argument(
        "--soak",
        type=float,
        default=0.0,
        help="--only retention: also run the real daemon this many seconds at 20 "
        "registrations/s, with retention and without (default: not run)",
    )
    p.add_argument("--keep", action="store_true", help="keep each scale run's directory")
    p.add_argument(
        "--dsn",
        help="--only pg and pg-cpu: the PostgreSQL server (default: "
        "$BIDE_TEST_POSTGRES_DSN, else the local one); a schema is made and dropped",
    )
    p.add_argument(
        "--takeovers",
        type=int,
        default=10,
        help="--only pg: SIGKILLs and link cuts timed (default %(default)s)",
    )
    p.add_argument(
        "--out", default="bench-out", help="results and cached logs (default: %(default)s)"
    )
    args = p.parse_args(argv)
    seconds = args.seconds or (0.5 if args.quick else 3.0)
    records = args.records or (50_000 if args.quick else 1_000_000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {
        "command": " ".join(
            ["python -m tests.bench", *(argv if argv is not None else sys.argv[1:])]
        ),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if args.only in (None, "epochs"):
        work = Path(tempfile.mkdtemp(prefix="epochs-", dir=out))
        try:
            epochs = bench_epochs.run(work, 50 if args.quick else 200)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results["epochs"] = epochs
        print("checkpoint cost (ms) and ratios to a single-key checkpoint:")
        for k, v in epochs.items():
            print(f"  {k:24} {v:10.3f}")
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
    if args.only in (None, "replay"):
        replay_records = args.replay_records or (100_000 if args.quick else 1_000_000)
        replayed = bench_replay.run(out, replay_records, runs=1 if args.quick else 3)
        results["replay"] = replayed
        _print_replay(replayed)
    if args.only in (None, "scale"):
        scales = [
            int(x)
            for x in (args.scale or ("1000" if args.quick else "1000,10000,100000")).split(",")
        ]
        rates = [float(x) for x in args.rate.split(",")]
        window = args.window or (5.0 if args.quick else 20.0)
        scale = bench_scale.run(out, scales, window, rates, args.concurrency, args.keep)
        results["scale"] = scale
        _print_scale(scale)
    if args.only in (None, "http"):
        http = bench_http.run(2_000 if args.quick else 20_000)
        results["http"] = http
        bench_http.print_table(http)
    if args.only == "goals":
        table = goals.run(
            out,
            args.repeat,
            seconds,
            args.window or 12.0,
            operations=1_000 if args.quick else goals.OPERATIONS,
            replay_records=args.replay_records or (100_000 if args.quick else 1_000_000),
        )
        results["goals"] = table
        goals.print_table(table)
    if args.only == "archive":
        archived = bench_archive.run(out, args.records or 100_000, runs=1 if args.quick else 3)
        results["archive"] = archived
        bench_archive.print_table(archived)
    if args.only == "pg":  # needs a PostgreSQL server: not part of the default run
        from tests.bench import bench_pg

        work = Path(tempfile.mkdtemp(prefix="pg-", dir=out))
        try:
            pg = bench_pg.run(work, seconds, args.dsn, 3 if args.quick else args.takeovers)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results["pg"] = pg
        bench_pg.print_table(pg)
    if args.only == "pg-cpu":  # needs a PostgreSQL server: not part of the default run
        from tests.bench import bench_pg_cpu

        table = bench_pg_cpu.run(
            out,
            args.repeat,
            args.window or 12.0,
            args.dsn,
            operations=1_000 if args.quick else bench_pg_cpu.OPERATIONS,
        )
        results["pg_cpu"] = table
        bench_pg_cpu.print_table(table)
    if args.only == "shards":  # a private PostgreSQL cluster (initdb): not in the default run
        from tests.bench import bench_shards

        shards = bench_shards.run(out, args.quick, args.window)
        results["shards"] = shards
        bench_shards.print_table(shards)
    if args.only == "retention":
        default = "1000,10000" if args.quick else "1000,10000,100000,200000"
        ended = [int(x) for x in (args.ended or default).split(",")]
        off = [n for n in ended if n <= 10_000]
        retention = bench_retention.run(out, ended, off, traced=args.traced)
        if args.soak:
            soaks = [
                bench_retention.soak(out, args.soak, 20.0, retention=on) for on in (True, False)
            ]
            retention["soak"] = soaks
            for row in soaks:
                print(f"  soak: {row}")
        results["retention"] = retention
        bench_retention.print_table(retention)
    if args.only in (None, "api"):
        api = bench_api.run(out, args.quick, args.keep)
        results["api"] = api
        _print_api(api)
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
    many = r["many_floor"]
    assert isinstance(many, dict)
    print(
        f"  many appenders' floor, same run (tests/bench/bench_many_floor.py): framing "
        f"{many['framing_us']} us + the loop's wake-ups {many['wakeup_us']} us per record, one "
        f"GIL: at most {many['records_per_s']} records/s, {many['ratio_vs_sqlite']:.2f}x"
    )
    floor = r["floor"]
    assert isinstance(floor, dict)
    print("  one appender's floor, same run (tests/bench/bench_floor.py):")
    for label, row in floor.items():
        print(
            f"    {label:<46}{row['records_per_s']:>8}{row['ratio_vs_sqlite']:>7.2f}x"
            f"{row['us_per_record']:>9} us"
        )


def _print_verify(r: dict[str, object]) -> None:
    print(
        f"\nverify {r['records']} records, {r['segments']} segments, "
        f"{int(r['bytes']) / 1e6:.0f} MB (wall time, best of 3)"  # type: ignore[call-overload]
    )
    print(f"  {'command':<28}{'seconds':>9}{'records/s':>12}{'MB/s':>8}{'vs sha256sum':>14}")
    print(
        f"  {'sha256sum':<28}{r['sha256sum_seconds']:>9}{'':>12}"
        f"{r['sha256sum_mb_per_s']:>8}{1.0:>13.2f}x"
    )
    for key, value in r.items():
        if key.startswith("verify_jobs") and isinstance(value, dict):
            label = f"bide verify --jobs {key.removeprefix('verify_jobs')}"
            print(
                f"  {label:<28}{value['seconds']:>9}{value['records_per_s']:>12}"
                f"{value['mb_per_s']:>8}{value['ratio_vs_sha256sum']:>13.2f}x"
            )


def _print_replay(r: dict[str, Any]) -> None:
    print(
        f"\nreplay {r['events']} events, {r['operations']} operations ({r['live']} live), "
        f"{r['log_bytes'] / 1e6:.0f} MB (snapshot {r['snapshot_bytes'] / 1e6:.0f} MB); "
        f"goal {r['goal_events_per_s']} events/s"
    )
    print(f"  {'stage':<40}{'seconds':>9}{'events/s':>11}")
    for name, row in r["stages"].items():
        print(f"  {name:<40}{row['seconds']:>9}{row['events_per_s']:>11}")
    floor = r["floor"]
    print(f"  floor: each call a replay cannot skip, alone, looped in C ({floor['events']} events)")
    for name, us in floor["us_per_event"].items():
        print(f"    {name:<40}{us:>8.3f} us/event")
    print(
        f"    {'sum':<40}{floor['total_us']:>8.3f} us/event: at most {floor['cap_one_core']} "
        f"events/s on one core, {floor['cap_every_core']} on {floor['cores']} cores"
    )
    print(
        f"    {'+ the fold (Ledger.apply), Python':<40}{floor['fold_us']:>8.3f} us/event: this "
        f"format with its fold, shared perfectly, at most {floor['cap_every_core_with_fold']} "
        f"events/s on {floor['cores']} cores"
    )
    print(
        f"    {'in order in one process, any framing':<40}{floor['in_order_us']:>8.3f} us/event "
        f"(decode each event + fold it): at most {floor['cap_in_order']} events/s"
    )
    print(
        f"    {'what-if: ' + str(floor['group']) + ' events per sealed record':<40}"
        f"{floor['grouped_framing_us']:>8.3f} us/event to read, chain and open, then the "
        f"same decode + fold: at most {floor['cap_grouped_every_core']} on {floor['cores']} "
        "cores"
    )


def _print_scale(r: dict[str, Any]) -> None:
    print(f"\nlive operations in one daemon (goals: {r['goals']})")
    print(
        f"  {'ops':>7}{'target/s':>9}{'req/s':>8}{'ready s':>8}{'again s':>8}{'KiB/op':>8}"
        f"{'late p50':>10}{'p99 ms':>9}{'cpu us/req':>11}{'bare us':>9}{'ratio':>7}"
        f"{'daemon cpu':>11}{'sim cpu':>8}"
    )
    for row in r["rows"]:
        late = row["lateness"]
        print(
            f"  {row['operations']:>7}{row['target_rate']:>9g}{row['requests_per_s']:>8}"
            f"{row['ready_s']:>8}{row['restart']['ready_s']:>8}{row['rss_per_op_end_kib']:>8}"
            f"{late.get('p50_ms', '-'):>10}{late.get('p99_ms', '-'):>9}"
            f"{row['daemon_cpu_per_request_us']:>11}"
            f"{row['bare_loop']['cpu_per_request_us']:>9}{row['cpu_ratio_vs_bare']:>7}"
            f"{row['daemon_cpu_share']:>11}{row['simulator_cpu_share']:>8}"
        )


def _print_api(r: dict[str, Any]) -> None:
    w, s = r["waiters"], r["status"]
    print(
        f"\nlocal API: {w['waiters']} ?wait= clients on {w['operations']} live operations "
        f"(goals: {r['goals']})"
    )
    print(f"  {'figure':<44}{'value':>12}  baseline")
    print(f"  {'registrations/s (POST, 32 in flight)':<44}{w['registrations_per_s']:>12}")
    print(f"  {'RSS per live operation, KiB':<44}{w['rss_per_op_kib']:>12}")
    print(
        f"  {'RSS growth per status request, KiB':<44}"
        f"{w['rss_growth_per_status_request_kib']:>12}  (no waiters attached)"
    )
    print(
        f"  {'RSS per waiter, KiB':<44}{w['rss_per_waiter_kib']:>12}"
        f"  RSS {w['rss_before_mib']} -> {w['rss_with_mib']} MiB; less the drift without "
        f"waiters ({w['rss_drift_without_waiters_kib_per_s']} KiB/s): "
        f"{w['rss_per_waiter_less_drift_kib']}"
    )
    d = w["answer_delay"]
    print(
        f"  {'answer delay p50 / p99 / max, ms':<44}"
        f"{str(d.get('p50_ms')) + ' / ' + str(d.get('p99_ms')) + ' / ' + str(d.get('max_ms')):>12}"
        f"  goal p99 < 50 ms, n={d['n']}"
    )
    a, b = w["no_waiters"], w["with_waiters"]
    print(
        f"  {'daemon CPU/status request, us (with)':<44}{b['daemon_cpu_per_request_us']:>12}"
        f"  without: {a['daemon_cpu_per_request_us']} (ratio {w['cpu_per_request_ratio']}); "
        f"req/s {a['requests_per_s']} / {b['requests_per_s']}; "
        f"daemon cpu {a['daemon_cpu_share']} / {b['daemon_cpu_share']}"
    )
    g = s["api_get"]
    print(f"\nlocal API: one status on a {s['records']}-event log ({s['operations']} operations)")
    print(
        f"  {'GET /v1/operations/{id} p50 / p99 / max, ms':<44}"
        f"{str(g['p50_ms']) + ' / ' + str(g['p99_ms']) + ' / ' + str(g['max_ms']):>12}"
        f"  goal p99 < 5 ms, n={g['n']}"
    )
    print(
        f"  {'full fold (load_log + lookup), ms':<44}{s['full_fold_best_ms']:>12}"
        f"  x{s['full_fold_best_ms'] / max(g['p50_ms'], 0.001):.0f} the API p50"
    )
    print(f"  {'daemon ready on that log, s':<44}{s['daemon_ready_s']:>12}")


if __name__ == "__main__":
    sys.exit(main())
