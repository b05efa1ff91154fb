"""The real daemon's ``/metrics`` is a strict Prometheus text page, and every metric that
``deploy/prometheus/bide-alerts.yml`` and ``deploy/grafana/bide-dashboard.json`` use is on it
(issue 37).

``bide run`` with ``[metrics] listen`` on 127.0.0.1 against the simulator, in both stores: a
job that succeeds after a connection reset, one that stops on a state nobody has seen (an
escalation left open). The page must parse (every sample under a declared family, no series
twice, valid labels and values; and ``promtool check metrics`` where promtool is installed),
carry the standard ``process_*`` series and ``bide_build_info``, and say what an operator's
alerts read: one escalation open, how long it has waited, the last signed checkpoint.
A name the alerts or the dashboard use that the page lacks fails the test: with the log in
files, only the lease's series (a PostgreSQL node's) may be missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

import daemon
from daemon.lease import LeaseStats, render
from tests.e2e.harness import Daemon, LeaseTimes, until, workspace
from tests.e2e.pgnodes import node_config, standby, start, wait_active
from tests.exposition import SUFFIXES, parse_exposition

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "bide-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "bide-dashboard.json"

#: A metric name as the rules and queries spell ours: bide's and the standard process series.
NAME = re.compile(r"\b(?:bide|process)_[a-z0-9_]*[a-z0-9]\b")


def names_used(text: str) -> set[str]:
    return set(NAME.findall(text))


def dashboard_queries() -> list[str]:
    """Every panel's queries and the template variables' (the node picker reads
    ``bide_build_info``)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def current_metrics_url(daemon_: Daemon) -> str:
    """The address the active daemon serves (a PostgreSQL node serves one as a standby
    first, and another once it holds the lease: the last one logged)."""
    found = re.findall(r"address=(http://\S+/metrics)", daemon_.output())
    assert found, daemon_.output()[-2000:]
    return str(found[-1])


def test_the_rules_and_dashboard_name_metrics_to_check() -> None:
    """The extraction below finds the names (a regression here would make the check vacuous)."""
    assert {"bide_escalation_oldest_age_seconds", "process_resident_memory_bytes"} <= names_used(
        ALERTS.read_text()
    )
    assert len(dashboard_queries()) >= 10
    assert "bide_operations" in names_used("\n".join(dashboard_queries()))


@pytest.mark.timeout(120)
def test_every_metric_the_alerts_and_dashboard_use_is_exported(tmp_path: Path, store: str) -> None:
    jobs: dict[str, str | list[object]] = {
        "flaky": [{"fault": "reset"}, "running", "succeeded with result"],
        "odd": ["running", "manual_review"],
    }
    extra = '\n[metrics]\nlisten = "127.0.0.1:0"\n'
    with workspace(tmp_path, jobs, config_extra=extra, store=store) as ws:
        daemon_ = ws.start_daemon()
        ws.wait_writer(daemon_)
        url = current_metrics_url(daemon_)
        assert ws.watch("flaky", "flaky").returncode == 0, ws.outputs[-1]
        assert ws.watch("odd", "odd").returncode == 0, ws.outputs[-1]
        started = time.time()

        def page() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
            return parse_exposition(httpx.get(url, timeout=5).text)

        def settled() -> bool:
            s = page()
            return (
                s["bide_operations"][(("phase", "succeeded"),)] == 1
                and s["bide_escalations_open"][()] == 1
                and "bide_log_last_checkpoint_timestamp_seconds" in s
            )

        until(settled, 30, "one job succeeded, one escalation open, a checkpoint signed")
        text = httpx.get(url, timeout=5).text
        samples = parse_exposition(text)
        _check_with_promtool(text)

        # What every exporter has, and what the alerts read, with values an operator can trust.
        build = dict(next(iter(samples["bide_build_info"])))
        assert build["version"] == daemon.__version__
        assert build["python"]
        assert samples["process_resident_memory_bytes"][()] > 10_000_000
        assert samples["process_open_fds"][()] < samples["process_max_fds"][()]
        assert 0 < started - samples["process_start_time_seconds"][()] < 120
        assert samples["process_cpu_seconds_total"][()] > 0
        assert samples["bide_node_active"][()] == 1
        assert 0 < samples["bide_escalation_oldest_age_seconds"][()] < 60
        assert time.time() - samples["bide_log_last_checkpoint_timestamp_seconds"][()] < 30
        assert samples["bide_log_checkpoint_interval_seconds"][()] == 5
        assert samples["bide_operations_overdue"][()] == 0
        assert samples["bide_spool_waiting"][(("dir", "incoming"),)] == 0
        flaky = (("kind", "connection_reset"), ("provider", "sim"))
        assert samples["bide_transport_failures_total"][flaky] == 1

        exported = set(samples) | set(_declared(text))
        lease_only = set() if store == "postgres" else names_used("\n".join(_lease_lines()))
        for source, used in (
            ("deploy/prometheus/bide-alerts.yml", names_used(ALERTS.read_text())),
            ("deploy/grafana/bide-dashboard.json", names_used("\n".join(dashboard_queries()))),
        ):
            missing = used - exported - lease_only
            assert not missing, f"{source} uses metrics /metrics does not have: {sorted(missing)}"
        _assert_dashboard_labels_exist(samples)
        ws.assert_no_leak()
        assert daemon_.stop() == 0


def _declared(text: str) -> list[str]:
    """Every family declared, with a histogram's sample names (a family may have no sample
    yet: a counter by label before its first event)."""
    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            out += [name + s for s in SUFFIXES.get(kind, ("",))]
    return out


def _lease_lines() -> list[str]:
    return render(LeaseStats(), 0, 0.0)


def _assert_dashboard_labels_exist(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]],
) -> None:
    """A ``by (label)`` in a query names a label its metric carries (judged where the
    metric has samples on this page: a refusal counter may have none yet)."""
    for query in dashboard_queries():
        sampled = [n for n in names_used(query) if samples.get(n)]
        for by in re.findall(r"by \(([^)]*)\)", query):
            for label in (x.strip() for x in by.split(",")):
                if label in {"instance", "job", "le"} or not sampled:
                    continue  # Prometheus's own target labels, and a histogram's bucket
                carriers = [n for n in sampled if any(label in dict(k) for k in samples[n])]
                assert carriers, f"no metric in {query!r} carries the label {label!r}"


def _check_with_promtool(text: str) -> None:
    """``promtool check metrics`` reads the page too where it is installed (required under
    ``BIDE_REQUIRE_PROMTOOL=1``, as CI runs); its lint of our names must find nothing."""
    promtool = shutil.which("promtool")
    if promtool is None:
        assert os.environ.get("BIDE_REQUIRE_PROMTOOL") != "1", "promtool is required"
        return
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_strict_parser_refuses_a_broken_page() -> None:
    good = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n"
    assert parse_exposition(good) == {"a_total": {(): 1.0}}
    for bad in (
        "a_total 1\n",  # no TYPE
        good + "a_total 2\n",  # the series twice
        good.replace("a_total 1", 'a_total{x="1} 1'),  # a broken label
        good.replace("a_total 1", "a_total one"),  # a broken value
        good + "# TYPE a_total counter\n",  # declared twice
        good.rstrip("\n"),  # no final newline
    ):
        with pytest.raises((AssertionError, ValueError)):
            parse_exposition(bad)


@pytest.mark.timeout(120)
def test_a_standby_serves_metrics_that_say_so_then_the_active_page_after_a_takeover(
    tmp_path: Path,
) -> None:
    """A healthy PostgreSQL standby answers ``/metrics`` (``bide_node_active 0``, its lease
    and process series), so Prometheus never sees it as a daemon down; once it takes over,
    the same address setting serves the active page."""
    with workspace(tmp_path, store="postgres") as ws:
        assert ws.dsn is not None
        lease = LeaseTimes(seconds=10.0, renew=1.0, margin=0.5)  # room for a 2 s request
        a, b = (node_config(ws, name, ws.dsn, lease=lease) for name in "ab")
        for n in (a, b):
            n.config.write_text(n.config.read_text() + '\n[metrics]\nlisten = "127.0.0.1:0"\n')
        first = start(ws, a)
        wait_active([a])
        second = start(ws, b)
        until(lambda: standby(second) and "metrics listening" in second.output(), 20, "b")
        page = parse_exposition(httpx.get(current_metrics_url(second), timeout=5).text)
        assert page["bide_node_active"][()] == 0
        assert page["bide_lease_epoch"][()] == 0  # it has taken no term
        assert "bide_build_info" in page
        assert "process_resident_memory_bytes" in page
        assert "bide_operations" not in page  # a standby answers nothing about operations
        assert (
            parse_exposition(httpx.get(current_metrics_url(first), timeout=5).text)[
                "bide_node_active"
            ][()]
            == 1
        )
        assert first.stop() == 0
        wait_active([b])
        until(lambda: second.output().count("metrics listening") == 2, 20, "b's active page")
        page = parse_exposition(httpx.get(current_metrics_url(second), timeout=5).text)
        assert page["bide_node_active"][()] == 1
        assert page["bide_lease_epoch"][()] >= 2
        assert second.stop() == 0
