"""Every simulator behaviour of issue 5, end to end, asserted from both sides.

One real ``bide run`` serves every scenario at once (start-up is paid once): each scenario is
one operation on its own scripted job, registered through the spool as ``bide watch`` does.
The module fixture waits until every operation has ended, keeps the daemon running for a quiet
period (a request that should never come would land in it), stops it cleanly and loads the
log. Each test then reads one operation from both sides:

* what bide recorded: phase, stop reason, counters, ``ResponseClassified``, ``PollScheduled``
  delay sources, ``HintRejected``, ``TransportFailed``;
* what the simulator received: how many requests, and when (``RequestRecord.wall``).

Every test also checks the provider-side invariant (``assert_provider_invariants``): each
request the provider saw has its own durable ``StatusRequestIntended``, numbered in arrival
order, written before the request arrived, within budget and deadline, and no request came
before a Retry-After or the schedule bide had recorded.

Durations are scaled: backoff 0.2..0.4 s, Retry-After 1-2 s, deadlines of seconds.

The whole module runs twice, once per store (the ``store`` fixture): with the log in segment
files, and with it in PostgreSQL, where the daemon is a node holding the lease (the daemon's
default lease timings: every status timeout here fits in them with room to spare) and the log
is also checked in the database (``bide verify --dsn``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from daemon.config import load_config
from daemon.readers import LoadedLog
from daemon.simulator import RequestRecord
from daemon.spool import Spool
from replay.events import (
    EscalationRaised,
    Event,
    HintRejected,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    PollScheduled,
    ResponseClassified,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
)
from replay.signals import parse_instant
from replay.state import Operation
from tests.e2e.harness import (
    RegistrationFields,
    Workspace,
    assert_log_verifies,
    assert_provider_invariants,
    drop_registration,
    until,
    workspace,
    write_status_profile,
)

E = TypeVar("E", bound=Event)

BACKOFF_CAP = 0.4
RATE_LIMITED_DELAY = 1.0
GRACE = 2.5
QUIET = 1.5  # > every local delay (rate-limited delay 1.0 s): a stray request lands in it
TIGHT_TIMEOUT = 0.5
TIGHT_CAP = 4096

CONTRACT = f"""\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{{ name = "result_url", pointer = "/result_url", kind = "url" }}]
next_check_at_pointer = "/next_check_at"
poll_after_seconds_pointer = "/poll_after_seconds"
expires_at_pointer = "/expires_at"
error_pointer = "/error"
backoff_base_seconds = 0.2
backoff_cap_seconds = {BACKOFF_CAP}
rate_limited_delay_seconds = {RATE_LIMITED_DELAY}
min_hint_seconds = 0.05
max_hint_horizon_seconds = 60
not_found_grace_seconds = {GRACE}
default_deadline_seconds = 20
default_max_status_requests = 12
default_max_transport_failures = 3
default_max_rate_limited = 3
"""
# Quota far above what the scenarios need: no poll is held back (no ``local_quota`` delays).
QUOTA = "[quota]\nrequests_per_second = 1000\nburst = 1000\nmax_in_flight = 64\n"


@dataclass(frozen=True)
class Scenario:
    steps: str | list[object]
    provider: str = "sim"
    deadline: float | None = None  # seconds from registration
    budgets: RegistrationFields = field(default_factory=RegistrationFields)


SCENARIOS: dict[str, Scenario] = {
    "ra-seconds": Scenario([{"status": 503, "retry_after": 1}, "succeeded with result"]),
    "ra-date": Scenario([{"status": 503, "retry_after_date": 2}, "succeeded with result"]),
    "ra-past-deadline": Scenario([{"status": 503, "retry_after": 30}], deadline=10),
    "429-retry-after": Scenario([{"status": 429, "retry_after": 1}, "succeeded with result"]),
    "429-bare": Scenario([{"status": 429}, "succeeded with result"]),
    "429-storm": Scenario([{"status": 429}], budgets={"max_rate_limited": 2}),
    "404-within-grace": Scenario([{"status": 404, "times": 2}, "succeeded with result"]),
    "404-past-grace": Scenario([{"status": 404}], budgets={"max_status_requests": 40}),
    "401": Scenario([{"status": 401}, "succeeded with result"]),
    "403": Scenario([{"status": 403}, "succeeded with result"]),
    "500": Scenario([{"status": 500}], budgets={"max_transport_failures": 2}),
    "reset": Scenario([{"fault": "reset"}, "succeeded with result"]),
    "slow": Scenario(
        [{"delay": 1.5, "state": "running"}, "succeeded with result"], provider="tight"
    ),
    "oversize": Scenario([{"fault": "oversize", "size": 20_000}], provider="tight"),
    "oversize-chunked": Scenario(
        [{"fault": "oversize", "size": 20_000, "chunked": True}], provider="tight"
    ),
    "malformed": Scenario([{"fault": "malformed"}, "succeeded with result"]),
    "unknown-state": Scenario("queued, manual_review, succeeded with result"),
    "no-result": Scenario("queued, succeeded"),
    "past-expiry": Scenario([{"state": "running", "expires_in": -60}, "succeeded with result"]),
    "hint-poll-after": Scenario(
        [{"state": "running", "poll_after_seconds": 1}, "succeeded with result"]
    ),
    "hint-next-check": Scenario(
        [{"state": "running", "next_check_in": 1.2}, "succeeded with result"]
    ),
    "hint-negative": Scenario(
        [
            {"state": "running", "poll_after_seconds": -5},
            {"state": "running", "next_check_in": -30},
            "succeeded with result",
        ]
    ),
    "hint-absurd": Scenario(
        [
            {"state": "running", "next_check_in": 30 * 86400},
            {"state": "running", "poll_after_seconds": 1e9},
            {"state": "running", "poll_after_seconds": 40},
            {"state": "running", "next_check_at": "next tuesday"},
            "succeeded with result",
        ]
    ),
    "redirect": Scenario(
        [{"status": 302, "redirect": "http://localhost:{port}/jobs/{id}"}, "succeeded with result"]
    ),
    "deadline": Scenario("running", deadline=2.5, budgets={"max_status_requests": 40}),
    "budget": Scenario("running", budgets={"max_status_requests": 3}),
}


@dataclass
class Run:
    ws: Workspace
    log: LoadedLog
    daemon_stopped_at: float
    base_url: str

    def op(self, name: str) -> Operation:
        return self.log.ops[name]

    def events(self, name: str, kind: type[E]) -> list[E]:
        return [e for _, e in self.log.events if e.operation_id == name and isinstance(e, kind)]

    def received(self, name: str) -> list[RequestRecord]:
        return self.ws.sim.requests(kind="status", job_id=name)

    def checked(self, name: str) -> tuple[Operation, list[RequestRecord]]:
        """The operation and what the provider received, after the provider-side invariant."""
        received = self.received(name)
        assert_provider_invariants(self.log, received, name)
        return self.op(name), received

    def stop(self, name: str) -> OperationStopped:
        [stopped] = self.events(name, OperationStopped)
        [raised] = self.events(name, EscalationRaised)
        assert raised.reason == stopped.reason  # every stop escalates (S26)
        return stopped


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, store: str) -> Iterator[Run]:
    tmp: Path = tmp_path_factory.mktemp(f"behaviours-{store}")
    with workspace(tmp, {name: s.steps for name, s in SCENARIOS.items()}, store=store) as ws:
        write_status_profile(ws, "sim", contract=CONTRACT, extra=QUOTA)
        write_status_profile(
            ws,
            "tight",
            contract=CONTRACT,
            extra=QUOTA,
            timeout_seconds=TIGHT_TIMEOUT,
            max_body_bytes=TIGHT_CAP,
        )
        daemon = ws.start_daemon()
        now = time.time()
        rids = []
        for name, s in SCENARIOS.items():
            fields = s.budgets.copy()
            if s.deadline is not None:
                fields["deadline_at"] = now + s.deadline
            rids.append(drop_registration(ws, name, name, provider=s.provider, **fields))
        spool = Spool(load_config(str(ws.config)).spool_dir)
        until(lambda: all(spool.read_receipt(r) for r in rids), what="every registration")
        receipts = [spool.read_receipt(r) for r in rids]
        assert all(r is not None and r.status == "registered" for r in receipts), receipts

        def ended() -> bool:
            ops = ws.log().ops
            return len(ops) == len(SCENARIOS) and all(o.phase != "live" for o in ops.values())

        until(ended, timeout=45, what="every scenario to end")
        time.sleep(QUIET)
        assert daemon.stop() == 0, daemon.output()
        yield Run(ws, ws.log(), time.time(), ws.sim.base_url)


def gaps(received: list[RequestRecord]) -> list[float]:
    return [b.wall - a.wall for a, b in itertools.pairwise(received)]


# -- protocol signals: Retry-After, 429 (S20, S21) ---------------------------------------------


def test_503_retry_after_seconds_is_honoured(run: Run) -> None:
    op, received = run.checked("ra-seconds")
    assert op.phase == "succeeded"
    assert (op.status_requests_used, op.transport_failures_used) == (2, 1)  # 5xx counts (S25)
    first, _ = run.events("ra-seconds", ResponseClassified)
    assert (first.http_status, first.http_outcome) == (503, "server_error")
    assert first.retry_after_at is not None
    [scheduled] = run.events("ra-seconds", PollScheduled)
    assert scheduled.delay_source == "provider_retry_after"
    assert scheduled.next_poll_at >= first.retry_after_at
    [r1, r2] = received
    assert (r1.status, r2.status) == (503, 200)
    assert r2.wall >= r1.wall + 1.0, "a request came before Retry-After: 1 expired"
    assert r2.wall >= first.retry_after_at


def test_503_retry_after_http_date_is_honoured(run: Run) -> None:
    op, received = run.checked("ra-date")
    assert op.phase == "succeeded"
    first, _ = run.events("ra-date", ResponseClassified)
    [response, _] = run.events("ra-date", StatusResponseReceived)
    assert response.headers.retry_after is not None
    assert response.headers.retry_after.endswith(" GMT")  # the HTTP-date form (RFC 9110 §5.6.7)
    [scheduled] = run.events("ra-date", PollScheduled)
    assert scheduled.delay_source == "provider_retry_after"
    [r1, r2] = received
    asked = math.ceil(r1.wall + 2)  # what the simulator put in the date, to the whole second
    assert first.retry_after_at == asked
    assert r2.wall >= asked, f"request 2 came {asked - r2.wall:.3f} s before the Retry-After date"


def test_retry_after_past_the_deadline_stops_without_polling_again(run: Run) -> None:
    op, received = run.checked("ra-past-deadline")
    stopped = run.stop("ra-past-deadline")
    assert (op.phase, op.stop_reason) == ("escalated", "retry_after_past_deadline")
    assert stopped.request_number == 1
    assert len(received) == 1
    assert run.events("ra-past-deadline", PollScheduled) == []


def test_429_with_retry_after_waits_for_it(run: Run) -> None:
    op, received = run.checked("429-retry-after")
    assert op.phase == "succeeded"
    assert (op.rate_limited_used, op.transport_failures_used) == (1, 0)  # S21: its own budget
    first, _ = run.events("429-retry-after", ResponseClassified)
    assert first.http_outcome == "rate_limited"
    [scheduled] = run.events("429-retry-after", PollScheduled)
    assert scheduled.delay_source == "provider_retry_after"
    [r1, r2] = received
    assert r1.status == 429
    assert first.retry_after_at is not None
    assert r2.wall >= r1.wall + 1.0
    assert r2.wall >= first.retry_after_at


def test_429_without_retry_after_waits_markedly_longer(run: Run) -> None:
    op, received = run.checked("429-bare")
    assert op.phase == "succeeded"
    assert op.rate_limited_used == 1
    [scheduled] = run.events("429-bare", PollScheduled)
    assert scheduled.delay_source == "local_backoff"
    assert scheduled.raw_delay == RATE_LIMITED_DELAY  # S21: the contract's 429 delay
    assert scheduled.delay >= RATE_LIMITED_DELAY / 2  # floored jitter (S6)
    [r1, r2] = received
    assert r2.wall - r1.wall >= RATE_LIMITED_DELAY / 2
    assert r2.wall - r1.wall >= BACKOFF_CAP  # longer than any ordinary poll interval


def test_persistent_429_stops_rate_limited_at_its_budget(run: Run) -> None:
    op, received = run.checked("429-storm")
    stopped = run.stop("429-storm")
    assert (op.phase, stopped.reason) == ("escalated", "rate_limited")
    assert (op.rate_limited_used, op.max_rate_limited, op.status_requests_used) == (2, 2, 2)
    assert len(received) == 2
    assert all(g >= RATE_LIMITED_DELAY / 2 for g in gaps(received))


# -- 404: eventual consistency vs not found (S23) -----------------------------------------------


def test_404_within_the_grace_window_is_polled_again(run: Run) -> None:
    op, received = run.checked("404-within-grace")
    assert op.phase == "succeeded"
    classified = run.events("404-within-grace", ResponseClassified)
    assert [c.http_outcome for c in classified] == ["not_found", "not_found", "ok"]
    assert all(c.at - op.started_at < GRACE for c in classified[:2])
    sources = [p.delay_source for p in run.events("404-within-grace", PollScheduled)]
    assert sources == ["local_backoff", "local_backoff"]
    assert [r.status for r in received] == [404, 404, 200]


def test_404_past_the_grace_window_stops_not_found(run: Run) -> None:
    op, received = run.checked("404-past-grace")
    stopped = run.stop("404-past-grace")
    assert (op.phase, stopped.reason) == ("escalated", "not_found")
    assert "'404-past-grace'" in stopped.detail  # the job id and the time (S23)
    classified = run.events("404-past-grace", ResponseClassified)
    assert all(c.http_outcome == "not_found" for c in classified)
    assert all(c.at - op.started_at < GRACE for c in classified[:-1])
    assert classified[-1].at - op.started_at >= GRACE
    assert stopped.request_number == len(classified) == len(received) >= 3
    assert received[-1].wall >= op.started_at + GRACE - 0.5  # polled through the window
    assert op.status_requests_used < op.max_status_requests  # the grace ended it, not budget


# -- 401/403: stop at once (S24) ------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_authorization_denied_stops_after_one_request(run: Run, status: int) -> None:
    name = str(status)
    op, received = run.checked(name)
    stopped = run.stop(name)
    assert (op.phase, stopped.reason) == ("escalated", "authorization_denied")
    [classified] = run.events(name, ResponseClassified)
    assert (classified.http_status, classified.http_outcome) == (status, "auth_denied")
    assert [r.status for r in received] == [status]  # never a second request
    assert run.daemon_stopped_at - stopped.at >= QUIET  # ... over a window that would show one
    assert run.events(name, PollScheduled) == []


# -- transport: 5xx, reset, slow, oversize (S10, S18, S25) --------------------------------------


def test_500_spends_the_transport_budget_then_delivery_ambiguous(run: Run) -> None:
    op, received = run.checked("500")
    stopped = run.stop("500")
    assert (op.phase, stopped.reason) == ("escalated", "delivery_ambiguous")
    assert (op.transport_failures_used, op.max_transport_failures) == (2, 2)
    assert [c.http_outcome for c in run.events("500", ResponseClassified)] == ["server_error"] * 2
    assert [r.status for r in received] == [500, 500]  # the budget, never more


def test_connection_reset_counts_and_is_observed_again(run: Run) -> None:
    op, received = run.checked("reset")
    assert op.phase == "succeeded"
    [failed] = run.events("reset", TransportFailed)
    assert (failed.kind, failed.request_number) == ("connection_reset", 1)
    assert (op.status_requests_used, op.transport_failures_used) == (2, 1)
    assert [(r.fault, r.status) for r in received] == [("reset", None), (None, 200)]


def test_slow_response_past_the_client_timeout_is_a_read_timeout(run: Run) -> None:
    op, received = run.checked("slow")
    assert op.phase == "succeeded"  # a timeout does not prove the job failed (S10)
    [failed] = run.events("slow", TransportFailed)
    assert failed.kind == "read_timeout"
    [intent, _] = run.events("slow", StatusRequestIntended)
    assert TIGHT_TIMEOUT <= failed.at - intent.at < 1.5  # gave up at the timeout, not the reply
    assert op.transport_failures_used == 1
    [r1, r2] = received
    assert r1.delay == 1.5
    assert r2.wall < r1.wall + r1.delay  # the next poll did not wait for the slow answer


@pytest.mark.parametrize("name", ["oversize", "oversize-chunked"])
def test_body_over_the_size_cap_is_an_integration_failure(run: Run, name: str) -> None:
    op, received = run.checked(name)
    stopped = run.stop(name)
    assert (op.phase, stopped.reason) == ("escalated", "integration_failure")
    [response] = run.events(name, StatusResponseReceived)
    assert response.body_truncated
    assert len(response.body) <= TIGHT_CAP  # never more than the cap kept
    [classified] = run.events(name, ResponseClassified)
    assert classified.job_state is None  # nothing read from a cut body
    assert len(received) == 1


# -- bodies and states (S3, S4, S14, S15) -------------------------------------------------


def test_malformed_json_stops_unparseable(run: Run) -> None:
    op, received = run.checked("malformed")
    stopped = run.stop("malformed")
    assert (op.phase, stopped.reason) == ("escalated", "unparseable_response")
    [classified] = run.events("malformed", ResponseClassified)
    assert (classified.http_outcome, classified.job_state) == ("ok", None)
    assert len(received) == 1


def test_unknown_state_stops_with_the_state_named(run: Run) -> None:
    op, received = run.checked("unknown-state")
    stopped = run.stop("unknown-state")
    assert (op.phase, stopped.reason) == ("escalated", "unknown_state")
    assert "'manual_review'" in stopped.detail
    assert op.last_state == "manual_review"
    [raised] = run.events("unknown-state", EscalationRaised)
    assert "manual_review" in raised.context.detail
    assert raised.context.last_state == "manual_review"
    outcomes = [
        (c.job_state, c.job_outcome) for c in run.events("unknown-state", ResponseClassified)
    ]
    assert outcomes == [("queued", "pending"), ("manual_review", "unknown")]
    assert [r.step_label for r in received] == ["queued", "manual_review"]  # never polled on


def test_success_without_the_result_reference_is_a_contradiction(run: Run) -> None:
    op, received = run.checked("no-result")
    stopped = run.stop("no-result")
    assert (op.phase, stopped.reason) == ("escalated", "contradiction")
    assert "result_url" in stopped.detail
    assert run.events("no-result", OperationSucceeded) == []
    assert op.results == {}
    [_, classified] = run.events("no-result", ResponseClassified)
    assert (classified.job_state, classified.job_outcome) == ("succeeded", "success")
    assert len(received) == 2


def test_running_past_its_own_expiry_is_a_contradiction(run: Run) -> None:
    op, received = run.checked("past-expiry")
    stopped = run.stop("past-expiry")
    assert (op.phase, stopped.reason) == ("escalated", "contradiction")
    assert "expiry" in stopped.detail
    assert stopped.last_state == "running"
    assert len(received) == 1


# -- provider hints (S8) ----------------------------------------------------------------------


def test_valid_poll_after_seconds_hint_is_honoured(run: Run) -> None:
    op, received = run.checked("hint-poll-after")
    assert op.phase == "succeeded"
    assert run.events("hint-poll-after", HintRejected) == []
    [scheduled] = run.events("hint-poll-after", PollScheduled)
    assert scheduled.delay_source == "provider_poll_hint"
    assert scheduled.raw_delay == pytest.approx(1.0)
    [r1, r2] = received
    assert r2.wall >= r1.wall + 1.0


def test_valid_next_check_at_hint_is_honoured(run: Run) -> None:
    op, received = run.checked("hint-next-check")
    assert op.phase == "succeeded"
    assert run.events("hint-next-check", HintRejected) == []
    [scheduled] = run.events("hint-next-check", PollScheduled)
    assert scheduled.delay_source == "provider_poll_hint"
    [response, _] = run.events("hint-next-check", StatusResponseReceived)
    hinted = parse_instant(_json(response.body)["next_check_at"])
    assert isinstance(hinted, float)
    assert scheduled.next_poll_at == pytest.approx(hinted)
    [r1, r2] = received
    assert hinted == pytest.approx(r1.wall + 1.2, abs=0.002)
    assert r2.wall >= hinted


def test_negative_and_past_hints_are_rejected_and_backoff_used(run: Run) -> None:
    op, received = run.checked("hint-negative")
    assert op.phase == "succeeded"
    rejected = [
        (h.request_number, h.hint, h.reason) for h in run.events("hint-negative", HintRejected)
    ]
    assert rejected == [(1, "poll_after_seconds", "negative"), (2, "next_check_at", "in the past")]
    sources = [p.delay_source for p in run.events("hint-negative", PollScheduled)]
    assert sources == ["local_backoff", "local_backoff"]
    assert len(received) == 3
    assert all(g < 2 * BACKOFF_CAP + 1.0 for g in gaps(received))  # no hint-driven wait


def test_absurd_and_unparseable_hints_are_rejected_and_backoff_used(run: Run) -> None:
    op, received = run.checked("hint-absurd")
    assert op.phase == "succeeded"
    rejected = [
        (h.request_number, h.hint, h.reason) for h in run.events("hint-absurd", HintRejected)
    ]
    assert [r[:2] for r in rejected] == [
        (1, "next_check_at"),
        (2, "poll_after_seconds"),
        (3, "poll_after_seconds"),
        (4, "next_check_at"),
    ]
    assert "horizon" in rejected[0][2]
    assert "horizon" in rejected[1][2]
    assert "deadline" in rejected[2][2]  # 40 s: inside the horizon, past the 20 s deadline
    assert rejected[3][2]  # unparseable: a reason is given
    sources = {p.delay_source for p in run.events("hint-absurd", PollScheduled)}
    assert sources == {"local_backoff"}
    assert len(received) == 5
    assert all(g < 2 * BACKOFF_CAP + 1.0 for g in gaps(received))


# -- redirects: the credential stays at its origin -------------------------------------------


def test_redirect_to_another_origin_is_not_followed(run: Run) -> None:
    op, received = run.checked("redirect")
    stopped = run.stop("redirect")
    assert (op.phase, stopped.reason) == ("escalated", "integration_failure")
    [response] = run.events("redirect", StatusResponseReceived)
    assert response.headers.location is not None
    assert response.headers.location.startswith("http://localhost:")
    [classified] = run.events("redirect", ResponseClassified)
    assert (classified.http_status, classified.http_outcome) == (302, "redirect")
    [only] = received
    host = run.base_url.removeprefix("http://")
    assert only.header("Host") == host
    assert only.header("Authorization") == "<redacted>"  # the credential went to its own origin
    for record in run.ws.sim.requests():
        assert not (record.header("Host") or "").startswith("localhost"), (
            "a request reached the other origin"
        )


# -- deadline and budget (S9, S13, S16, S17) ---------------------------------------------------


def test_deadline_stops_running_and_no_request_after_it(run: Run) -> None:
    op, received = run.checked("deadline")
    stopped = run.stop("deadline")
    assert (op.phase, stopped.reason) == ("escalated", "deadline_exceeded")
    assert stopped.last_state == "running"
    assert stopped.at >= op.deadline_at
    assert received
    assert all(r.wall < op.deadline_at for r in received)
    assert op.status_requests_used < op.max_status_requests


def test_budget_exhausted_after_exactly_the_budget(run: Run) -> None:
    op, received = run.checked("budget")
    stopped = run.stop("budget")
    assert (op.phase, stopped.reason) == ("escalated", "request_budget_exhausted")
    assert stopped.request_number == 3  # stopped on the last answer, no wake-up for nothing
    assert len(received) == op.status_requests_used == op.max_status_requests == 3


def test_no_request_after_the_deadline_while_waiting_for_an_in_flight_slot(
    tmp_path: Path, store: str
) -> None:
    """S33: the provider's slot is held only for the request. While it is taken, as many
    intents as it has slots (here one) are made durable ahead of it, never more; one that
    waited for the slot past its deadline is not sent."""
    jobs: dict[str, str | list[object]] = {
        "hog": [{"delay": 2.0, "state": "running"}, "succeeded with result"],
        "late": "running",
        "next": "running",
    }
    with workspace(tmp_path, jobs, store=store) as ws:
        one_slot = "[quota]\nrequests_per_second = 1000\nburst = 1000\nmax_in_flight = 1\n"
        write_status_profile(ws, "sim", contract=CONTRACT, extra=one_slot, timeout_seconds=3)
        daemon = ws.start_daemon()
        now = time.time()
        drop_registration(ws, "hog", "hog")  # first poll at +0.2 s holds the slot for 2 s
        drop_registration(ws, "late", "late", deadline_at=now + 1.0)  # due at +0.2 s too
        drop_registration(ws, "next", "next", deadline_at=now + 1.5)

        def ended() -> bool:
            ops = ws.log().ops
            return len(ops) == 3 and all(o.phase != "live" for o in ops.values())

        until(ended, timeout=20, what="the three operations to end")
        assert daemon.stop() == 0
        log = ws.log()
        for name in ("late", "next"):
            op = log.ops[name]
            intents = [
                e
                for _, e in log.events
                if e.operation_id == name and isinstance(e, StatusRequestIntended)
            ]
            assert op.stop_reason == "deadline_exceeded"
            assert all(i.at < op.deadline_at for i in intents)
            received = ws.sim.requests(kind="status", job_id=name)
            after = [r.wall - op.deadline_at for r in received if r.wall > op.deadline_at]
            assert not after, f"{name}: requests arrived {after} s after the deadline"
        order = [(e.operation_id, type(e)) for _, e in log.events]
        sent = order.index(("hog", StatusRequestIntended))
        answered = order.index(("hog", StatusResponseReceived))
        ahead = [op for op, kind in order[sent:answered] if kind is StatusRequestIntended]
        assert ahead[0] == "hog"
        assert len(ahead) == 2, ahead  # one intent made durable ahead of the slot, not two


# -- the whole run ------------------------------------------------------------------------------


def test_every_scenario_registered_once_and_the_log_checks(run: Run) -> None:
    registered = run.events
    for name in SCENARIOS:
        assert len(registered(name, OperationRegistered)) == 1
    assert set(run.log.ops) == set(SCENARIOS)
    check = run.ws.bide("replay", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 mismatch" in check.stdout
    assert_log_verifies(run.ws)


def test_the_invariant_check_catches_what_it_claims_to() -> None:
    """The provider-side check fails on an uncovered, an early, a late or a duplicate request."""

    def intent(seq: int, n: int, at: float) -> tuple[int, Event]:
        return seq, StatusRequestIntended(
            operation_id="x", at=at, request_number=n, deadline_at=100.0, max_status_requests=5
        )

    def record(seq: int, wall: float) -> RequestRecord:
        return RequestRecord(
            seq=seq,
            wall=wall,
            monotonic=wall,
            method="GET",
            target="/jobs/x",
            headers=[],
            kind="status",
            job_id="x",
        )

    scheduled = PollScheduled(
        operation_id="x",
        at=10.5,
        next_poll_at=20.0,
        delay_source="local_backoff",
        raw_delay=9.5,
        delay=9.5,
    )
    log = LoadedLog(
        events=[intent(1, 1, 10.0), (2, scheduled), intent(3, 2, 20.0)], ops={}, head_seq=3
    )
    assert_provider_invariants(log, [record(1, 10.1), record(2, 20.1)], "x")
    bad = {
        "invisible extra request": [record(1, 10.1), record(2, 10.2)],
        "request before its intent": [record(1, 9.9)],
        "request after the deadline": [record(1, 10.1), record(2, 100.5)],
        "more requests than intents": [record(1, 10.1), record(2, 20.1), record(3, 20.2)],
        "a request lost (strict)": [record(1, 10.1)],
    }
    for what, received in bad.items():
        try:
            assert_provider_invariants(log, received, "x")
        except AssertionError:
            continue
        pytest.fail(f"not caught: {what}")
    early = LoadedLog(
        events=[intent(1, 1, 10.0), (2, scheduled), intent(3, 2, 15.0)], ops={}, head_seq=3
    )
    with pytest.raises(AssertionError, match="before the time bide had scheduled"):
        assert_provider_invariants(early, [record(1, 10.1), record(2, 15.1)], "x")
    assert_provider_invariants(log, [record(1, 10.1)], "x", strict=False)  # an intent that died


def _json(body: bytes) -> dict[str, object]:
    import json

    doc = json.loads(body)
    assert isinstance(doc, dict)
    return doc
