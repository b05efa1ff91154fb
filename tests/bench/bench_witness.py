"""What a flood of refused requests costs `bide witness serve`, and its request bounds.

A real witness process (one trusted log, a token) on 127.0.0.1 gets 10,000 requests that it
must refuse -- no token, a wrong token, a body over the limit, a path it does not serve --
from one client, with the rate limit raised out of the way, over a few connections at once.
Measured: the process's resident memory (VmRSS) before and after, and the requests served a
second. Also reported: the largest body it accepts (``MAX_BODY``) and the size of the largest
POST the daemon's publisher makes (256 heads of a real log).

    python -m tests.bench.bench_witness [--requests N]
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import msgspec

from daemon.witness.publisher import MAX_HEADS_PER_POST
from daemon.witness.service import MAX_BODY, write_token
from eventlog import keys
from eventlog.heads import HeadStore, read_heads
from tests.bench.bench_epochs import _checkpoints

BIDE = [sys.executable, "-m", "daemon.cli"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def largest_post(root: Path) -> int:
    """Bytes of a publisher POST of MAX_HEADS_PER_POST heads (plus the head before)."""
    keys.generate(root / "keys")
    store = HeadStore(root / "heads.jsonl")
    anyio.run(_checkpoints, root / "log", root / "keys", "epoch", MAX_HEADS_PER_POST + 1, store)
    heads = read_heads(root / "heads.jsonl")[: MAX_HEADS_PER_POST + 1]
    return len(msgspec.json.encode({"heads": heads}))


def _refused(url: str, token: str, i: int, client: httpx.Client) -> int:
    kind = i % 4
    if kind == 0:
        r = client.post(f"{url}/v1/heads", content=b'{"heads": []}')
    elif kind == 1:
        r = client.post(
            f"{url}/v1/heads",
            content=b'{"heads": []}',
            headers={"authorization": "Bearer wrong-token-0123456789abcdef"},
        )
    elif kind == 2:  # announces a body over the limit (refused before any is read)
        host, _, port = url.removeprefix("http://").rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(
                f"POST /v1/heads HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer "
                f"{token}\r\ncontent-length: {MAX_BODY + 1}\r\n\r\n".encode()
            )
            return int(s.makefile("rb").readline().split()[1])
    else:
        r = client.get(f"{url}/nothing/here")
    return r.status_code


def run(work: Path, requests: int = 10_000) -> dict[str, float]:
    trust = work / "trust" / ("ab" * 16)
    keys.generate(work / "keys")
    trust.mkdir(parents=True)
    (trust / "verify.pub").write_bytes((work / "keys" / "verify.pub").read_bytes())
    write_token(trust / "token")
    token = (trust / "token").read_text().strip()
    proc = subprocess.Popen(
        [
            *BIDE,
            "witness",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state",
            str(work / "state.jsonl"),
            "--key",
            str(work / "witness.key"),
            "--trust-dir",
            str(work / "trust"),
            "--rate",
            "1000000",
            "--burst",
            "100000",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = "http://" + json.loads(proc.stdout.readline())["listening"]
        before = rss_kib(proc.pid)
        statuses: dict[int, int] = {}
        started = time.perf_counter()
        with httpx.Client(timeout=10) as client, ThreadPoolExecutor(4) as pool:
            for status in pool.map(lambda i: _refused(url, token, i, client), range(requests)):
                statuses[status] = statuses.get(status, 0) + 1
        elapsed = time.perf_counter() - started
        after = rss_kib(proc.pid)
        assert 200 not in statuses, statuses
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    out: dict[str, float] = {
        "refused_requests": float(requests),
        "rss_before_kib": float(before),
        "rss_after_kib": float(after),
        "rss_growth_kib": float(after - before),
        "requests_per_second": requests / elapsed,
        "max_body_bytes": float(MAX_BODY),
        "largest_publisher_post_bytes": float(largest_post(work / "post")),
    }
    out.update({f"status_{k}": float(v) for k, v in sorted(statuses.items())})
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--requests", type=int, default=10_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for k, v in run(Path(d), args.requests).items():
            print(f"{k:30} {v:14.1f}")


if __name__ == "__main__":
    main()
