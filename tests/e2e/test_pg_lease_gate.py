"""A node on PostgreSQL sends a request only with the request's timeout plus the margin left
on its lease. A profile whose timeout cannot fit there is refused, naming the lease, rather
than loaded into a daemon that would never poll its jobs, deadlines included: at start
``bide run`` refuses to run (``tests/test_pgconfig.py``); on a reload (SIGHUP) the profile is
refused, a changed one keeps its last good version, and the other profiles go on.

The config is the one deploy/README.md shows (lease 10 s, renewed every 3 s, margin 1 s); the
refused profiles leave ``timeout_seconds`` at its default (10 s).
"""

from __future__ import annotations

import signal
from pathlib import Path

from daemon.config import load_config
from daemon.spool import Spool
from tests.e2e.harness import (
    DEFAULT_CONTRACT,
    STATES,
    drop_registration,
    until,
    workspace,
    write_status_profile,
)


def _default_timeout_profile(ws_root: Path, url: str, name: str) -> None:
    (ws_root / "profiles" / f"{name}.toml").write_text(
        f'[status]\nurl = "{url}/jobs/{{job_id}}"\n\n'
        f'[credential]\nfile = "sim.token"\n\n[contract]\n{DEFAULT_CONTRACT}\n{STATES}'
    )


def test_a_profile_whose_timeout_outlasts_the_lease_is_refused_on_reload(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {
        "slow-timeout": "running",
        "fits": ["running", "running", "succeeded with result"],
    }
    with workspace(tmp_path, jobs, store="postgres") as ws:
        write_status_profile(ws, "sim", timeout_seconds=6)  # 6 + 1 <= 10 - 3
        daemon = ws.start_daemon()
        _default_timeout_profile(ws.root, ws.sim.base_url, "default-timeout")
        write_status_profile(ws, "sim", timeout_seconds=10)  # a change that no longer fits
        daemon.proc.send_signal(signal.SIGHUP)
        until(lambda: daemon.output().count("profile refused") >= 2, what="both refusals")
        refused = [ln for ln in daemon.output().splitlines() if "profile refused" in ln]
        new = next(ln for ln in refused if "default-timeout.toml" in ln)
        changed = next(ln for ln in refused if "sim.toml" in ln)
        assert "timeout_seconds = 10 does not fit in the log's lease" in new
        assert "keeping the last good version" in changed

        spool = Spool(load_config(str(ws.config)).spool_dir)
        rejected = drop_registration(ws, "never", "slow-timeout", provider="default-timeout")
        accepted = drop_registration(ws, "ok", "fits")
        until(
            lambda: spool.read_receipt(rejected) and spool.read_receipt(accepted),
            what="both receipts",
        )
        receipt = spool.read_receipt(rejected)
        assert receipt is not None
        assert receipt.status == "rejected"
        assert "no profile for provider 'default-timeout'" in receipt.reason
        until(
            lambda: "ok" in ws.log().ops and ws.log().ops["ok"].phase == "succeeded",
            what="the job of the profile kept at its last good version to succeed",
        )
        assert daemon.stop() == 0
        assert ws.sim.requests(kind="status", job_id="slow-timeout") == []
