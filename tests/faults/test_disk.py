"""The log's disk fills up, or goes read-only, under a running daemon (issue 8).

What must hold: no status request leaves without its intent durable in the log (the provider
never sees a request the log does not explain); the daemon raises the alarm (an ``ALARM`` log
line, ``STATUS=`` with the alarm, ``bide_log_append_failing 1``), keeps retrying with backoff,
and resumes by itself once the disk takes writes again; nothing recorded before is lost or
doubled; the log verifies and replays.

The disk is a real 1 MiB tmpfs (root only; CI runs as root); read-only is a read-only bind mount
stacked over the log directory (a plain ``remount,ro`` is refused while the daemon holds its
segment open). Mounts are undone however the test ends.
"""

from __future__ import annotations

import time
from pathlib import Path

from replay.events import Event, StatusRequestIntended
from tests.e2e.harness import Workspace, until, workspace
from tests.faults.support import (
    NotifySocket,
    assert_every_request_was_intended,
    fill,
    metrics_url,
    read_only_over,
    require_mount,
    scrape,
    tmpfs,
)

METRICS = '\n[metrics]\nlisten = "127.0.0.1:0"\n'
JOBS = {"disk-1": "op-1", "disk-2": "op-2"}


def _status_requests(ws: Workspace) -> int:
    return len(ws.sim.requests(kind="status"))


def _events(ws: Workspace) -> list[tuple[int, Event]]:
    return ws.log().events


def _assert_log_whole(ws: Workspace, before: list[tuple[int, Event]]) -> None:
    """The log verifies, replays with no mismatch, keeps ``before`` as its prefix, and holds
    each (operation, request number) intent exactly once."""
    verified = ws.bide("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    checked = ws.bide("replay", "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    after = _events(ws)
    # Events, not sequence numbers: records a failed batch left behind (never acknowledged)
    # are cut on reopen and the same events appended again, a record or two later.
    assert [e for _, e in after][: len(before)] == [e for _, e in before], (
        "events written before the fault were lost or changed"
    )
    numbers = [
        (e.operation_id, e.request_number) for _, e in after if isinstance(e, StatusRequestIntended)
    ]
    assert len(numbers) == len(set(numbers)), "an intent was recorded twice"
    for op in JOBS.values():
        mine = sorted(n for o, n in numbers if o == op)
        assert mine == list(range(1, len(mine) + 1)), f"{op}: intents not 1..n: {mine}"


def test_disk_full_stops_requests_raises_alarm_and_resumes(tmp_path: Path) -> None:
    require_mount()
    log_dir = tmp_path / "state" / "log"
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        with (
            tmpfs(log_dir, "1m"),
            workspace(tmp_path, dict.fromkeys(JOBS, "running"), config_extra=METRICS) as ws,
        ):
            daemon = ws.start_daemon({"NOTIFY_SOCKET": str(notify.path)})
            url = metrics_url(daemon)
            for job, op in JOBS.items():
                assert (
                    ws.watch(job, op, "--deadline", "10m", "--max-requests", "10000").returncode
                    == 0
                )
            ws.sim.wait_for_requests(6, kind="status", timeout=20)
            assert scrape(url)["bide_log_append_failing"] == 0

            filler = fill(log_dir)
            until(lambda: "ALARM" in daemon.output(), what="the ALARM log line")
            assert scrape(url)["bide_log_append_failing"] == 1
            until(lambda: any("ALARM" in s for s in notify.statuses()), what="STATUS= alarm")
            # Whatever slack the last page had is used within a few failed appends; from then
            # on no request leaves, because none can be recorded first.
            time.sleep(1.0)
            stalled_at = _status_requests(ws)
            time.sleep(2.0)
            assert _status_requests(ws) == stalled_at, "requests sent while the log is full"
            assert daemon.proc.poll() is None, "the daemon gave up instead of retrying"
            before = _events(ws)  # what is durable now must survive the whole episode

            retries = scrape(url)["bide_log_append_retries_total"]
            assert retries >= 2, "the append was not retried"

            filler.unlink()
            until(
                lambda: "event log appends recovered" in daemon.output(),
                timeout=30,
                what="recovery after space returned",
            )
            ws.sim.wait_for_requests(stalled_at + 4, kind="status", timeout=20)
            assert scrape(url)["bide_log_append_failing"] == 0
            # One line when the condition starts, one per change of error, one when it ends:
            # not one per waiting caller per retry (issue 14).
            episode = daemon.output().split("ALARM", 1)[1].split("appends recovered", 1)[0]
            assert episode.count("level=error") <= 3, episode
            recovered = next(
                line for line in daemon.output().splitlines() if "appends recovered" in line
            )
            assert "attempts=" in recovered, recovered
            assert "failing_for=" in recovered, recovered
            until(lambda: "ALARM" not in notify.statuses()[-1], what="STATUS= without alarm")
            assert daemon.stop() == 0
            _assert_log_whole(ws, before)
            assert assert_every_request_was_intended(ws, JOBS) >= stalled_at + 4
    finally:
        notify.close()


def test_read_only_log_directory_stops_requests_and_resumes(tmp_path: Path) -> None:
    """The log directory turns read-only under the daemon; segments rotate every few records
    (``segment_bytes = 4096``), so the next rotation meets EROFS with the current segment
    still open for writing, half of a batch written into it and no way to cut it there."""
    require_mount()
    log_dir = tmp_path / "state" / "log"
    extra = "segment_bytes = 4096\n" + METRICS  # lands in the harness's [log] table
    with workspace(tmp_path, dict.fromkeys(JOBS, "running"), config_extra=extra) as ws:
        daemon = ws.start_daemon()
        url = metrics_url(daemon)
        for job, op in JOBS.items():
            assert ws.watch(job, op, "--deadline", "10m", "--max-requests", "10000").returncode == 0
        ws.sim.wait_for_requests(6, kind="status", timeout=20)
        with read_only_over(log_dir, log_dir):
            until(lambda: "ALARM" in daemon.output(), what="the ALARM log line")
            assert scrape(url)["bide_log_append_failing"] == 1
            time.sleep(1.0)
            stalled_at = _status_requests(ws)
            time.sleep(2.0)
            assert _status_requests(ws) == stalled_at, "requests sent while read-only"
            before = _events(ws)
        until(
            lambda: "event log appends recovered" in daemon.output(),
            timeout=30,
            what="recovery once the directory is writable again",
        )
        ws.sim.wait_for_requests(stalled_at + 4, kind="status", timeout=20)
        assert scrape(url)["bide_log_append_failing"] == 0
        episode = daemon.output().split("ALARM", 1)[1].split("appends recovered", 1)[0]
        assert episode.count("level=error") <= 3, episode  # not a line per caller per retry
        assert daemon.stop() == 0
        _assert_log_whole(ws, before)
        assert_every_request_was_intended(ws, JOBS)
