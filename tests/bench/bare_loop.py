"""The baseline of the scale benchmark: a bare httpx loop, as its own process.

``python -m tests.bench.bare_loop BASE_URL JOBS COUNT RATE CONCURRENCY TOKEN_FILE`` sends
``COUNT`` status GETs to ``BASE_URL/jobs/j-NNNNNNN`` (cycling over ``JOBS`` job ids), paced at
``RATE`` per second (0: unpaced, as fast as ``CONCURRENCY`` connections go) with at most
``CONCURRENCY`` in flight, with the same headers, timeout,
connection limits and raw body reading the daemon uses, and nothing else: no log, no
encryption, no decisions. Prints one JSON line: requests, seconds, and the process's CPU
seconds (user + system) spent in the loop.
"""

from __future__ import annotations

import json
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


async def _loop(base: str, jobs: int, count: int, rate: float, concurrency: int,
                token: str) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Accept": "application/json", "Accept-Encoding": "identity",
               "Authorization": f"Bearer {token}", "User-Agent": "bare-loop"}
    ok = 0
    sem = anyio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, follow_redirects=False, trust_env=False) as c:

        async def one(i: int) -> None:
            nonlocal ok
            async with sem:
                url = f"{base}/jobs/j-{i % jobs:07d}"
                async with c.stream("GET", url, headers=headers,
                                    timeout=httpx.Timeout(5.0)) as resp:
                    body = b"".join([chunk async for chunk in resp.aiter_raw()])
                    ok += resp.status_code == 200 and bool(body)

        cpu, system, started = _cpu(), _system(), time.monotonic()
        if rate <= 0:  # unpaced: CONCURRENCY workers, each one request after another
            async def worker(w: int) -> None:
                for i in range(w, count, concurrency):
                    await one(i)

            async with anyio.create_task_group() as tg:
                for w in range(concurrency):
                    tg.start_soon(worker, w)
            return {"requests": count, "ok": ok, "seconds": time.monotonic() - started,
                    "cpu_seconds": _cpu() - cpu, "system_seconds": _system() - system}
        async with anyio.create_task_group() as tg:
            for i in range(count):
                due = started + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, i)
        return {"requests": count, "ok": ok, "seconds": time.monotonic() - started,
                "cpu_seconds": _cpu() - cpu, "system_seconds": _system() - system}


def main(argv: list[str]) -> int:
    base, jobs, count, rate, concurrency, token_file = argv
    token = Path(token_file).read_text().strip()
    out = anyio.run(_loop, base, int(jobs), int(count), float(rate), int(concurrency), token)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
