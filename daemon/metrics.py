"""Prometheus text exposition, hand-written: counters fed from the events as they are recorded.

Served on a configurable local address (``[metrics] listen``), off by default. Every label
value comes from a closed set in the model (outcomes, reasons, delay sources) or is a provider
name: nothing from a response body, no job id, no credential.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import anyio
import anyio.abc

from daemon.accepting import accepted
from replay.events import (
    EscalationRaised,
    Event,
    PollScheduled,
    RequestOutcomeUnknown,
    ResponseClassified,
    TransportFailed,
)
from replay.state import Operation

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (None when empty)."""
        if not self.count:
            return None
        target = q * self.count
        seen = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            seen += n
            if seen >= target:
                return bound
        return float("inf")

    def render(self, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        seen = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            seen += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {seen}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return lines


class Metrics:
    def __init__(self) -> None:
        self.responses: Counter[tuple[str, str]] = Counter()  # (provider, http outcome)
        self.transport: Counter[tuple[str, str]] = Counter()  # (provider, kind)
        self.escalations: Counter[str] = Counter()
        self.delay_sources: Counter[str] = Counter()
        self.wakeup_lateness = Histogram()
        self.append_latency = Histogram()
        self.requests_sent = 0
        self.log_alarm = 0
        self.log_append_retries = 0
        self.internal_errors = 0
        self.spool_pruned = 0
        self.operations_retired = 0  # ended operations let go of ([retention])
        self.api_rejections: Counter[str] = Counter()  # API refusals by reason
        self.api_requests = 0
        self.api_waiters = 0

    def observe(self, ev: Event, provider: str) -> None:
        if isinstance(ev, ResponseClassified):
            self.responses[(provider, ev.http_outcome)] += 1
        elif isinstance(ev, TransportFailed):
            self.transport[(provider, ev.kind)] += 1
        elif isinstance(ev, RequestOutcomeUnknown):
            self.transport[(provider, "outcome_unknown")] += 1
        elif isinstance(ev, EscalationRaised):
            self.escalations[ev.reason] += 1
        elif isinstance(ev, PollScheduled):
            self.delay_sources[ev.delay_source] += 1

    def render(self, ops: Mapping[str, Operation], log_dir: Path, log_flushes: int = 0) -> str:
        phases = Counter(op.phase for op in ops.values())
        out = ["# HELP bide_operations Operations by phase.", "# TYPE bide_operations gauge"]
        out += [
            f'bide_operations{{phase="{p}"}} {phases.get(p, 0)}'
            for p in ("live", "succeeded", "escalated", "closed")
        ]
        out += [
            "# HELP bide_status_requests_sent_total Status requests sent.",
            "# TYPE bide_status_requests_sent_total counter",
            f"bide_status_requests_sent_total {self.requests_sent}",
        ]
        out += [
            "# HELP bide_status_responses_total Status responses by HTTP outcome.",
            "# TYPE bide_status_responses_total counter",
        ]
        out += [
            f'bide_status_responses_total{{provider="{p}",outcome="{o}"}} {n}'
            for (p, o), n in sorted(self.responses.items())
        ]
        out += [
            "# HELP bide_transport_failures_total Status requests with no HTTP response.",
            "# TYPE bide_transport_failures_total counter",
        ]
        out += [
            f'bide_transport_failures_total{{provider="{p}",kind="{k}"}} {n}'
            for (p, k), n in sorted(self.transport.items())
        ]
        out += [
            "# HELP bide_escalations_total Escalations raised by reason.",
            "# TYPE bide_escalations_total counter",
        ]
        out += [
            f'bide_escalations_total{{reason="{r}"}} {n}'
            for r, n in sorted(self.escalations.items())
        ]
        out += [
            "# HELP bide_polls_scheduled_total Scheduled polls by delay source.",
            "# TYPE bide_polls_scheduled_total counter",
        ]
        out += [
            f'bide_polls_scheduled_total{{source="{s}"}} {n}'
            for s, n in sorted(self.delay_sources.items())
        ]
        out += self.wakeup_lateness.render(
            "bide_wakeup_lateness_seconds", "Actual minus scheduled wake-up time."
        )
        out += self.append_latency.render(
            "bide_log_append_seconds", "Time until an append was durable."
        )
        size = sum(p.stat().st_size for p in log_dir.glob("seg-*.jsonl"))
        out += [
            "# HELP bide_log_bytes Size of the event log's segments.",
            "# TYPE bide_log_bytes gauge",
            f"bide_log_bytes {size}",
            "# HELP bide_log_flushes_total Durable write rounds (one fdatasync each).",
            "# TYPE bide_log_flushes_total counter",
            f"bide_log_flushes_total {log_flushes}",
            "# HELP bide_log_append_failing 1 while appends to the log fail (disk full, ...).",
            "# TYPE bide_log_append_failing gauge",
            f"bide_log_append_failing {self.log_alarm}",
            "# HELP bide_spool_pruned_total Old receipts and refused files removed.",
            "# TYPE bide_spool_pruned_total counter",
            f"bide_spool_pruned_total {self.spool_pruned}",
            "# HELP bide_operations_retired_total Ended operations retired from memory "
            "([retention]); their events stay in the log.",
            "# TYPE bide_operations_retired_total counter",
            f"bide_operations_retired_total {self.operations_retired}",
            "# HELP bide_internal_errors_total Exceptions contained by the barrier (bugs).",
            "# TYPE bide_internal_errors_total counter",
            f"bide_internal_errors_total {self.internal_errors}",
            "# HELP bide_log_append_retries_total Failed append attempts retried.",
            "# TYPE bide_log_append_retries_total counter",
            f"bide_log_append_retries_total {self.log_append_retries}",
            "# HELP bide_api_requests_total Local API requests answered.",
            "# TYPE bide_api_requests_total counter",
            f"bide_api_requests_total {self.api_requests}",
            "# HELP bide_api_waiters Local API callers waiting on an operation now.",
            "# TYPE bide_api_waiters gauge",
            f"bide_api_waiters {self.api_waiters}",
            "# HELP bide_api_rejections_total Local API requests refused, by reason.",
            "# TYPE bide_api_rejections_total counter",
        ]
        out += [
            f'bide_api_rejections_total{{reason="{r}"}} {n}'
            for r, n in sorted(self.api_rejections.items())
        ]
        return "\n".join(out) + "\n"


#: Scrapes served at once; more connections are closed at once (a scraper needs one).
MAX_CONNECTIONS = 16


async def serve_metrics(
    host: str,
    port: int,
    render: Callable[[], str],
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer ``GET /metrics`` on ``host:port``; anything else is 404.

    Bounded so that no client can take the daemon down: at most :data:`MAX_CONNECTIONS`
    at once (more are closed as they arrive), 5 s to send a request and 5 s to take the
    answer, and an ``accept`` that fails for want of file descriptors (EMFILE, ENFILE) backs
    off and tries again instead of ending the listener and, with it, the daemon.
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    open_connections = 0

    async def handle(stream: anyio.abc.SocketStream) -> None:
        nonlocal open_connections
        try:
            async with stream:
                data = b""
                with anyio.move_on_after(5):
                    while b"\r\n\r\n" not in data and len(data) < 8192:
                        try:
                            data += await stream.receive(4096)
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            return
                line = data.split(b"\r\n", 1)[0].split()
                if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
                    body, status = render().encode(), b"200 OK"
                else:
                    body, status = b"not found; try /metrics\n", b"404 Not Found"
                head = b"".join(
                    (
                        b"HTTP/1.1 ",
                        status,
                        b"\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
                        str(len(body)).encode(),
                        b"\r\nConnection: close\r\n\r\n",
                    )
                )
                with anyio.move_on_after(5):
                    await stream.send(head + body)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        finally:
            open_connections -= 1

    async def accept(
        inner: anyio.abc.Listener[anyio.abc.SocketStream], connections: anyio.abc.TaskGroup
    ) -> None:
        nonlocal open_connections
        assert isinstance(inner, anyio.abc.SocketListener)
        async for stream in accepted(inner, "metrics"):
            if open_connections >= MAX_CONNECTIONS:
                await stream.aclose()
                continue
            open_connections += 1
            connections.start_soon(handle, stream)

    async with listener, anyio.create_task_group() as connections:
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        for inner in listener.listeners:
            connections.start_soon(accept, inner, connections)
