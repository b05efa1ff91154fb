"""Shared pieces for the simulator tests: a script covering every step kind, and a client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from daemon.simulator import Script, SimulatorHandle, parse_script, run_in_thread

TOKEN = "sim-t0ken-9c2e51"  # never to be seen in a log or on stdout

SCRIPT = """
[server]
headers = { RateLimit-Policy = "10;w=60" }

[jobs.seq]
steps = "queued x2, running x3, succeeded with result"

[jobs.eventual]
steps = "404 x2, running"

[jobs.r503]
steps = [{ status = 503, retry_after = 120 }]

[jobs.r503date]
steps = [{ status = 503, retry_after_date = 30 }]

[jobs.r429]
steps = ["429", { status = 429, retry_after = 7 }]

[jobs.denied]
steps = ["401", "403", "500"]

[jobs.reset]
steps = [{ fault = "reset" }, "running"]

[jobs.closed]
steps = [{ fault = "close" }, "running"]

[jobs.slow]
steps = [{ delay = 30, state = "running" }]

[jobs.big]
steps = [{ fault = "oversize", size = 3000000 }]

[jobs.bigchunked]
steps = [{ fault = "oversize", size = 3000000, chunked = true }]

[jobs.malformed]
steps = [{ fault = "malformed" }]

[jobs.odd]
steps = ["manual_review"]

[jobs.noresult]
steps = ["succeeded"]

[jobs.expired]
steps = [{ state = "running", expires_in = -60 }]

[jobs.hints]
steps = [
  { state = "running", next_check_in = 3600, poll_after_seconds = 5 },
  { state = "running", poll_after_seconds = -5 },
  { state = "running", poll_after_seconds = 1e9, next_check_at = "not a date" },
  { state = "running", poll_after_seconds = "soon" },
]

[jobs.ratelimit]
steps = [{ state = "running", headers = { RateLimit = "limit=10, remaining=0, reset=30" } }]

[jobs.away]
steps = [{ redirect = "http://localhost:{port}/jobs/{id}" }]

[jobs.nostate]
steps = [{ fields = { progress = 0.5 } }]

[jobs.literal]
steps = [
  { status = 200, body = "<html>maintenance</html>", headers = { Content-Type = "text/html" } },
]

[jobs."a/b c"]
steps = ["running"]

[jobs.file]
steps = ["succeeded with result"]
result_size = 100000

[scenarios.quick]
steps = "running, succeeded with result"

[scenarios.slowjob]
steps = "queued x3, succeeded"
"""


@pytest.fixture(scope="module")
def script() -> Script:
    return parse_script(SCRIPT, source="conftest.SCRIPT")


@pytest.fixture
def sim(script: Script) -> Iterator[SimulatorHandle]:
    with run_in_thread(script) as handle:
        yield handle


@pytest.fixture
def client(sim: SimulatorHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.base_url, timeout=5.0) as c:
        yield c
