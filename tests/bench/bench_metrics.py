"""The metrics, hand-written against ``prometheus_client``: on the hot path and per scrape.

Issue 37 asks whether ``/metrics`` should go through ``prometheus_client``. Measured here,
in one process, as ratios against bide's hand-written code (the baseline, 1.00):

* **per event** (the hot path: every recorded event passes :meth:`Metrics.observe`): a mix of
  responses, transport failures, scheduled polls and escalations counted by labels, against
  the same counts in ``prometheus_client`` ``Counter(...).labels(...).inc()``;
* **per scrape** with N operations in memory: the whole page (:meth:`Metrics.render` with the
  scrape-time gauges and the ``process_*`` series) against ``generate_latest`` of a registry
  holding the same counters, a custom collector for the same operation gauges and its
  ``ProcessCollector``;
* **the process series alone**: :func:`daemon.metrics.read_process` against
  ``ProcessCollector().collect()``.

``prometheus_client`` is not a dependency of bide: install it into the venv to compare
(``pip install prometheus_client``); without it only the baseline figures are printed.

    python -m tests.bench.bench_metrics [--events N] [--operations 10000,100000]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from daemon.metrics import Metrics, Scrape, read_process
from replay.events import (
    EscalationRaised,
    Event,
    PollScheduled,
    ResponseClassified,
    TransportFailed,
)
from replay.state import OpenEscalation, Operation
from tests.replay.helpers import Daemon, body

T0 = 1_700_000_000.0
NO_LOG = Path("/nonexistent-bide-bench")  # no segments: the page's size gauge reads 0


def events(n: int) -> list[tuple[Event, str]]:
    """A mix like a busy daemon's: mostly responses and scheduled polls."""
    providers = ("github", "openai", "replicate")
    escalation = _escalation()
    out: list[tuple[Event, str]] = []
    for i in range(n):
        p = providers[i % 3]
        op = f"op-{i % 1000}"
        kind = i % 10
        ev: Event
        if kind < 4:
            ev = ResponseClassified(
                operation_id=op,
                at=T0,
                request_number=1,
                http_status=200,
                http_outcome="rate_limited" if kind == 3 else "ok",
            )
        elif kind < 8:
            ev = PollScheduled(
                operation_id=op,
                at=T0,
                next_poll_at=T0 + 5,
                delay_source="local_quota" if kind == 7 else "local_backoff",
                raw_delay=5.0,
                delay=5.0,
            )
        elif kind == 8:
            ev = TransportFailed(operation_id=op, at=T0, request_number=1, kind="connect_timeout")
        else:
            ev = escalation
        out.append((ev, p))
    return out


def _escalation() -> EscalationRaised:
    """A real one: an operation that meets a state nobody has seen."""
    d = Daemon.start()
    at = d.op.next_poll_at
    d.poll(at)
    raised = [
        e for e in d.respond(at, content=body("manual_review")) if isinstance(e, EscalationRaised)
    ]
    assert raised, "the unknown state escalates"
    return raised[0]


def operations(n: int) -> dict[str, Operation]:
    """``n`` operations: 90% live, 10% escalated with an open escalation."""
    template = Daemon.start().op
    ops = {}
    for i in range(n):
        op_id = f"op-{i}"
        if i % 10 == 9:
            ops[op_id] = msgspec.structs.replace(
                template,
                operation_id=op_id,
                phase="escalated",
                escalation=OpenEscalation(
                    escalation_id=1, reason="unknown_state", options=(), raised_at=T0 + i
                ),
            )
        else:
            ops[op_id] = msgspec.structs.replace(template, operation_id=op_id)
    return ops


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def hand_written_observe(stream: list[tuple[Event, str]]) -> Callable[[], object]:
    def run() -> object:
        m = Metrics()
        for ev, provider in stream:
            m.observe(ev, provider)
        return m

    return run


def prometheus_client() -> Any | None:
    """The module, or None where it is not installed (it is no dependency of bide's, so
    its names are Any here: the type check passes with or without it)."""
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        return None


def client_observe(pc: Any, stream: list[tuple[Event, str]]) -> Callable[[], object]:
    """The same counts through ``prometheus_client`` (a fresh registry per run)."""

    def run() -> object:
        reg = pc.CollectorRegistry()
        responses = pc.Counter("bide_status_responses", "", ["provider", "outcome"], registry=reg)
        transport = pc.Counter("bide_transport_failures", "", ["provider", "kind"], registry=reg)
        escalations = pc.Counter("bide_escalations", "", ["reason"], registry=reg)
        sources = pc.Counter("bide_polls_scheduled", "", ["source"], registry=reg)
        for ev, provider in stream:
            if isinstance(ev, ResponseClassified):
                responses.labels(provider, ev.http_outcome).inc()
            elif isinstance(ev, TransportFailed):
                transport.labels(provider, ev.kind).inc()
            elif isinstance(ev, EscalationRaised):
                escalations.labels(ev.reason).inc()
            elif isinstance(ev, PollScheduled):
                sources.labels(ev.delay_source).inc()
        return reg

    return run


def client_registry(pc: Any, ops: Mapping[str, Operation], stream: list[tuple[Event, str]]) -> Any:
    """A registry with the same families the page has: counters fed, the operation gauges
    from a custom collector computed at collect time, and the process collector."""
    gauge_family = importlib.import_module("prometheus_client.core").GaugeMetricFamily
    reg = pc.CollectorRegistry()
    responses = pc.Counter("bide_status_responses", "", ["provider", "outcome"], registry=reg)
    for ev, provider in stream:
        if isinstance(ev, ResponseClassified):
            responses.labels(provider, ev.http_outcome).inc()
    pc.Histogram("bide_wakeup_lateness_seconds", "", registry=reg)
    pc.Histogram("bide_log_append_seconds", "", registry=reg)
    pc.ProcessCollector(registry=reg)

    class Operations:
        def collect(self) -> Iterable[Any]:
            now = time.time()
            phases: Counter[str] = Counter()
            oldest: float | None = None
            open_escalations = overdue = 0
            for op in ops.values():  # the same work as Metrics.render
                phases[op.phase] += 1
                if op.escalation is not None:
                    open_escalations += 1
                    if oldest is None or op.escalation.raised_at < oldest:
                        oldest = op.escalation.raised_at
                elif op.phase == "live":
                    business = op.business_deadline_at
                    if op.deadline_at < now or (business is not None and business < now):
                        overdue += 1
            g = gauge_family("bide_operations", "Operations by phase.", labels=["phase"])
            for phase in ("live", "succeeded", "escalated", "closed"):
                g.add_metric([phase], phases.get(phase, 0))
            yield g
            yield gauge_family("bide_escalations_open", "", value=open_escalations)
            yield gauge_family("bide_operations_overdue", "", value=overdue)
            yield gauge_family(
                "bide_escalation_oldest_age_seconds",
                "",
                value=0.0 if oldest is None else now - oldest,
            )

    reg.register(Operations())
    return reg


def run(n_events: int, sizes: list[int]) -> dict[str, object]:
    stream = events(n_events)
    results: dict[str, object] = {"events": n_events}
    ours = best_of(hand_written_observe(stream))
    results["observe_ns_per_event"] = round(ours / n_events * 1e9)
    pc = prometheus_client()
    if pc is None:
        results["prometheus_client"] = "not installed: only the baseline"
    else:
        results["prometheus_client"] = importlib.metadata.version("prometheus_client")
        theirs = best_of(client_observe(pc, stream))
        results["client_observe_ns_per_event"] = round(theirs / n_events * 1e9)
        results["observe_ratio"] = round(theirs / ours, 2)
        collector = pc.ProcessCollector(registry=None)
        ours_proc = best_of(lambda: [read_process() for _ in range(200)])
        theirs_proc = best_of(lambda: [list(collector.collect()) for _ in range(200)])
        results["process_us"] = round(ours_proc / 200 * 1e6, 1)
        results["client_process_us"] = round(theirs_proc / 200 * 1e6, 1)
        results["process_ratio"] = round(theirs_proc / ours_proc, 2)
    for size in sizes:
        ops = operations(size)
        metrics = hand_written_observe(stream)()
        assert isinstance(metrics, Metrics)

        def page(m: Metrics = metrics, o: Mapping[str, Operation] = ops) -> str:
            return m.render(o, NO_LOG, 0, Scrape(now=time.time()))

        ours_page = best_of(page)
        results[f"scrape_ms_{size}"] = round(ours_page * 1e3, 2)
        if pc is not None:
            reg = client_registry(pc, ops, stream)
            theirs_page = best_of(functools.partial(pc.generate_latest, reg))
            results[f"client_scrape_ms_{size}"] = round(theirs_page * 1e3, 2)
            results[f"scrape_ratio_{size}"] = round(theirs_page / ours_page, 2)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_metrics", description=__doc__)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--operations", default="10000,100000")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.operations.split(",") if s]
    print(json.dumps(run(args.events, sizes), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
