"""The spool stays bounded (issue 20, finding 8): 10,000 junk files leave at most
``rejected_max_files`` refused files behind, receipts are 0600 (the daemon's; the requester
reads theirs through an ACL entry, see test_spool_users) and go after
``receipt_retention_seconds``."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from daemon.spool import Spool, new_request_id
from tests.e2e.harness import until, workspace
from tests.faults.support import metrics_url, scrape

KEEP = 50
EXTRA = (
    f"\n[spool]\nreceipt_retention_seconds = 3600\nrejected_max_files = {KEEP}\n"
    f"receipt_max_files = {2 * KEEP}\n"
    f'\n[metrics]\nlisten = "127.0.0.1:0"\n'
)


def test_ten_thousand_junk_files_leave_a_bounded_spool(tmp_path: Path) -> None:
    with workspace(tmp_path, {"j": "running"}, config_extra=EXTRA) as ws:
        daemon = ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        old = spool.receipts / f"{new_request_id()}.json"
        old.write_text(json.dumps({"request_id": "x", "status": "registered"}))
        stamp = time.time() - 7200
        os.utime(old, (stamp, stamp))
        for _ in range(10_000):
            rid = new_request_id()
            (spool.incoming / f"{rid}.json").write_bytes(b"junk")
        until(
            lambda: not any(spool.incoming.iterdir()),
            timeout=120,
            what="every junk file to be ingested",
        )

        def files() -> int:
            return sum(len(list(d.iterdir())) for d in (spool.rejected, spool.receipts))

        until(lambda: files() <= 4 * KEEP, timeout=30, what="the spool to be pruned")
        # The receipts of the last scan remain (they are young); the old one is gone.
        assert not old.exists()
        receipts = list(spool.receipts.iterdir())
        assert receipts, "no receipts were written"
        for receipt in receipts[:20]:
            assert stat.S_IMODE(receipt.stat().st_mode) == 0o600  # root dropped them
        assert scrape(metrics_url(daemon))["bide_spool_pruned_total"] >= 2 * (10_000 - 2 * KEEP)
        assert ws.watch("j", "still-serving").returncode == 0
        assert daemon.stop() == 0
