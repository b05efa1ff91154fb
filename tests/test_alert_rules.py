"""``deploy/prometheus/bide-alerts.yml`` is valid, fires when it should and stays quiet when it
should (``promtool test rules deploy/prometheus/bide-alerts-test.yml``), and every alert tells the
operator where to look: a summary, and a description naming a runbook section that
deploy/README.md has.

promtool comes with the distribution's ``prometheus`` package (``apt-get install
prometheus``); without it these tests skip, saying so, unless ``BIDE_REQUIRE_PROMTOOL=1``
(``.ci/run`` installs it and sets that), where a missing promtool fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus"
ALERTS = RULES / "bide-alerts.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool is not installed (apt-get install prometheus)"
        if os.environ.get("BIDE_REQUIRE_PROMTOOL") == "1":
            pytest.fail(f"promtool is required (BIDE_REQUIRE_PROMTOOL=1) but {reason}")
        pytest.skip(reason)
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=RULES
    )


def test_the_rules_are_valid() -> None:
    result = run("check", "rules", "bide-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_fire_when_they_should_and_not_otherwise() -> None:
    result = run("test", "rules", "bide-alerts-test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def alerts() -> list[tuple[str, str]]:
    """(name, its text up to the next alert) of every alert in the rules file."""
    text = ALERTS.read_text()
    starts = [(m.start(), m[1]) for m in re.finditer(r"^ +- alert: (\w+)$", text, re.M)]
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return [(name, text[s:e]) for (s, name), e in zip(starts, ends, strict=True)]


def test_every_alert_has_a_summary_and_a_runbook_the_guide_has() -> None:
    guide = (DEPLOY / "README.md").read_text()
    found = alerts()
    assert len(found) >= 10
    for name, body in found:
        assert "summary:" in body, name
        assert f'Runbook: deploy/README.md "Runbook: {name}"' in body, name
        assert re.search(rf"^#+ Runbook: {name}$", guide, re.M), (
            f"deploy/README.md has no section 'Runbook: {name}'"
        )


def test_every_alert_is_tested() -> None:
    tested = (RULES / "bide-alerts-test.yml").read_text()
    for name, _ in alerts():
        assert re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels", tested), (
            f"bide-alerts-test.yml never expects {name} to fire"
        )
