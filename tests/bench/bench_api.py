"""The local API at scale (issue 15): ``?wait=`` clients on many live operations, and one
status answer on a large log.

Part 1, waiters. A real ``bide run`` (own process) watches ``operations`` jobs of the simulator
(own process), every one registered through ``POST /v1/operations`` (the registration rate
is reported). Most jobs answer ``running`` forever and are polled with a modest backoff
(``cap`` seconds, ~``0.75 x cap`` mean delay); ``deciders`` of them use a faster profile and
answer ``running`` ``K`` times, then ``succeeded``, with ``K`` chosen so they end after the
waiters are attached and the two CPU windows are over. Then:

    RSS/waiter      (daemon RSS with ``waiters`` clients blocked in ``GET ...?wait=60s``, each
                    on its own connection, minus RSS just before they connected) / waiters
    answer delay    for each decider with a waiter: the time the waiter's answer arrived
                    (``time.time()`` in this process) minus the ``at`` of its
                    ``OperationSucceeded`` event (read from the log afterwards with
                    ``daemon.readers.load_log``); same host clock; p50/p99/max (goal p99 < 50 ms)
    CPU/request     daemon utime+stime (``/proc/PID/stat``) over a window / status requests it
                    sent in the window (its /metrics counter), without and with the waiters
                    attached, and their ratio (what holding the waiters costs the poll loop)

Part 2, status on a large log. ``bide run`` on a copy of the replay benchmark's cached log
(``records`` events, 111,111 operations for 1M); ``GET /v1/operations/{id}`` for ``calls``
random operations, one at a time on one keep-alive connection: p50/p99/max (goal p99 < 5 ms),
against the old full-fold reader (``load_log`` + lookup, the daemon stopped), timed ``runs``
times. The daemon's profile points at a simulator with no jobs, rate-limited to 1 request/s,
so the overdue operations of the old log barely load it.

Two cores are shared by the daemon, the simulator and this process (the waiters' client):
each row reports the daemon's and simulator's CPU share so saturation is visible.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from daemon.api.client import ApiClient
from daemon.readers import load_log
from eventlog import keys
from replay.events import OperationSucceeded
from tests.bench import bench_replay
from tests.bench.bench_scale import BIDE, TOKEN, Proc, _metrics, _start

API_TABLE = (
    "[api]\nregistrations_per_second = 100000\nregistrations_burst = 100000\n"
    'max_live_per_principal = 1000000\nmax_connections = 4096\nsocket_group = ""\n'
)


def _config(root: Path) -> None:
    (root / "bide.toml").write_text(
        '[paths]\nstate_dir = "state"\nkeys_dir = "keys"\nprofiles_dir = "profiles"\n'
        'credentials_dir = "creds"\n\n[log]\ncheckpoint_every = 1000\n\n'
        '[metrics]\nlisten = "127.0.0.1:0"\n\n' + API_TABLE
    )


def _creds(root: Path) -> None:
    (root / "creds").mkdir(mode=0o700)
    token = root / "creds" / "sim.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    (root / "profiles").mkdir()


def _profile(
    root: Path,
    name: str,
    base_url: str,
    cap: float,
    rate: float = 100000,
    burst: int = 100000,
    concurrency: int = 8,
) -> None:
    (root / "profiles" / f"{name}.toml").write_text(
        f'[status]\nurl = "{base_url}/jobs/{{job_id}}"\ntimeout_seconds = 5\n'
        f'max_body_bytes = 65536\n\n[credential]\nfile = "sim.token"\n\n'
        f"[quota]\nrequests_per_second = {rate}\nburst = {burst}\n"
        f"max_in_flight = {concurrency}\n\n"
        f'[contract]\nstate_pointer = "/status"\njob_id_pointer = "/id"\n'
        f"backoff_base_seconds = {cap}\nbackoff_cap_seconds = {cap}\n"
        f"rate_limited_delay_seconds = {2 * cap + 1}\nmin_hint_seconds = 0.05\n"
        f"default_deadline_seconds = 86400\ndefault_max_status_requests = 1000000\n"
        f"limit_status_requests = 1000000\n\n"
        f'[contract.states]\npending = ["queued", "running"]\nsuccess = ["succeeded"]\n'
    )


def _q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def _ms(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(_q(values, 0.5) * 1000, 2),
        "p99_ms": round(_q(values, 0.99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


class _Conn:
    """One HTTP/1.1 keep-alive connection to the API socket, raw: httpx's pool costs the
    client ~4.5 ms of CPU per request at 64 connections (measured), which would load the
    two cores and delay the client's own timestamps; this costs ~60 us."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    @classmethod
    async def open(cls, sock: Path) -> _Conn:
        return cls(await anyio.connect_unix(str(sock)))

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: bide\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        await self.stream.send(head.encode() + b"\r\n" + data)
        while b"\r\n\r\n" not in self.buf:
            self.buf += await self.stream.receive()
        header, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(v)
            for k, _, v in (line.partition(":") for line in lines[1:])
            if k.strip().lower() == "content-length"
        )
        while len(rest) < length:
            rest += await self.stream.receive()
        self.buf = rest[length:]
        return status, json.loads(rest[:length]) if length else None

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _register(sock: Path, regs: list[tuple[str, str, str]], concurrency: int = 32) -> float:
    """POST every (operation id, provider, job id), ``concurrency`` connections; seconds."""
    started = time.perf_counter()
    it = iter(regs)

    async def worker() -> None:
        conn = await _Conn.open(sock)
        try:
            for op_id, provider, job in it:
                status, answer = await conn.call(
                    "POST",
                    "/v1/operations",
                    {
                        "provider": provider,
                        "job_id": job,
                        "operation_id": op_id,
                        "deadline_seconds": 7200,
                        "max_status_requests": 100000,
                    },
                )
                if status != 201:
                    raise RuntimeError(f"register {op_id}: {status} {answer}")
        finally:
            await conn.aclose()

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return time.perf_counter() - started


def _window(daemon: Proc, sim: Proc, url: str, seconds: float) -> dict[str, float]:
    m0, c0, s0, w0 = _metrics(url), daemon.cpu_seconds(), sim.cpu_seconds(), time.time()
    time.sleep(seconds)
    m1, c1, s1, w1 = _metrics(url), daemon.cpu_seconds(), sim.cpu_seconds(), time.time()
    sent = int(m1["bide_status_requests_sent_total"] - m0["bide_status_requests_sent_total"])
    return {
        "seconds": round(w1 - w0, 2),
        "requests": sent,
        "requests_per_s": round(sent / (w1 - w0), 1),
        "daemon_cpu_share": round((c1 - c0) / (w1 - w0), 3),
        "simulator_cpu_share": round((s1 - s0) / (w1 - w0), 3),
        "daemon_cpu_per_request_us": round((c1 - c0) / max(sent, 1) * 1e6, 1),
        "api_waiters": m1.get("bide_api_waiters", -1),
    }


def _wait_metric(url: str, name: str, value: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        if _metrics(url).get(name, -1) >= value:
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"{name} never reached {value}: {_metrics(url).get(name)}")


def run_waiters(
    work: Path,
    operations: int,
    waiters: int,
    deciders: int,
    cap: float,
    window: float,
    keep: bool = False,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="api-wait-", dir=work))
    fast = 1.0  # the deciders' backoff cap (s)
    keys.generate(root / "keys")
    _creds(root)
    _config(root)
    running = operations - deciders
    # Registration takes seconds and every first poll comes 0.5-1 x cap after it: the
    # windows start once polls are spread (``settle``). Deciders are registered last; they
    # must outlive settling, window A, attaching, window B: mean time to success is about
    # 0.75 * fast * (K + 1) seconds after their registration (sd ~0.15 * fast * sqrt(K)).
    settle = 1.5 * cap
    attach_budget = 5.0 + waiters / 100
    k = int((settle + window + attach_budget + window + 10.0) / (0.75 * fast)) + 1
    script = ['[server]\nrequest_id_header = "X-Request-Id"\n']
    script += [f'[jobs.j-{i:07d}]\nsteps = "running"\n' for i in range(running)]
    script += [f'[jobs.d-{i:07d}]\nsteps = "running x{k}, succeeded"\n' for i in range(deciders)]
    (root / "sim.toml").write_text("\n".join(script))
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
        _profile(root, "sim", base, cap)
        _profile(root, "fast", base, fast)
        daemon = _start([*BIDE, "run", "--config", str(root / "bide.toml")], root / "daemon.log")
        daemon.wait_for(r"msg=ready", 120)
        sock = Path(daemon.wait_for(r'msg="api listening" socket=(\S+)', 10).group(1).strip('"'))
        url = daemon.wait_for(r"address=(http://\S+/metrics)", 10).group(1)
        rss_empty = daemon.rss_kib()

        regs = [(f"op-{i:07d}", "sim", f"j-{i:07d}") for i in range(running)]
        c0 = daemon.cpu_seconds()
        registered_s = anyio.run(_register, sock, regs)
        register_cpu = daemon.cpu_seconds() - c0
        dregs = [(f"dec-{i:07d}", "fast", f"d-{i:07d}") for i in range(deciders)]
        registered_s += anyio.run(_register, sock, dregs)
        deciders_at = time.time()
        time.sleep(settle)
        rss_window_start = daemon.rss_kib()
        no_waiters = _window(daemon, sim, url, window)
        rss_before, rss_before_at = daemon.rss_kib(), time.time()

        result: dict[str, Any] = {}
        anyio.run(
            _with_waiters,
            sock,
            url,
            daemon,
            sim,
            waiters,
            deciders,
            running,
            window,
            deciders_at + 0.75 * fast * (k + 1) * 3 + 60,
            result,
        )
        daemon.stop()
        # Join the answers with the log, after the daemon stopped (same clock: time.time()).
        log = load_log(root / "state" / "log", keys.load_keyring(root / "keys"))
        succeeded = {
            ev.operation_id: ev.at for _, ev in log.events if isinstance(ev, OperationSucceeded)
        }
        delays = [
            answered - succeeded[op_id]
            for op_id, answered in result["answers"].items()
            if op_id in succeeded
        ]
        early = [op_id for op_id in result["answers"] if op_id not in succeeded]
        with_waiters = result["window"]
        rss_with = result["rss_with_kib"]
        drift = (rss_before - rss_window_start) / no_waiters["seconds"]  # KiB/s, no waiters
        growth = rss_with - rss_before - drift * (result["rss_with_at"] - rss_before_at)
        return {
            "operations": operations,
            "waiters": waiters,
            "deciders": deciders,
            "backoff_cap_s": cap,
            "decider_polls_before_success": k,
            "register_s": round(registered_s, 2),
            "registrations_per_s": round(operations / registered_s, 1),
            "daemon_cpu_per_registration_us": round(register_cpu / running * 1e6, 1),
            "rss_empty_mib": round(rss_empty / 1024, 1),
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_with_mib": round(rss_with / 1024, 1),
            "rss_per_op_kib": round((rss_before - rss_empty) / operations, 2),
            "rss_per_waiter_kib": round((rss_with - rss_before) / max(waiters, 1), 2),
            "rss_drift_without_waiters_kib_per_s": round(drift, 1),
            "rss_growth_per_status_request_kib": round(
                drift / max(no_waiters["requests_per_s"], 0.1), 2
            ),
            "rss_per_waiter_less_drift_kib": round(growth / max(waiters, 1), 2),
            "attach_s": result["attach_s"],
            "deciders_answered": len(result["answers"]),
            "deciders_succeeded_in_log": len(succeeded),
            "answers_before_success": len(early),
            "deciders_succeeded_before_attach": sum(
                at < result["attached_at"]
                for op_id, at in succeeded.items()
                if op_id.startswith("dec-")
            ),
            "answer_delay": _ms(delays),
            "no_waiters": no_waiters,
            "with_waiters": with_waiters,
            "cpu_per_request_ratio": round(
                with_waiters["daemon_cpu_per_request_us"]
                / max(no_waiters["daemon_cpu_per_request_us"], 0.1),
                2,
            ),
            "client_errors": result["errors"],
        }
    finally:
        if daemon is not None:
            daemon.stop()
        sim.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


async def _with_waiters(
    sock: Path,
    url: str,
    daemon: Proc,
    sim: Proc,
    waiters: int,
    deciders: int,
    running: int,
    window: float,
    give_up_at: float,
    result: dict[str, Any],
) -> None:
    """Attach ``waiters`` (every decider, the rest on running operations), measure RSS and
    window B, then wait for every decider's answer; fills ``result``."""
    targets = [f"dec-{i:07d}" for i in range(min(deciders, waiters))]
    rng = random.Random(15)
    targets += [f"op-{i:07d}" for i in rng.sample(range(running), waiters - len(targets))]
    answers: dict[str, float] = {}
    errors: list[str] = []
    n_deciders = min(deciders, waiters)
    all_answered = anyio.Event()

    async def wait(op_id: str) -> None:
        conn = await _Conn.open(sock)
        try:
            while True:
                status, answer = await conn.call("GET", f"/v1/operations/{op_id}?wait=60s")
                at = time.time()
                if status != 200:
                    errors.append(f"{op_id}: {status} {answer}")
                    return
                if answer["done"]:
                    answers[op_id] = at
                    if len(answers) >= n_deciders:
                        all_answered.set()
                    return
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            errors.append(f"{op_id}: {exc!r}")
        finally:
            with anyio.CancelScope(shield=True):
                await conn.aclose()

    async with anyio.create_task_group() as tg:
        for op_id in targets:
            tg.start_soon(wait, op_id)
        result["attach_s"] = round(
            await anyio.to_thread.run_sync(
                _wait_metric, url, "bide_api_waiters", waiters - len(answers), 120.0
            ),
            2,
        )
        result["attached_at"] = time.time()
        await anyio.sleep(1.0)
        result["rss_with_kib"], result["rss_with_at"] = daemon.rss_kib(), time.time()
        result["window"] = await anyio.to_thread.run_sync(_window, daemon, sim, url, window)
        with anyio.move_on_after(max(0.0, give_up_at - time.time())):
            await all_answered.wait()
        tg.cancel_scope.cancel()
    result["answers"] = {k: v for k, v in answers.items() if k.startswith("dec-")}
    result["errors"] = errors[:5]


def run_status(
    work: Path, records: int, calls: int, runs: int, keep: bool = False
) -> dict[str, Any]:
    log_dir, key_dir = bench_replay.cached_log(work, records)
    root = Path(tempfile.mkdtemp(prefix="api-status-", dir=work))
    shutil.copytree(key_dir, root / "keys")
    (root / "state").mkdir()
    shutil.copytree(log_dir, root / "state" / "log")
    _creds(root)
    _config(root)
    (root / "sim.toml").write_text('[server]\nrequest_id_header = "X-Request-Id"\n')
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
        base = sim.wait_for(r"listening on (http://\S+)", 60).group(1)
        _profile(root, "sim", base, 3600.0, rate=1, burst=1, concurrency=1)
        popen = time.monotonic()
        daemon = _start([*BIDE, "run", "--config", str(root / "bide.toml")], root / "daemon.log")
        daemon.wait_for(r"msg=ready", 600)
        ready = time.monotonic() - popen
        sock = Path(daemon.wait_for(r'msg="api listening" socket=(\S+)', 10).group(1).strip('"'))
        operations = records // bench_replay.EVENTS_PER_OP
        rng = random.Random(5)
        ids = [f"op-{rng.randrange(operations):07d}" for _ in range(calls)]
        # After ready the daemon works a few seconds more (the snapshot a long replay asks
        # for, the overdue operations): wait until it is quiet so the calls are timed alone.
        quiet_from = time.monotonic()
        while time.monotonic() - quiet_from < 120:
            c = daemon.cpu_seconds()
            time.sleep(1.0)
            if daemon.cpu_seconds() - c < 0.1:
                break
        quiet = time.monotonic() - quiet_from
        c0 = daemon.cpu_seconds()
        w0 = time.monotonic()
        lat: list[float] = []
        with ApiClient(sock) as client:  # what the CLI uses: httpx, one keep-alive connection
            for warm in ids[:10]:
                client.call("GET", f"/v1/operations/{warm}")
            for op_id in ids:
                started = time.perf_counter()
                answer = client.call("GET", f"/v1/operations/{op_id}")
                lat.append(time.perf_counter() - started)
                assert answer["operation_id"] == op_id
        call_cpu = daemon.cpu_seconds() - c0
        idle_share = call_cpu / (time.monotonic() - w0)
        rss = daemon.rss_kib()
        daemon.stop()
        folds: list[float] = []
        keyring = keys.load_keyring(root / "keys")
        events = 0
        for _ in range(runs):
            started = time.perf_counter()
            log = load_log(root / "state" / "log", keyring)
            found = log.ops[ids[0]]
            folds.append(time.perf_counter() - started)
            events = len(log.events)
            assert found.operation_id == ids[0]
            del log
        return {
            "records": records,
            "operations": operations,
            "events_folded": events,
            "daemon_ready_s": round(ready, 2),
            "busy_after_ready_s": round(quiet, 1),
            "daemon_rss_mib": round(rss / 1024, 1),
            "daemon_cpu_share_during_calls": round(idle_share, 3),
            "daemon_cpu_per_call_us": round(call_cpu / (calls + 10) * 1e6, 1),
            "api_get": _ms(lat),
            "full_fold_s": [round(f, 2) for f in folds],
            "full_fold_best_ms": round(min(folds) * 1000, 1),
        }
    finally:
        if daemon is not None:
            daemon.stop()
        sim.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def run(work: Path, quick: bool, keep: bool = False) -> dict[str, Any]:
    if quick:
        waiters = run_waiters(
            work, operations=2_000, waiters=200, deciders=50, cap=10.0, window=5.0, keep=keep
        )
    else:
        waiters = run_waiters(
            work, operations=10_000, waiters=1_000, deciders=200, cap=20.0, window=15.0, keep=keep
        )
    print(f"  waiters: {json.dumps(waiters)}", file=sys.stderr)
    status = run_status(
        work,
        100_000 if quick else 1_000_000,
        calls=200 if quick else 1000,
        runs=1 if quick else 2,
        keep=keep,
    )
    print(f"  status: {json.dumps(status)}", file=sys.stderr)
    return {
        "goals": {"answer_delay_p99_ms": 50, "status_p99_ms": 5},
        "waiters": waiters,
        "status": status,
    }
