"""A provider that misbehaves on purpose, against the real daemon.

Each case is one operation with a budget of one status request, so it ends at its first
outcome: a recorded fact (a response, capped, or a transport failure of a named kind) and a
stop with a reason. What holds for all of them: each ends within its request timeout (2 s)
plus slack, the daemon's peak RSS stays modest (nothing held whole, nothing decompressed), and
the credential reaches no origin but the provider's.

Cases the simulator can script run against it (Retry-After of ten years, a negative hint, a
redirect to another origin); the rest against a raw socket server
(:mod:`tests.faults.rawserver`): slowloris in the head and in the body, an endless body, a
10 MB header, invalid UTF-8, a gzip bomb.
"""

from __future__ import annotations

import time
from pathlib import Path

from replay.events import (
    Event,
    HintRejected,
    OperationStopped,
    PollScheduled,
    StatusResponseReceived,
    TransportFailed,
)
from tests.e2e.harness import DEFAULT_CONTRACT, STATES, TOKEN, Workspace, until, workspace
from tests.faults.rawserver import RawServer
from tests.faults.support import rss_kib

TIMEOUT = 2.0  # [status] timeout_seconds of both profiles
MAX_BODY = 65536
RSS_GROWTH_KIB = 64 * 1024  # peak RSS over the RSS at ready; a 1 GiB bomb would blow it


def _raw_profile(ws: Workspace, raw: RawServer) -> None:
    (ws.root / "profiles" / "raw.toml").write_text(
        f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\ntimeout_seconds = {TIMEOUT}\n'
        f'max_body_bytes = {MAX_BODY}\n\n[credential]\nfile = "sim.token"\n\n'
        f"[contract]\n{DEFAULT_CONTRACT}\n{STATES}"
    )


def _events(ws: Workspace, op: str) -> list[Event]:
    return [e for _, e in ws.log().events if e.operation_id == op]


def _first_fact(events: list[Event]) -> StatusResponseReceived | TransportFailed:
    return next(e for e in events if isinstance(e, StatusResponseReceived | TransportFailed))


def _stop(events: list[Event]) -> OperationStopped:
    return next(e for e in events if isinstance(e, OperationStopped))


RAW_CASES = ("slow-head", "slow-body", "endless", "big-header", "bad-utf8", "gzip-bomb")


def test_hostile_provider_outcomes_are_recorded_and_bounded(
    tmp_path: Path, raw: RawServer, elsewhere: RawServer
) -> None:
    sim_jobs: dict[str, str | list[object]] = {
        "ten-years": [{"state": "running", "retry_after": 10 * 365 * 86400}],
        "negative-hint": [{"state": "running", "poll_after_seconds": -5}, "running"],
        "redirect": [{"status": 302, "redirect": f"{elsewhere.base_url}/jobs/steal"}],
    }
    with workspace(tmp_path, sim_jobs) as ws:
        _raw_profile(ws, raw)
        daemon = ws.start_daemon()
        until(lambda: "provider=raw" in daemon.output(), what="the raw profile loaded")
        ready_rss, _ = rss_kib(daemon.proc.pid)
        started = time.monotonic()
        for name in RAW_CASES:
            assert (
                ws.bide(
                    "watch",
                    "--provider",
                    "raw",
                    "--job",
                    name,
                    "--operation",
                    name,
                    "--deadline",
                    "1m",
                    "--max-requests",
                    "1",
                ).returncode
                == 0
            )
        assert (
            ws.watch("redirect", "redirect", "--deadline", "1h", "--max-requests", "1").returncode
            == 0
        )
        for name in ("ten-years", "negative-hint"):  # a budget left, so a wait is decided
            assert ws.watch(name, name, "--deadline", "1h", "--max-requests", "2").returncode == 0
        every = [*RAW_CASES, "ten-years", "redirect", "negative-hint"]

        def all_ended() -> bool:
            ops = ws.log().ops
            return all(op in ops and ops[op].phase != "live" for op in every)

        # The slowest case is a full timeout per request, and requests overlap.
        until(all_ended, timeout=TIMEOUT * len(every) + 15, what="every operation to end")
        elapsed = time.monotonic() - started
        _, peak_rss = rss_kib(daemon.proc.pid)
        assert daemon.stop() == 0

        facts = {name: _first_fact(_events(ws, name)) for name in every}
        stops = {name: _stop(_events(ws, name)) for name in every}

        for name in ("slow-head", "slow-body"):  # a byte now and then is no answer
            fact = facts[name]
            assert isinstance(fact, TransportFailed), (name, fact)
            assert fact.kind == "read_timeout", (name, fact)
        endless = facts["endless"]
        assert isinstance(endless, StatusResponseReceived)
        assert endless.body_truncated
        assert len(endless.body) == MAX_BODY
        huge = facts["big-header"]
        assert isinstance(huge, TransportFailed)
        assert huge.kind == "protocol_error"
        bad = facts["bad-utf8"]
        assert isinstance(bad, StatusResponseReceived)
        assert stops["bad-utf8"].reason == "unparseable_response"
        bomb = facts["gzip-bomb"]
        assert isinstance(bomb, StatusResponseReceived)
        assert bomb.body.startswith(b"\x1f\x8b"), "the body was decompressed"
        assert bomb.body_truncated
        assert len(bomb.body) == MAX_BODY
        assert stops["ten-years"].reason == "retry_after_past_deadline"
        redirect = facts["redirect"]
        assert isinstance(redirect, StatusResponseReceived)
        assert redirect.status_code == 302
        assert stops["redirect"].reason == "integration_failure"
        assert elsewhere.seen == [], "a redirect to another origin was followed"
        hint_events = _events(ws, "negative-hint")
        assert any(
            isinstance(e, HintRejected) and e.hint == "poll_after_seconds" for e in hint_events
        )
        first_poll = next(e for e in hint_events if isinstance(e, PollScheduled))
        assert first_poll.delay_source == "local_backoff"
        assert first_poll.delay > 0

        for name in every:  # bounded: every request gave up within its timeout (+ slack)
            fact = facts[name]
            intent_at = next(
                e.at for e in _events(ws, name) if type(e).__name__ == "StatusRequestIntended"
            )
            assert fact.at - intent_at <= TIMEOUT + 1.0, (name, fact.at - intent_at)
        assert elapsed < TIMEOUT * len(every) + 15
        assert peak_rss - ready_rss < RSS_GROWTH_KIB, (
            f"peak RSS grew {(peak_rss - ready_rss) // 1024} MiB over the RSS at ready"
        )
        # The provider's own origin got the credential; nothing else did.
        assert all(f"Bearer {TOKEN}".encode() in s.head for s in raw.seen)
        assert {s.path.rsplit("/", 1)[-1] for s in raw.seen} == set(RAW_CASES)
