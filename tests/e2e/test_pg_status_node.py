"""``bide status --node`` with the log in PostgreSQL before any node has ever taken the lease
(the row's expiry is ``-infinity`` until then): the lease is free, and it says so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.e2e.harness import BIDE, config_text, init_log, postgres_table


def _status(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BIDE, "status", "--node", *flags, "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_status_node_on_a_database_no_node_has_taken(pg_dsn: str, tmp_path: Path) -> None:
    init_log(pg_dsn)
    config = tmp_path / "bide.toml"
    config.write_text(config_text(postgres=postgres_table(pg_dsn)))
    out = _status(config, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "log_store": "postgresql",
        "active_node": None,
        "epoch": 0,
        "lease_remaining_seconds": 0,
        "log_head_sequence": -1,
    }
    text = _status(config)
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() == "no active node (epoch 0; the lease is free); log head -1"
