"""Prometheus text exposition, hand-written: counters fed from the events as they are recorded.

Served on a configurable local address (``[metrics] listen``), off by default. Every label
value comes from a closed set in the model (outcomes, reasons, delay sources) or is a provider
name: nothing from a response body, no job id, no credential.

Besides the counters, a scrape carries what every exporter has (the ``process_*`` series read
from ``/proc`` as ``prometheus_client`` reads them, and ``bide_build_info``) and gauges
computed at scrape time from what the daemon already holds (:class:`Scrape`): open
escalations and the oldest one's age, live operations past their deadline, the last signed
checkpoint, the spool's backlog, the witnesses failing, whether this node is the active one.
``deploy/prometheus/bide-alerts.yml`` and ``deploy/grafana/bide-dashboard.json`` are written
against these names (``tests/e2e/test_metrics_exposition.py`` checks every name they use is
exported).

Why not ``prometheus_client``: a new dependency, and 3-4x the cost per counted event on the
path every recorded event takes (a lock and a label lookup per increment), for about a hundred
lines here; a scrape costs the same either way (``tests/bench/bench_metrics.py``, figures in
``tests/bench/RESULTS.md``).
"""

from __future__ import annotations

import bisect
import os
import platform
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from daemon import __version__
from daemon.accepting import accepted
from eventlog.heads import Head
from replay.events import (
    EscalationRaised,
    Event,
    PollScheduled,
    RequestOutcomeUnknown,
    ResponseClassified,
    TransportFailed,
)
from replay.state import Operation

#: A live operation whose deadline comes within this many seconds counts as near it (an alert
#: on jobs that are still running when they should have ended).
NEAR_DEADLINE_SECONDS = 900

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


@dataclass(frozen=True)
class ProcessSample:
    """The standard ``process_*`` figures of one process."""

    cpu_seconds: float
    resident_bytes: int
    virtual_bytes: int
    open_fds: int
    max_fds: int | None
    start_time: float


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096
_boot_time: float | None = None


def _boot(proc: str) -> float:
    """The host's boot time (``btime`` in /proc/stat), read once: it does not change."""
    global _boot_time
    if _boot_time is None:
        with open(f"{proc}/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    _boot_time = float(line.split()[1])
                    break
            else:
                raise OSError(f"no btime in {proc}/stat")
    return _boot_time


def read_process(proc: str = "/proc", pid: str = "self") -> ProcessSample | None:
    """Read ``/proc/PID/stat``, ``/fd`` and ``/limits`` the way ``prometheus_client``'s
    ``ProcessCollector`` does; None where there is no /proc (the series are then left out,
    as that collector leaves them out)."""
    base = f"{proc}/{pid}"
    try:
        with open(f"{base}/stat", "rb") as f:
            stat = f.read()
        # The command name is in parentheses and may hold spaces: the fields follow the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        max_fds: int | None = None
        with open(f"{base}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    max_fds = None if soft == "unlimited" else int(soft)
                    break
        return ProcessSample(
            cpu_seconds=(int(fields[11]) + int(fields[12])) / _TICKS,
            resident_bytes=int(fields[21]) * _PAGE,
            virtual_bytes=int(fields[20]),
            open_fds=len(os.listdir(f"{base}/fd")),
            max_fds=max_fds,
            start_time=_boot(proc) + int(fields[19]) / _TICKS,
        )
    except (OSError, ValueError, IndexError):
        return None


def render_process(sample: ProcessSample | None) -> list[str]:
    if sample is None:
        return []
    out: list[str] = []
    for name, kind, help_, value in (
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            f"{sample.cpu_seconds:.2f}",
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            str(sample.resident_bytes),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            str(sample.virtual_bytes),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            f"{sample.start_time:.2f}",
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors.", str(sample.open_fds)),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            None if sample.max_fds is None else str(sample.max_fds),
        ),
    ):
        if value is not None:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return out


def _label(value: str) -> str:
    """A label value escaped as the text format asks (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


BUILD_INFO = (
    "# HELP bide_build_info The bide version and the Python running it; always 1.",
    "# TYPE bide_build_info gauge",
    f'bide_build_info{{version="{_label(__version__)}",'
    f'python="{_label(platform.python_version())}",'
    f'implementation="{_label(platform.python_implementation())}"}} 1',
)


def node_active(active: bool) -> list[str]:
    return [
        "# HELP bide_node_active 1 while this node may send requests (on PostgreSQL: while it "
        "holds the lease); a standby serves 0.",
        "# TYPE bide_node_active gauge",
        f"bide_node_active {int(active)}",
    ]


@dataclass(frozen=True)
class Scrape:
    """What the daemon knows at scrape time besides the operations: cheap to gather.

    Attributes:
        now: The wall clock (the ages and the deadlines are measured against it).
        active: This node sends requests (always, on segment files; holding the lease, on
            PostgreSQL).
        checkpoint_interval: ``[log] checkpoint_interval_seconds``: the alert's yardstick.
        spool_waiting: Files waiting in each spool directory (``incoming``, ``decisions``).
        witness_targets: Witnesses configured (a file, syslog, URLs).
        witness_failing: Those whose last delivery failed or that refused our heads.
    """

    now: float
    active: bool = True
    checkpoint_interval: float = 60.0
    spool_waiting: Mapping[str, int] = field(default_factory=dict)
    witness_targets: int = 0
    witness_failing: int = 0


def spool_backlog(directory: Path) -> int:
    """Files waiting in a spool directory (the half-written ``.``-files left out)."""
    try:
        with os.scandir(directory) as entries:
            return sum(1 for e in entries if e.name.endswith(".json") and e.name[0] != ".")
    except OSError:
        return 0


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
        #: (time, sequence) of the last signed checkpoint made durable; None before the first.
        self.last_checkpoint: tuple[float, int] | None = None

    def checkpoint_signed(self, head: Head) -> None:
        """A :class:`~eventlog.heads.HeadStore` listener (called from the log's writer thread:
        one tuple stored, which a scrape reads whole)."""
        self.last_checkpoint = (head.t_us / 1e6, head.seq)

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

    def render(
        self,
        ops: Mapping[str, Operation],
        log_dir: Path,
        log_flushes: int = 0,
        scrape: Scrape | None = None,
    ) -> str:
        """The whole page; ``scrape`` adds the gauges computed now (the ``process_*`` series
        are read from /proc here)."""
        phases: Counter[str] = Counter()
        open_escalations = overdue = near = 0
        oldest_raised: float | None = None
        now = scrape.now if scrape is not None else None
        for op in ops.values():
            phases[op.phase] += 1
            if op.escalation is not None:
                open_escalations += 1
                raised = op.escalation.raised_at
                if oldest_raised is None or raised < oldest_raised:
                    oldest_raised = raised
            elif now is not None and op.phase == "live":
                # The earlier of the two deadlines (Operation.effective_deadline, inlined:
                # this loop runs over every operation at every scrape).
                business = op.business_deadline_at
                ends = op.deadline_at if business is None else min(op.deadline_at, business)
                if ends < now:
                    overdue += 1
                elif ends < now + NEAR_DEADLINE_SECONDS:
                    near += 1
        out = ["# HELP bide_operations Operations by phase.", "# TYPE bide_operations gauge"]
        out += [
            f'bide_operations{{phase="{p}"}} {phases.get(p, 0)}'
            for p in ("live", "succeeded", "escalated", "closed")
        ]
        if scrape is not None:
            out += self._render_scrape(scrape, open_escalations, oldest_raised, overdue, near)
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

    def _render_scrape(
        self,
        scrape: Scrape,
        open_escalations: int,
        oldest_raised: float | None,
        overdue: int,
        near: int,
    ) -> list[str]:
        oldest = 0.0 if oldest_raised is None else max(0.0, scrape.now - oldest_raised)
        out = [
            *BUILD_INFO,
            *render_process(read_process()),
            *node_active(scrape.active),
            "# HELP bide_escalations_open Escalations waiting for a human decision.",
            "# TYPE bide_escalations_open gauge",
            f"bide_escalations_open {open_escalations}",
            "# HELP bide_escalation_oldest_age_seconds How long the oldest open escalation "
            "has waited (0: none open).",
            "# TYPE bide_escalation_oldest_age_seconds gauge",
            f"bide_escalation_oldest_age_seconds {oldest:.3f}",
            "# HELP bide_operations_overdue Live operations past their deadline (a poll "
            "should have stopped them).",
            "# TYPE bide_operations_overdue gauge",
            f"bide_operations_overdue {overdue}",
            "# HELP bide_operations_near_deadline Live operations whose deadline (or business "
            f"deadline) comes within {NEAR_DEADLINE_SECONDS} s: jobs still not ended that will "
            "escalate soon.",
            "# TYPE bide_operations_near_deadline gauge",
            f"bide_operations_near_deadline {near}",
            "# HELP bide_log_checkpoint_interval_seconds The longest a running daemon goes "
            "without a signed checkpoint ([log] checkpoint_interval_seconds).",
            "# TYPE bide_log_checkpoint_interval_seconds gauge",
            f"bide_log_checkpoint_interval_seconds {scrape.checkpoint_interval:g}",
        ]
        if self.last_checkpoint is not None:
            at, seq = self.last_checkpoint
            out += [
                "# HELP bide_log_last_checkpoint_timestamp_seconds When the last signed "
                "checkpoint was made durable (unix time).",
                "# TYPE bide_log_last_checkpoint_timestamp_seconds gauge",
                f"bide_log_last_checkpoint_timestamp_seconds {at:.3f}",
                "# HELP bide_log_last_checkpoint_seq The sequence number of that checkpoint.",
                "# TYPE bide_log_last_checkpoint_seq gauge",
                f"bide_log_last_checkpoint_seq {seq}",
            ]
        out += [
            "# HELP bide_spool_waiting Files waiting in a spool directory.",
            "# TYPE bide_spool_waiting gauge",
        ]
        out += [
            f'bide_spool_waiting{{dir="{d}"}} {scrape.spool_waiting.get(d, 0)}'
            for d in ("incoming", "decisions")
        ]
        out += [
            "# HELP bide_witness_targets Witnesses the signed heads are published to.",
            "# TYPE bide_witness_targets gauge",
            f"bide_witness_targets {scrape.witness_targets}",
            "# HELP bide_witness_failing Witnesses whose last delivery failed or that refuse "
            "our heads (they stay queued on disk).",
            "# TYPE bide_witness_failing gauge",
            f"bide_witness_failing {scrape.witness_failing}",
        ]
        return out


def standby_page(lease_lines: Iterable[str]) -> str:
    """The page a standby serves: who it is, that it is not active, its lease's view."""
    out = [
        *BUILD_INFO,
        *render_process(read_process()),
        *node_active(False),
        *lease_lines,
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
