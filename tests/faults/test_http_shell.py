"""The HTTP shell alone (``StatusClient.call``) against the raw server: the bounds that live
in it, without a daemon around them.

* A provider that trickles its response head a byte at a time never trips httpx's timeouts
  (they bound each socket read): the exchange as a whole must still end within its budget.
* When one request's budget runs out the client is rebuilt (a cancelled request may keep its
  pool slot); another operation's request in flight on the old client must still get its
  answer, not a "connection reset" charged to its transport budget.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from daemon.http import Answer, NoAnswer, StatusClient
from daemon.profile import load_profile
from tests.e2e.harness import DEFAULT_CONTRACT, STATES
from tests.faults.rawserver import RawServer


def _client(tmp_path: Path, raw: RawServer) -> StatusClient:
    path = tmp_path / "raw.toml"
    path.write_text(f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\n\n'
                    f"[contract]\n{DEFAULT_CONTRACT}\n{STATES}")
    return StatusClient(load_profile(path), None)


def test_slowloris_head_ends_within_the_budget(tmp_path: Path) -> None:
    raw = RawServer()
    try:
        async def run() -> tuple[Answer | NoAnswer, float]:
            client = _client(tmp_path, raw)
            started = time.monotonic()
            try:
                result = await client.call("GET", f"{raw.base_url}/jobs/slow-head", seconds=1.0,
                                           cap=4096)
            finally:
                await client.aclose()
            return result, time.monotonic() - started

        result, took = anyio.run(run)
    finally:
        raw.close()
    assert isinstance(result, NoAnswer)
    assert result.kind == "read_timeout"
    assert "head" in result.detail
    assert took < 1.0 + 0.5


def test_one_timeout_does_not_cut_another_request_in_flight(tmp_path: Path) -> None:
    raw = RawServer()
    results: dict[str, Answer | NoAnswer] = {}
    try:
        async def run() -> None:
            client = _client(tmp_path, raw)

            async def one(name: str, seconds: float) -> None:
                results[name] = await client.call("GET", f"{raw.base_url}/jobs/{name}",
                                                  seconds=seconds, cap=4096)

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, "late", 3.0)  # answers after 1.5 s
                    tg.start_soon(one, "slow-body", 0.5)  # times out at 0.5 s: a rebuild
            finally:
                await client.aclose()

        anyio.run(run)
    finally:
        raw.close()
    slow = results["slow-body"]
    assert isinstance(slow, NoAnswer)
    assert slow.kind == "read_timeout"
    late = results["late"]
    assert isinstance(late, Answer), late
    assert late.status == 200
    assert late.body == b'{"status": "running"}'
