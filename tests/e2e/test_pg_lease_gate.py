"""A node on PostgreSQL sends a status request only with the request's timeout plus the margin
left on its lease. A profile whose timeout cannot fit there is refused at load, naming the
lease, rather than loaded into a daemon that would never poll its jobs, deadlines included.

The config is the one deploy/README.md shows (lease 10 s, renewed every 3 s, margin 1 s) and
the refused profile leaves ``timeout_seconds`` at its default (10 s).
"""

from __future__ import annotations

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


def test_a_profile_whose_timeout_outlasts_the_lease_is_refused(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {"slow-timeout": "running",
                                           "fits": "running, succeeded with result"}
    with workspace(tmp_path, jobs, store="postgres") as ws:
        (ws.root / "profiles" / "default-timeout.toml").write_text(
            f'[status]\nurl = "{ws.sim.base_url}/jobs/{{job_id}}"\n\n'
            f'[credential]\nfile = "sim.token"\n\n[contract]\n{DEFAULT_CONTRACT}\n{STATES}')
        write_status_profile(ws, "sim", timeout_seconds=6)  # 6 + 1 <= 10 - 3
        daemon = ws.start_daemon()
        refused = [line for line in daemon.output().splitlines() if "profile refused" in line]
        assert len(refused) == 1, daemon.output()
        assert "default-timeout.toml" in refused[0]
        assert "timeout_seconds = 10 does not fit the log's lease" in refused[0]

        spool = Spool(load_config(str(ws.config)).spool_dir)
        rejected = drop_registration(ws, "never", "slow-timeout", provider="default-timeout")
        accepted = drop_registration(ws, "ok", "fits")
        until(lambda: spool.read_receipt(rejected) and spool.read_receipt(accepted),
              what="both receipts")
        receipt = spool.read_receipt(rejected)
        assert receipt is not None
        assert receipt.status == "rejected"
        assert "no profile for provider 'default-timeout'" in receipt.reason
        until(lambda: "ok" in ws.log().ops and ws.log().ops["ok"].phase == "succeeded",
              what="the job of the profile that fits to succeed")
        assert daemon.stop() == 0
        assert ws.sim.requests(kind="status", job_id="slow-timeout") == []
