"""``deploy/grafana/bide-dashboard.json`` imports as a Grafana dashboard and covers what the
operator watches: panels that fit the grid, each query on the chosen data source and node,
and the groups issue 37 asks for. (That every metric it names exists: tests/e2e/
test_metrics_exposition.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "bide-dashboard.json"


def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(BOARD.read_text())
    return loaded


def test_the_panels_fit_the_grid_and_have_their_own_ids() -> None:
    panels = board()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0, p["title"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"], p["title"]


def test_every_query_uses_the_chosen_data_source_and_nodes() -> None:
    b = board()
    assert [v["name"] for v in b["templating"]["list"]] == ["datasource", "instance"]
    for p in b["panels"]:
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert 'job="bide",instance=~"$instance"' in t["expr"], (p["title"], t["expr"])


def test_the_rows_an_operator_asked_for() -> None:
    rows = [p["title"] for p in board()["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Operations and polls",
        "Escalations",
        "Log, checkpoints, witnesses",
        "Intake and API",
        "Process",
    ]
