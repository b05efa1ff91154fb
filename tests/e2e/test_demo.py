"""`bide demo` as a user runs it: exit 0, every scenario ok, and every reader works after --keep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from daemon.demo import SCENARIOS

BIDE = [sys.executable, "-m", "daemon.cli"]


def test_demo_keep_then_every_reader_command(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    run = subprocess.run(
        [*BIDE, "demo", "--keep", str(keep)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for scenario in SCENARIOS:
        [row] = [line for line in run.stdout.splitlines() if line.startswith(scenario.name + " ")]
        assert row.split()[1] == "ok", row
    assert "verdict=intact" in run.stdout
    assert "0 mismatch(es)" in run.stdout
    config = ["--config", str(keep / "bide.toml")]

    def bide(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*BIDE, *args, *config], capture_output=True, text=True, timeout=60)

    # The demo's daemon has stopped: the readers read the log itself, with its keys.
    status = json.loads(bide("status", "--json", "--offline").stdout)
    assert {op["operation_id"] for op in status} == {s.name for s in SCENARIOS}
    retry_after = bide("story", "retry-after", "--offline").stdout
    assert "from provider guidance (Retry-After)" in retry_after
    assert "fetched: HTTP 200" in bide("story", "submit-fetch", "--offline").stdout
    reasons = {e["reason"] for e in json.loads(bide("escalations", "--json", "--offline").stdout)}
    assert reasons == {s.expect_reason for s in SCENARIOS if s.expect_reason}
    assert bide("replay", "--check").returncode == 0
    assert bide("verify").returncode == 0
    assert (keep / "state" / "outbox" / "deadline.1.txt").exists()
    metrics = (keep / "metrics.txt").read_text()  # scraped from the running daemon
    assert 'bide_escalations_total{reason="rate_limited"} 1' in metrics
    assert 'bide_polls_scheduled_total{source="provider_retry_after"}' in metrics


def test_readme_shows_every_demo_scenario() -> None:
    """The README's copy of the demo's table lists exactly the demo's scenarios, in order, each
    with its expected outcome: the page a newcomer reads first stays true."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## What `make demo` shows", 1)[1].split("```", 2)[1].splitlines()
    header = next(i for i, line in enumerate(block) if line.startswith("scenario "))
    rows = []
    for line in block[header + 1 :]:
        if not line.strip():
            break
        rows.append(line)
    assert [row.split()[0] for row in rows] == [s.name for s in SCENARIOS]
    for scenario, row in zip(SCENARIOS, rows, strict=True):
        assert row.split()[1] == "ok", row
        assert (scenario.expect_reason or "succeeded") in row, row
        assert f"({scenario.title})" in row, row
