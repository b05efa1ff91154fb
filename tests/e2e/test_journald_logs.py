"""Log lines under journald carry their syslog priority; ``[log] level`` and ``--log-level``
choose which lines are written. A real daemon whose stderr is a file named by
``$JOURNAL_STREAM``, as systemd sets it for a service whose output goes to the journal."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from daemon.spool import Spool
from tests.e2e.harness import BIDE, Daemon, Workspace, until, workspace

#: logfmt's level word -> the syslog priority journald reads from the line's ``<N>`` prefix.
PRIORITY = {"debug": 7, "info": 6, "warn": 4, "error": 3}
LINE = re.compile(r"^(<(\d)>)?ts=\S+Z level=(\w+) msg=")


def _journal_stream(path: Path) -> str:
    """``$JOURNAL_STREAM`` for a stream writing to ``path``: its ``DEV:INODE``."""
    path.touch()
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


def _reject_a_spool_file(ws: Workspace) -> None:
    """A malformed registration: the daemon logs a warning and sets the file aside."""
    spool = Spool(ws.root / "state" / "spool")
    (spool.incoming / ("a" * 32 + ".json")).write_text("{not json")
    until(lambda: list(spool.rejected.glob("*.reason")), what="the file to be rejected")


def _api_up(ws: Workspace, daemon: Daemon) -> None:
    """Ready without reading the (filtered) log: the API answers."""

    def answers() -> bool:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"daemon exited {daemon.proc.returncode}:\n{daemon.output()}")
        return ws.bide("status", "--json").returncode == 0

    until(answers, what="the API to answer")


def _levels(lines: list[str]) -> list[tuple[str | None, str]]:
    """(priority prefix or None, level word) of each line; every line must be logfmt."""
    out = []
    for line in lines:
        m = LINE.match(line)
        assert m, line
        out.append((m.group(2), m.group(3)))
    return out


def test_under_journald_each_line_carries_its_priority(tmp_path: Path) -> None:
    with workspace(tmp_path, {"j1": "running"}) as ws:
        (tmp_path / "profiles" / "broken.toml").write_text("[status]\nurl = 3\n")  # an error
        stream = _journal_stream(ws.next_log_path())
        daemon = ws.start_daemon(env={"JOURNAL_STREAM": stream}, args=["--log-level", "debug"])
        _reject_a_spool_file(ws)  # a warning
        assert daemon.stop() == 0
        seen = _levels(daemon.output().splitlines())
        assert {word for _, word in seen} == {"debug", "info", "warn", "error"}, seen
        for prefix, word in seen:
            assert prefix == str(PRIORITY[word]), (prefix, word)

        # Not the journal (stderr is another file than JOURNAL_STREAM names, as in a child
        # that redirected it): no prefix.
        other = ws.start_daemon(env={"JOURNAL_STREAM": stream})
        assert other.stop() == 0
        seen = _levels(other.output().splitlines())
        assert seen
        assert all(prefix is None for prefix, _ in seen), seen


def test_level_warning_hides_info_lines_and_the_flag_overrides_the_file(
    tmp_path: Path,
) -> None:
    with workspace(tmp_path, config_extra='level = "warning"\n') as ws:
        daemon = ws.start_daemon(ready=False)
        _api_up(ws, daemon)
        _reject_a_spool_file(ws)
        until(lambda: "spool file rejected" in daemon.output(), what="the warning")
        assert daemon.stop() == 0
        words = {word for _, word in _levels(daemon.output().splitlines())}
        assert words == {"warn"}, daemon.output()  # no "ready", "stopped", "api listening"

        louder = ws.start_daemon(args=["--log-level", "info"])  # waits for msg=ready
        assert louder.stop() == 0
        assert "level=info msg=stopped" in louder.output()


def test_a_bad_level_is_a_clear_error(tmp_path: Path) -> None:
    with workspace(tmp_path, config_extra='level = "verbose"\n') as ws:
        daemon = ws.start_daemon(ready=False)
        assert daemon.proc.wait(30) == 2, daemon.output()
        out = daemon.output()
        for named in ("bide.toml", "log.level", "'verbose'"):
            assert named in out, out
        assert "Traceback" not in out, out

        flag = subprocess.run(
            [*BIDE, "run", "--config", str(ws.config), "--log-level", "loud"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
        assert flag.returncode == 2
        for named in ("--log-level", "'loud'", "'debug'", "'warning'"):
            assert named in flag.stderr, flag.stderr
