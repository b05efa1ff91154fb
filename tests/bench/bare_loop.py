"""The baseline of the scale benchmark: a bare httpx loop, as its own process.

``python -m tests.bench.bare_loop BASE_URL JOBS COUNT RATE CONCURRENCY TOKEN_FILE`` sends
``COUNT`` status GETs to ``BASE_URL/jobs/j-NNNNNNN`` (cycling over ``JOBS`` job ids), paced at
``RATE`` per second (0: unpaced, as fast as ``CONCURRENCY`` connections go) with at most
``CONCURRENCY`` in flight, with the same headers, timeout,
connection limits and raw body reading the daemon uses, and nothing else: no log, no
encryption, no decisions. Prints one JSON line: requests, seconds, the process's CPU seconds
(user + system) spent in the loop, and the whole machine's busy CPU seconds over the loop less
the simulator's (``BIDE_BENCH_SIM_PID``): what the loop cost the machine, kernel workers
included.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import anyio
import httpx


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _system() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy CPU time of the whole machine so far, every core: user, nice, system, irq and
    softirq (not idle, iowait or steal). It counts what a process's own figures miss: the
    kernel's workers, such as the one running an fdatasync submitted through AIO."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / CLK_TCK


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _others() -> float:
    """The simulator's CPU so far (``BIDE_BENCH_SIM_PID``), to take out of the machine's."""
    pid = os.environ.get("BIDE_BENCH_SIM_PID")
    return process_cpu_seconds(int(pid)) if pid else 0.0


async def _loop(
    base: str, jobs: int, count: int, rate: float, concurrency: int, token: str
) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {
        "Accept": "application/json",
        "Accept-Encoding": "identity",
        "Authorization": f"Bearer {token}",
        "User-Agent": "bare-loop",
    }
    ok = 0
    sem = anyio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, follow_redirects=False, trust_env=False) as c:

        async def one(i: int) -> None:
            nonlocal ok
            async with sem:
                url = f"{base}/jobs/j-{i % jobs:07d}"
                async with c.stream(
                    "GET", url, headers=headers, timeout=httpx.Timeout(5.0)
                ) as resp:
                    body = b"".join([chunk async for chunk in resp.aiter_raw()])
                    ok += resp.status_code == 200 and bool(body)

        cpu, system, started = _cpu(), _system(), time.monotonic()
        machine, others = machine_busy_seconds(), _others()
        if rate <= 0:  # unpaced: CONCURRENCY workers, each one request after another

            async def worker(w: int) -> None:
                for i in range(w, count, concurrency):
                    await one(i)

            async with anyio.create_task_group() as tg:
                for w in range(concurrency):
                    tg.start_soon(worker, w)
            return {
                "requests": count,
                "ok": ok,
                "seconds": time.monotonic() - started,
                "cpu_seconds": _cpu() - cpu,
                "system_seconds": _system() - system,
                "machine_cpu_seconds": machine_busy_seconds() - machine - (_others() - others),
            }
        async with anyio.create_task_group() as tg:
            for i in range(count):
                due = started + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, i)
        return {
            "requests": count,
            "ok": ok,
            "seconds": time.monotonic() - started,
            "cpu_seconds": _cpu() - cpu,
            "system_seconds": _system() - system,
            "machine_cpu_seconds": machine_busy_seconds() - machine - (_others() - others),
        }


def main(argv: list[str]) -> int:
    base, jobs, count, rate, concurrency, token_file = argv
    token = Path(token_file).read_text().strip()
    out = anyio.run(_loop, base, int(jobs), int(count), float(rate), int(concurrency), token)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
