"""The metrics page's own parts, without a daemon: the ``process_*`` figures agree with what
the kernel says through other doors, the scrape-time gauges count what an operator's alerts
need, and a standby's page says it is one. (The real daemon's page: tests/e2e/
test_metrics_exposition.py.)"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import msgspec

import daemon
from daemon.lease import LeaseStats, render
from daemon.metrics import (
    Metrics,
    Scrape,
    read_process,
    spool_backlog,
    standby_page,
)
from eventlog.heads import Head
from replay.state import OpenEscalation, Operation
from tests.exposition import parse_exposition
from tests.replay.helpers import Daemon

NOW = 1_800_000_000.0


def _vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_process_figures_match_the_kernel_read_other_ways() -> None:
    before = os.times()
    sample = read_process()
    after = os.times()
    assert sample is not None
    assert before.user + before.system - 0.02 <= sample.cpu_seconds
    assert sample.cpu_seconds <= after.user + after.system + 0.02
    assert abs(sample.resident_bytes - _vm_rss()) < 4 * 1024 * 1024
    assert sample.virtual_bytes >= sample.resident_bytes
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert sample.max_fds == (None if soft == resource.RLIM_INFINITY else soft)
    assert 0 < sample.open_fds == len(os.listdir("/proc/self/fd"))
    assert 0 < time.time() - sample.start_time < 24 * 3600


def test_without_proc_the_process_series_are_left_out(tmp_path: Path) -> None:
    assert read_process(str(tmp_path)) is None


def _op(op_id: str, **changes: object) -> Operation:
    return msgspec.structs.replace(Daemon.start().op, operation_id=op_id, **changes)


def test_the_scrape_gauges_count_what_the_alerts_read(tmp_path: Path) -> None:
    escalation = OpenEscalation(escalation_id=1, reason="unknown_state", options=(), raised_at=0)
    ops = {
        "on-time": _op("on-time", deadline_at=NOW + 60),
        "far": _op("far", deadline_at=NOW + 3600),
        "late": _op("late", deadline_at=NOW - 1),
        "late-for-business": _op(
            "late-for-business", deadline_at=NOW + 60, business_deadline_at=NOW - 1
        ),
        "older": _op(
            "older",
            phase="escalated",
            escalation=msgspec.structs.replace(escalation, raised_at=NOW - 7200),
        ),
        "newer": _op(
            "newer",
            phase="escalated",
            escalation=msgspec.structs.replace(escalation, raised_at=NOW - 60),
        ),
        "done": _op("done", phase="succeeded", deadline_at=NOW - 600),
    }
    (tmp_path / "incoming").mkdir()
    (tmp_path / "incoming" / "a.json").write_text("{}")
    (tmp_path / "incoming" / ".b.tmp").write_text("{}")  # half-written: not waiting yet
    metrics = Metrics()
    metrics.checkpoint_signed(
        Head(log="l", seq=41, hash="h", epoch=1, sig="s", t_us=int((NOW - 5) * 1e6), cp="")
    )
    page = metrics.render(
        ops,
        tmp_path,
        0,
        Scrape(
            now=NOW,
            checkpoint_interval=30,
            spool_waiting={"incoming": spool_backlog(tmp_path / "incoming")},
            witness_targets=2,
            witness_failing=1,
        ),
    )
    s = parse_exposition(page)
    assert s["bide_operations"][(("phase", "live"),)] == 4
    assert s["bide_escalations_open"][()] == 2
    assert s["bide_escalation_oldest_age_seconds"][()] == 7200
    assert s["bide_operations_overdue"][()] == 2
    assert s["bide_operations_near_deadline"][()] == 1  # on-time: a minute left; far: an hour
    assert s["bide_log_last_checkpoint_timestamp_seconds"][()] == NOW - 5
    assert s["bide_log_last_checkpoint_seq"][()] == 41
    assert s["bide_log_checkpoint_interval_seconds"][()] == 30
    assert s["bide_spool_waiting"][(("dir", "incoming"),)] == 1
    assert s["bide_spool_waiting"][(("dir", "decisions"),)] == 0
    assert s["bide_witness_targets"][()] == 2
    assert s["bide_witness_failing"][()] == 1
    assert s["bide_node_active"][()] == 1
    build = dict(next(iter(s["bide_build_info"])))
    assert build["version"] == daemon.__version__
    assert "process_resident_memory_bytes" in s


def test_no_open_escalation_and_no_checkpoint_yet() -> None:
    s = parse_exposition(Metrics().render({}, Path("/nonexistent"), 0, Scrape(now=NOW)))
    assert s["bide_escalation_oldest_age_seconds"][()] == 0
    assert "bide_log_last_checkpoint_timestamp_seconds" not in s  # no alert on a made-up age


def test_a_standby_page_says_it_is_not_active() -> None:
    s = parse_exposition(standby_page(render(LeaseStats(), 7, 0.0)))
    assert s["bide_node_active"][()] == 0
    assert s["bide_lease_epoch"][()] == 7
    assert "bide_build_info" in s
    assert "process_open_fds" in s
