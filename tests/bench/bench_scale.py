"""Many live operations in one daemon process against the simulator in its own process.

For each scale N the log is generated directly (N ``OperationRegistered`` events from the real
``register``, written with the real ``LogWriter``), so starting ``bide run`` on it also measures
a restart with N live operations. The simulator (``bide simulate``, its own process) answers
every status call ``running``. The profile's backoff is chosen so N operations poll at the
target rate in steady state (jitter in [50%, 100%] of the cap: mean delay 0.75 x cap), first
polls spread the same way, so there is no burst at start. Then, over a window:

    requests/s      status requests the daemon sent (its /metrics counter)
    RSS/op          (RSS - RSS of the same daemon with an empty log) / N, at ready and at the
                    end of the window (httpx pools and buffers included)
    lateness        intent time minus the scheduled ``next_poll_at``, from the log (what a
                    wake-up costs on top of its timer: heap, loop, decide), p50/p99/max
    CPU/request     daemon utime+stime (``/proc/PID/stat``) / requests sent
    baseline        a bare httpx loop (``tests.bench.bare_loop``, own process) sending the
                    same number of requests to the same simulator at the same rate, after the
                    daemon stopped: its CPU/request; the ratio is the cost of recording,
                    encrypting, deciding on top of the HTTP itself (goal <= 1.5x)

Two cores are shared by the daemon, the simulator, the baseline and anything else running:
the simulator's CPU is reported beside the daemon's so saturation is visible.

``run_one(..., dsn=DSN)`` runs the same daemon with the log in PostgreSQL: the log is
generated through the store (so the database and the node's local copy hold it), the lease is
handed over, and ``bide run`` starts as a node (``[postgres]``, a lease of :data:`PG_LEASE`
seconds renewed every :data:`PG_RENEW`) that takes it, and the CPU of the database backends
serving its connections (a server on this host) is reported beside the daemon's:
``tests.bench.bench_pg_cpu`` compares the two stores in one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from daemon.profile import load_profile
from eventlog import keys
from eventlog.reader import LogReader
from eventlog.store import LineStore
from eventlog.writer import LogWriter
from replay.decide import register
from replay.events import (
    OperationRegistered,
    PollScheduled,
    StatusRequestIntended,
    decode_log_event,
    encode_event,
)
from replay.observations import Registration
from tests.bench.bare_loop import machine_busy_seconds, process_cpu_seconds

TOKEN = "bench-token-5e1c"
#: The PostgreSQL node's lease and renewal period (seconds): long enough that the 5 s request
#: timeout always fits, so the gate never waits on a renewal.
PG_LEASE = 30.0
PG_RENEW = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
BIDE = [sys.executable, "-m", "daemon.cli"]


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    out: Path

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"no {pattern!r} within {timeout}s:\n{self.text()[-3000:]}")

    def cpu_seconds(self) -> float:
        return sum(self.cpu_split())

    def cpu_split(self, task: str = "") -> tuple[float, float]:
        """(user, system) CPU seconds so far: the process's, or one thread's (``task``)."""
        stat = Path(f"/proc/{self.proc.pid}{task}/stat")
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK

    def loop_cpu_seconds(self) -> float:
        """CPU of the main thread (the event loop), without the log's writer thread."""
        return sum(self.cpu_split(f"/task/{self.proc.pid}"))

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, timeout: float = 120.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _start(cmd: list[str], out: Path) -> Proc:
    with out.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    return Proc(proc, out)


def _job(i: int) -> str:
    return f"j-{i:07d}"


def _workspace(root: Path, n: int, cap: float, concurrency: int, dsn: str | None = None) -> None:
    keys.generate(root / "keys")
    (root / "creds").mkdir(mode=0o700)
    token = root / "creds" / "sim.token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    (root / "profiles").mkdir()
    script = ['[server]\nrequest_id_header = "X-Request-Id"\n']
    script += [f'[jobs.{_job(i)}]\nsteps = "running"\n' for i in range(max(n, 1))]
    (root / "sim.toml").write_text("\n".join(script))
    (root / "bide.toml").write_text(_config(dsn))
    (root / "cap").write_text(f"{cap}:{concurrency}")


def _config(dsn: str | None) -> str:
    """The daemon's config: the file store, or a PostgreSQL node (one signing key: epoch keys
    cannot follow a takeover)."""
    text = (
        '[paths]\nstate_dir = "state"\nkeys_dir = "keys"\nprofiles_dir = "profiles"\n'
        'credentials_dir = "creds"\n\n[log]\ncheckpoint_every = 1000\n'
    )
    if dsn is not None:
        text += (
            f"forward_secure = false\n\n[postgres]\ndsn = {json.dumps(dsn)}\n"
            f'lease_seconds = {PG_LEASE}\nrenew_seconds = {PG_RENEW}\nnode = "bench"\n'
        )
    return text + '\n[metrics]\nlisten = "127.0.0.1:0"\n'


def _profile(root: Path, base_url: str, cap: float, concurrency: int) -> Path:
    path = root / "profiles" / "sim.toml"
    path.write_text(
        f'[status]\nurl = "{base_url}/jobs/{{job_id}}"\ntimeout_seconds = 5\n'
        f'max_body_bytes = 65536\n\n[credential]\nfile = "sim.token"\n\n'
        f"[quota]\nrequests_per_second = 100000\nburst = 100000\nmax_in_flight = {concurrency}\n\n"
        f'[contract]\nstate_pointer = "/status"\njob_id_pointer = "/id"\n'
        f"backoff_base_seconds = {cap}\nbackoff_cap_seconds = {cap}\n"
        f"rate_limited_delay_seconds = {2 * cap + 1}\nmin_hint_seconds = 0.05\n"
        f"default_deadline_seconds = 86400\ndefault_max_status_requests = 1000000\n"
        f"limit_status_requests = 1000000\n\n"
        f'[contract.states]\npending = ["queued", "running"]\nsuccess = ["succeeded"]\n'
    )
    return path


async def _generate(
    root: Path, profile: Path, n: int, lead: float, cap: float, store: LineStore | None = None
) -> None:
    contract = load_profile(profile).contract
    rng = random.Random(n)
    now = time.time()
    batch: list[bytes] = []
    async with LogWriter(
        root / "state" / "log",
        keys.load_keyring(root / "keys"),
        keys.load_signer(root / "keys"),
        checkpoint_every=1000,
        store=store,
    ) as log:
        for i in range(n):
            reg = Registration(
                operation_id=f"op-{i:07d}",
                provider="sim",
                provider_job_id=_job(i),
                first_poll_after_seconds=lead + cap * rng.uniform(0.5, 1.0),
            )
            [registered] = register(reg, contract, now)
            assert isinstance(registered, OperationRegistered), registered
            batch.append(encode_event(registered))
            if len(batch) >= 10_000:
                await log.append_many(batch)
                batch = []
        if batch:
            await log.append_many(batch)


def _generate_into(
    root: Path, profile: Path, n: int, lead: float, cap: float, dsn: str | None
) -> None:
    """The log of ``n`` registrations: in the segment files, or (``dsn``) committed to
    PostgreSQL as well under a lease taken for it and handed over after, as a node would."""
    if dsn is None:
        anyio.run(_generate, root, profile, n, lead, cap)
        return
    from eventlog import pgstore

    settings = pgstore.PgSettings(dsn)
    with pgstore.connect(settings) as conn:
        epoch = pgstore.take_lease(conn, "bench-generate", 3600)
    assert epoch is not None, "the fresh schema's lease is held"
    store = pgstore.PgStore(settings, epoch)
    try:
        anyio.run(_generate, root, profile, n, lead, cap, store)
    finally:
        store.close()
    with pgstore.connect(settings) as conn:
        assert pgstore.release_lease(conn, "bench-generate", epoch)


def _metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _lateness(root: Path, start: float, end: float) -> dict[str, float | int]:
    """Intent time minus scheduled time for every intent in [start, end) (wall clock)."""
    due: dict[str, float] = {}
    late: list[float] = []
    reader = LogReader(root / "state" / "log", keys.load_keyring(root / "keys"))
    for _, payload in reader.payloads():
        ev = decode_log_event(payload)
        if isinstance(ev, OperationRegistered):
            due[ev.operation_id] = ev.first_poll_at
        elif isinstance(ev, PollScheduled):
            due[ev.operation_id] = ev.next_poll_at
        elif isinstance(ev, StatusRequestIntended) and start <= ev.at < end:
            late.append(ev.at - due[ev.operation_id])
    late.sort()
    if not late:
        return {"intents": 0}

    def q(p: float) -> float:
        return round(late[min(len(late) - 1, int(p * len(late)))] * 1000, 1)

    return {
        "intents": len(late),
        "p50_ms": q(0.50),
        "p99_ms": q(0.99),
        "max_ms": round(late[-1] * 1000, 1),
    }


def _empty_rss(work: Path) -> int:
    """RSS of a ready daemon with an empty log and the same profile (the baseline per op)."""
    root = Path(tempfile.mkdtemp(prefix="scale-0-", dir=work))
    try:
        _workspace(root, 0, 1.0, 8)
        _profile(root, "http://127.0.0.1:9", 1.0, 8)
        daemon = _start([*BIDE, "run", "--config", str(root / "bide.toml")], root / "daemon.log")
        try:
            daemon.wait_for(r"msg=ready", 60)
            time.sleep(1.0)
            return daemon.rss_kib()
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_one(
    work: Path,
    n: int,
    seconds: float,
    rate: float,
    concurrency: int,
    empty_rss: int,
    keep: bool = False,
    profile_to: Path | None = None,
    bare_saturated: bool = False,
    dsn: str | None = None,
) -> dict[str, object]:
    """One daemon at ``n`` operations; with ``bare_saturated`` also what the bare loop
    reaches unpaced (``concurrency`` in flight, as fast as it goes) against the same
    simulator: the ceiling the daemon's saturation is compared with. With ``dsn`` (a schema
    made by ``bide log init`` and otherwise empty) the log is in PostgreSQL."""
    root = Path(tempfile.mkdtemp(prefix=f"scale-{n}-", dir=work))
    cap = round(n / rate / 0.75, 3)
    _workspace(root, n, cap, concurrency, dsn)
    sim = _start(
        [
            *BIDE,
            "simulate",
            "--script",
            str(root / "sim.toml"),
            "--token-file",
            str(root / "creds" / "sim.token"),
        ],
        root / "sim.out",
    )
    daemon: Proc | None = None
    try:
        base = sim.wait_for(r"listening on (http://\S+)", 120).group(1)
        profile = _profile(root, base, cap, concurrency)
        lead = 5.0 + n / 10_000
        started = time.perf_counter()
        _generate_into(root, profile, n, lead, cap, dsn)
        generated = time.perf_counter() - started
        polls_from = time.time() + lead - generated

        popen = time.monotonic()
        prefix = (
            BIDE
            if profile_to is None
            else [sys.executable, "-m", "cProfile", "-o", str(profile_to), "-m", "daemon.cli"]
        )
        daemon = _start([*prefix, "run", "--config", str(root / "bide.toml")], root / "daemon.log")
        daemon.wait_for(r"msg=ready", 600)
        ready = time.monotonic() - popen
        replayed = daemon.wait_for(r"msg=replayed .*seconds=([\d.]+)", 5).group(1)
        url = daemon.wait_for(r"address=(http://\S+/metrics)", 10).group(1)
        rss_ready = daemon.rss_kib()

        window_start = max(time.time() + 2.0, polls_from + 0.5 * cap + 1.0)
        time.sleep(max(0.0, window_start - time.time()))
        a0 = machine_busy_seconds()
        m0, c0, s0, w0 = _metrics(url), daemon.cpu_seconds(), sim.cpu_seconds(), time.time()
        k0, l0 = daemon.cpu_split()[1], daemon.loop_cpu_seconds()
        backends = _db_backends(dsn, daemon.proc.pid) if dsn is not None else []
        b0 = _cpu_of(backends)
        spy = None
        if out := os.environ.get("BIDE_BENCH_PYSPY"):  # the window's samples: see profile.py
            spy = subprocess.Popen(
                [*_py_spy(out), "-d", str(int(seconds)), "-p", str(daemon.proc.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(seconds)
        if spy is not None:
            spy.wait(timeout=60)
        m1, c1, s1, w1 = _metrics(url), daemon.cpu_seconds(), sim.cpu_seconds(), time.time()
        a1 = machine_busy_seconds()
        k1, l1 = daemon.cpu_split()[1], daemon.loop_cpu_seconds()
        b1 = _cpu_of(backends)
        rss_end = daemon.rss_kib()
        daemon.stop()
        restart = _restart(root)

        sent = int(m1["bide_status_requests_sent_total"] - m0["bide_status_requests_sent_total"])
        achieved = sent / (w1 - w0)
        cpu_per_req = (c1 - c0) / max(sent, 1)
        bare = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.bench.bare_loop",
                    base,
                    str(max(n, 1)),
                    str(max(sent, 1)),
                    str(max(achieved, 1.0)),
                    str(concurrency),
                    str(root / "creds" / "sim.token"),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=3600,
                env={**os.environ, "BIDE_BENCH_SIM_PID": str(sim.proc.pid)},
            ).stdout
        )
        bare_per_req = bare["cpu_seconds"] / bare["requests"]
        # The machine's busy CPU less the simulator's, for the daemon's window and for the
        # bare loop's run: kernel workers included (an AIO fdatasync runs in one).
        machine_per_req = ((a1 - a0) - (s1 - s0)) / max(sent, 1)
        bare_machine_per_req = bare["machine_cpu_seconds"] / bare["requests"]
        ceiling = _bare_ceiling(base, n, sent, concurrency, root) if bare_saturated else None
        hist = {
            k: v1 - m0.get(k, 0.0)
            for k, v1 in m1.items()
            if k.startswith("bide_wakeup_lateness_seconds_bucket")
        }
        return {
            "store": "files" if dsn is None else "postgresql",
            "operations": n,
            "target_rate": rate,
            "backoff_cap_s": cap,
            "concurrency": concurrency,
            "ready_s": round(ready, 2),
            "replay_s": float(replayed),
            "restart": restart,
            "generate_s": round(generated, 2),
            "window_s": round(w1 - w0, 2),
            "requests": sent,
            "requests_per_s": round(achieved, 1),
            "rss_ready_mib": round(rss_ready / 1024, 1),
            "rss_end_mib": round(rss_end / 1024, 1),
            "rss_empty_mib": round(empty_rss / 1024, 1),
            "rss_per_op_ready_kib": round((rss_ready - empty_rss) / max(n, 1), 2),
            "rss_per_op_end_kib": round((rss_end - empty_rss) / max(n, 1), 2),
            "lateness": _lateness(root, w0, w1),
            "lateness_histogram_p99_le": _hist_quantile(hist, 0.99),
            "daemon_cpu_s": round(c1 - c0, 2),
            "daemon_cpu_share": round((c1 - c0) / (w1 - w0), 2),
            "simulator_cpu_share": round((s1 - s0) / (w1 - w0), 2),
            "daemon_cpu_per_request_us": round(cpu_per_req * 1e6, 1),
            "daemon_system_per_request_us": round((k1 - k0) / max(sent, 1) * 1e6, 1),
            "daemon_loop_thread_per_request_us": round((l1 - l0) / max(sent, 1) * 1e6, 1),
            **(
                {
                    "db_backends": len(b1),
                    "db_backend_cpu_per_request_us": round(
                        sum(b1[p] - b0[p] for p in b1 if p in b0) / max(sent, 1) * 1e6, 1
                    ),
                }
                if backends
                else {}
            ),
            "log_flushes_per_request": round(
                (m1["bide_log_flushes_total"] - m0["bide_log_flushes_total"]) / max(sent, 1), 2
            ),
            "bare_loop": {**bare, "cpu_per_request_us": round(bare_per_req * 1e6, 1)},
            "cpu_ratio_vs_bare": round(cpu_per_req / bare_per_req, 2) if bare_per_req else None,
            "machine_cpu_per_request_us": round(machine_per_req * 1e6, 1),
            "bare_machine_cpu_per_request_us": round(bare_machine_per_req * 1e6, 1),
            "machine_cpu_ratio_vs_bare": round(machine_per_req / bare_machine_per_req, 2)
            if bare_machine_per_req > 0
            else None,
            **(
                {
                    "bare_saturated": ceiling,
                    "saturation_vs_bare": round(achieved / ceiling["requests_per_s"], 2),
                }
                if ceiling
                else {}
            ),
        }
    finally:
        if daemon is not None:
            daemon.stop()
        sim.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _db_backends(dsn: str, pid: int) -> list[int]:
    """The server processes of process ``pid``'s connections to a PostgreSQL on this host:
    the backends whose client port is the local port of one of its TCP sockets (none for a
    Unix socket or another host)."""
    import psycopg

    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = [
        int(f[1].rsplit(":", 1)[1], 16)
        for f in (
            line.split() for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        )
        if f[9] in inodes
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """utime + stime (seconds) of each process still there."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            out[pid] = process_cpu_seconds(pid)
    return out


def _py_spy(out: str) -> list[str]:
    """py-spy recording raw samples into ``out`` the way ``tests.bench.profile`` reads them."""
    return [
        str(Path(sys.executable).with_name("py-spy")),
        "record",
        "--nonblocking",
        "--gil",
        "-f",
        "raw",
        "-r",
        "250",
        "-o",
        out,
    ]


def _bare_ceiling(base: str, n: int, count: int, concurrency: int, root: Path) -> dict[str, float]:
    """The bare loop with no pacing: requests/s and CPU per request at its own saturation
    (with ``BIDE_BENCH_PYSPY=FILE``, profiled into ``FILE.bare`` as the daemon is into FILE)."""
    spy = (
        [*_py_spy(f"{profile_to}.bare"), "--"]
        if (profile_to := os.environ.get("BIDE_BENCH_PYSPY"))
        else []
    )
    printed = subprocess.run(
        [
            *spy,
            sys.executable,
            "-m",
            "tests.bench.bare_loop",
            base,
            str(max(n, 1)),
            str(max(count, 1)),
            "0",
            str(concurrency),
            str(root / "creds" / "sim.token"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    ).stdout
    # py-spy prints its own lines to the same stdout; the loop's is the one JSON line.
    out = json.loads(next(line for line in printed.splitlines() if line.startswith("{")))
    return {
        "requests": out["requests"],
        "requests_per_s": round(out["requests"] / out["seconds"], 1),
        "cpu_per_request_us": round(out["cpu_seconds"] / out["requests"] * 1e6, 1),
    }


def _restart(root: Path) -> dict[str, float]:
    """Start the daemon again on the log (and the snapshot its clean stop wrote): seconds
    from exec to ready, and how many events came from the snapshot."""
    popen = time.monotonic()
    daemon = _start([*BIDE, "run", "--config", str(root / "bide.toml")], root / "restart.log")
    try:
        daemon.wait_for(r"msg=ready", 600)
        ready = time.monotonic() - popen
        m = daemon.wait_for(
            r"msg=replayed events=(\d+) .*from_snapshot=(\d+) "
            r"seconds=([\d.]+)",
            5,
        )
    finally:
        daemon.stop()
    return {
        "ready_s": round(ready, 2),
        "events": int(m.group(1)),
        "from_snapshot": int(m.group(2)),
        "replay_s": float(m.group(3)),
    }


def _hist_quantile(buckets: dict[str, float], q: float) -> str | None:
    pairs = []
    for name, count in buckets.items():
        m = re.search(r'le="([^"]+)"', name)
        if m:
            pairs.append((float(m.group(1)), count))
    pairs.sort()
    if not pairs or pairs[-1][1] <= 0:
        return None
    total = pairs[-1][1]
    for bound, cum in pairs:
        if cum >= q * total:
            return f"{bound:g}s"
    return None


def run(
    work: Path,
    scales: list[int],
    seconds: float,
    rates: list[float],
    concurrency: int = 8,
    keep: bool = False,
) -> dict[str, object]:
    empty = _empty_rss(work)
    rows = []
    for n in scales:
        for rate in rates:
            row = run_one(work, n, seconds, rate, concurrency, empty, keep)
            rows.append(row)
            print(f"  {n} operations at {rate:g}/s: {json.dumps(row)}", file=sys.stderr)
    return {
        "goals": {
            "rss_per_op_kib": 2.0,
            "p99_lateness_ms": 100,
            "at_requests_per_s": 2000,
            "cpu_ratio_vs_bare": 1.5,
        },
        "rows": rows,
    }
