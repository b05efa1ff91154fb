"""Retention under churn (issue 38): memory, snapshot size and restart time against the number
of operations that ever ended, the live count held fixed.

``python -m tests.bench --only retention [--ended 1000,10000,100000,200000]``

Each row is one churn run in a fresh process (so its resident memory is its own): ``LIVE``
operations stay live throughout; operations are registered at ``RATE`` per simulated second,
each polled once by the real model (``register``, ``decide`` on a wake-up, the provider's
answer, ``decide`` on it: succeeded) and so ended; every ``CHECK`` simulated seconds the
daemon's retention pass runs (:func:`replay.retention.due` under ``[retention]``, the
retirements folded as the chain folds them). The daemon's memory of stories follows every
event (:class:`daemon.history.Histories`, as the API keeps them). Halfway, a restart: the
ledger is sealed into a real snapshot file (:func:`daemon.snapshots.save_snapshot`, real keys)
and loaded back (:func:`daemon.snapshots.load_snapshot`), and the run goes on from it with
fresh stories, as ``bide run`` does. This drives the pure model and the snapshot code
directly: the full daemon is too slow to end 200,000 operations in a bench run
(``tests/api/test_retention.py`` and ``soak`` below run the real daemon).

Reported per row: the process's resident memory (after a collection and ``malloc_trim``),
the memory the ledger and the stories hold (``tracemalloc``, traced from before the run),
the sealed snapshot's size, and the time to load it (the restart's snapshot stage; the log
after it is the same few events in every row), at the end of the run. ``retention=off``
rows (``ended_after`` and ``max_ended`` out of reach) show what each ended operation cost
before.

The goal: resident memory at 100,000 ended operations within 1.2x of that at 1,000, the
live count the same.
"""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from daemon.history import Histories
from daemon.snapshots import SnapshotKeys, load_snapshot, release_freed_heap, save_snapshot
from eventlog import keys
from eventlog.position import LogPosition
from replay.decide import decide, register
from replay.events import (
    LogEvent,
    OperationRetired,
    ResponseHeaders,
    StatusRequestIntended,
    StatusResponseReceived,
    encode_event,
)
from replay.ledger import Ledger
from replay.observations import Registration, WakeUp
from replay.retention import ENDED_PHASES, RetentionPolicy, due
from tests.bench.bench_replay import bench_contract

LIVE = 65
RATE = 40.0  # registrations per simulated second (the churn test)
CHECK = 5.0  # simulated seconds between retention passes
ON = RetentionPolicy(ended_after=10.0, max_ended=10_000, max_tombstones=100_000)
OFF = RetentionPolicy(ended_after=1e12, max_ended=10**12, max_tombstones=100_000)
T0 = 1_800_000_000.0


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _trim() -> None:
    gc.collect()
    release_freed_heap()


def _operation(n: int, at: float, live: bool) -> list[LogEvent]:
    """A registration and, unless ``live``, one poll answered ``succeeded``: as decided."""
    reg = Registration(
        operation_id=f"op-{n:07d}",
        provider="sim",
        provider_job_id=f"job-{n:07d}",
        deadline_at=at + 86400.0,
        first_poll_after_seconds=0.0,
    )
    events: list[LogEvent] = list(register(reg, bench_contract(), at))
    if live:
        return events
    ledger = Ledger()
    for ev in events:
        ledger.apply(ev)
    op = ledger.ops[reg.operation_id]
    [intent] = decide(op, WakeUp(), at, 0.5)
    assert isinstance(intent, StatusRequestIntended)
    op = ledger.apply(intent) or op
    fact = StatusResponseReceived(
        operation_id=op.operation_id,
        at=at + 0.02,
        request_number=intent.request_number,
        status_code=200,
        headers=ResponseHeaders(request_id=f"req-{n}", content_type="application/json"),
        body=b'{"id": "job-%07d", "status": "succeeded"}' % n,
    )
    op = ledger.apply(fact) or op
    decided = decide(op, fact, at + 0.02, 0.5)
    return [*events, intent, fact, *decided]


class _Daemon:
    """The model's memory as the daemon holds it: the ledger and the stories."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.stories = Histories()

    def record(self, events: list[LogEvent]) -> None:
        for ev in events:
            op = self.ledger.apply(ev)
            if isinstance(ev, OperationRetired):
                self.stories.forget(ev.operation_id)
            else:
                self.stories.add(ev.operation_id, encode_event(ev), op.phase if op else None)


def churn(ended: int, retention: bool, work: Path, traced: bool = False) -> dict[str, object]:
    """One run (see the module docstring); in this process. ``traced``: also what the model
    holds, by ``tracemalloc`` (which doubles the run's time and adds to its memory)."""
    policy = ON if retention else OFF
    key_dir = work / "keys"
    keys.generate(key_dir)
    keyring, signer = keys.load_keyring(key_dir), keys.load_signer(key_dir)
    snapshot_path = work / "snapshot"
    _trim()
    rss_start = _rss_kib()
    if traced:
        tracemalloc.start()
    daemon = _Daemon(Ledger())
    at = T0
    for n in range(LIVE):
        daemon.record(_operation(n, at, live=True))
    next_check = at + CHECK
    restart: dict[str, float] = {}
    seq = 0
    for n in range(LIVE, LIVE + ended):
        at += 1.0 / RATE
        daemon.record(_operation(n, at, live=False))
        if at >= next_check:
            next_check = at + CHECK
            ledger = daemon.ledger
            while retire := due(ledger.ended, ledger.ops, ledger.actions, at, policy):
                daemon.record(list(retire))
        if n == LIVE + ended // 2:
            seq = daemon.ledger.events
            restart = _restart(daemon, snapshot_path, keyring, signer, seq)
    ledger = daemon.ledger
    while retire := due(ledger.ended, ledger.ops, ledger.actions, at, policy):
        daemon.record(list(retire))
    _trim()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    _trim()
    rss_end = _rss_kib()
    end = _restart(daemon, snapshot_path, keyring, signer, daemon.ledger.events + 1)
    live = sum(1 for op in daemon.ledger.ops.values() if op.phase == "live")
    kept_ended = sum(1 for op in daemon.ledger.ops.values() if op.phase in ENDED_PHASES)
    return {
        "ended": ended,
        "retention": retention,
        "live": live,
        "ended_kept": kept_ended,
        "tombstones": len(daemon.ledger.tombstones),
        "rss_mib": round(rss_end / 1024, 1),
        "rss_growth_mib": round((rss_end - rss_start) / 1024, 1),
        "traced_mib": round(held / 2**20, 2) if traced else None,
        "snapshot_kib": round(end["snapshot_bytes"] / 1024, 1),
        "restart_ms": round(end["load_s"] * 1000, 1),
        "midway_snapshot_kib": round(restart.get("snapshot_bytes", 0) / 1024, 1),
        "midway_restart_ms": round(restart.get("load_s", 0) * 1000, 1),
    }


def _restart(
    daemon: _Daemon, path: Path, keyring: keys.KeyRing, signer: keys.Signer, seq: int
) -> dict[str, float]:
    """Seal the ledger into a snapshot file, time loading it in a fresh process (as a
    restarted daemon does, best of 3), load it back here and go on from the loaded one (and
    fresh stories: a restarted daemon loads earlier stories only when asked)."""
    position = LogPosition(
        log_id="bench",
        seq=seq,
        hash="0" * 64,
        segment=0,
        line_start=0,
        end=0,
        last_cp_seq=None,
        last_cp_hash="0" * 64,
        checkpoint_every=1000,
        unsigned_run=0,
    )
    size = save_snapshot(path, keyring, signer.mac_key, position, daemon.ledger)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_retention", "--load", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    load_s = float(proc.stdout.strip().splitlines()[-1])
    loaded = load_snapshot(path, keyring, SnapshotKeys(root=signer))
    assert loaded is not None
    assert loaded.ledger.ops == daemon.ledger.ops
    assert loaded.ledger.tombstones == daemon.ledger.tombstones
    daemon.ledger = loaded.ledger
    daemon.stories = Histories()
    return {"snapshot_bytes": float(size), "load_s": load_s}


def run(out: Path, ended: list[int], off: list[int], traced: bool = False) -> dict[str, object]:
    """Every row in its own process: ``ended`` with retention, ``off`` without."""
    rows = []
    for n, retention in [*((n, True) for n in ended), *((n, False) for n in off)]:
        with tempfile.TemporaryDirectory(prefix="retention-", dir=out) as work:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.bench.bench_retention",
                    str(n),
                    str(retention),
                    work,
                    str(traced),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    by = {(r["ended"], r["retention"]): r for r in rows}
    ratios: dict[str, float] = {}
    if (1000, True) in by and (100_000, True) in by:
        ratios["rss_100k_vs_1k"] = round(
            by[(100_000, True)]["rss_mib"] / by[(1000, True)]["rss_mib"], 3
        )
    return {"rows": rows, "ratios": ratios}


def print_table(result: dict[str, object]) -> None:
    rows = result["rows"]
    assert isinstance(rows, list)
    print(f"retention under churn ({LIVE} live, {RATE:.0f}/s, ended_after {ON.ended_after:g} s):")
    head = ("ended", "retention", "kept", "tombs", "RSS MiB", "traced MiB", "snap KiB", "load ms")
    print("  " + "".join(f"{h:>12}" for h in head))
    for r in rows:
        cells = (
            r["ended"],
            "on" if r["retention"] else "off",
            r["ended_kept"],
            r["tombstones"],
            r["rss_mib"],
            r["traced_mib"],
            r["snapshot_kib"],
            r["restart_ms"],
        )
        print("  " + "".join(f"{c!s:>12}" for c in cells))
    print(f"  ratios: {result['ratios']}")


def _time_load(path: Path) -> float:
    """The best of 3 loads of the snapshot at ``path`` (keys beside it), in this process."""
    key_dir = path.parent / "keys"
    keyring, signer = keys.load_keyring(key_dir), keys.load_signer(key_dir)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        loaded = load_snapshot(path, keyring, SnapshotKeys(root=signer))
        best = min(best, time.perf_counter() - started)
        assert loaded is not None
        del loaded
    return best


if __name__ == "__main__" and sys.argv[1] == "--load":
    print(_time_load(Path(sys.argv[2])))
elif __name__ == "__main__":
    count, flag, where = int(sys.argv[1]), sys.argv[2] == "True", Path(sys.argv[3])
    import daemon.supervisor  # noqa: F401  (the daemon's code resident, as in `bide run`)

    print(json.dumps(churn(count, flag, where, traced=sys.argv[4:] == ["True"])))


# -- the real daemon ----------------------------------------------------------------------------

SOAK_CONTRACT = (
    'state_pointer = "/status"\nbackoff_base_seconds = 0.2\nbackoff_cap_seconds = 0.4\n'
    "default_max_status_requests = 100\n"
)


SOAK_QUOTA = "[quota]\nrequests_per_second = 500\nmax_in_flight = 16\n"


def soak(out: Path, seconds: float, rate: float, retention: bool) -> dict[str, object]:
    """``bide run`` against the simulator: ``rate`` registrations a second through the API for
    ``seconds``, each job answering ``running`` twice then ``succeeded``; with retention a
    one-second ``ended_after`` checked every 0.5 s. A clean restart halfway. The daemon's
    resident memory is sampled with the number of operations ended so far; the growth per
    ended operation is the slope over each half (after its first 500 operations, so the
    number retained has settled)."""
    from daemon.api.client import ApiClient
    from tests.e2e.harness import workspace

    total = int(seconds * rate)
    jobs: dict[str, str | list[object]] = {f"j{n}": "running x2, succeeded" for n in range(total)}
    table = "\n[retention]\nended_after = 1\ncheck_seconds = 0.5\n" if retention else ""
    api = "registrations_per_second = 1000\nregistrations_burst = 1000\n" + table
    samples: list[tuple[int, int, int]] = []  # (half, registered, RSS KiB)
    restarts: list[dict[str, float]] = []
    tmp = Path(tempfile.mkdtemp(prefix="soak-", dir=out))
    try:
        with workspace(tmp, jobs=jobs, api=api) as ws:
            ws.write_profile(contract=SOAK_CONTRACT, extra=SOAK_QUOTA)
            socket_path = ws.root / "state" / "api.sock"
            n = 0
            for half in (0, 1):
                daemon = ws.start_daemon()
                if half:
                    restarts.append(_replayed_line(daemon.output()))
                started = time.monotonic()
                with ApiClient(socket_path, timeout=30) as client:
                    while n < total * (half + 1) // 2:
                        due_at = started + (n - total * half // 2) / rate
                        time.sleep(max(0.0, due_at - time.monotonic()))
                        client.call(
                            "POST",
                            "/v1/operations",
                            body={"provider": "sim", "job_id": f"j{n}", "operation_id": f"op-{n}"},
                        )
                        n += 1
                        if n % 100 == 0:
                            samples.append((half, n, _daemon_rss(daemon.proc.pid)))
                assert daemon.stop() == 0
            snapshot = (ws.root / "state" / "snapshot").stat().st_size
            last = ws.start_daemon()
            restarts.append(_replayed_line(last.output()))
            assert last.stop() == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    slopes = []
    for half in (0, 1):
        pts = [(r, kib) for h, r, kib in samples if h == half and r - total * half // 2 > 500]
        if len(pts) >= 2:
            slopes.append((pts[-1][1] - pts[0][1]) * 1024 / max(1, pts[-1][0] - pts[0][0]))
    return {
        "retention": retention,
        "registered": total,
        "rss_mib": [round(kib / 1024, 1) for _, _, kib in samples[:: max(1, len(samples) // 8)]],
        "bytes_per_ended_op": [round(s) for s in slopes],
        "snapshot_kib": round(snapshot / 1024, 1),
        "restarts": restarts,
    }


def _daemon_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _replayed_line(output: str) -> dict[str, float]:
    m = re.search(r"msg=replayed events=(\d+) operations=(\d+) .*seconds=([\d.]+)", output)
    assert m, output
    return {"events": float(m[1]), "operations": float(m[2]), "seconds": float(m[3])}
