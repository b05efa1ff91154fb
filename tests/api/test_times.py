"""The API speaks RFC 3339: every time in an answer is RFC 3339 text in UTC (the OpenAPI
document says ``format: date-time``), and a request may give its times so too. A real daemon
on its real socket, the simulator on loopback."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from daemon.api.client import api_time, shown_time
from daemon.api.openapi import ROUTES, build
from daemon.errors import DaemonError
from tests.api.test_api import FOREVER, api, watch
from tests.e2e.harness import workspace

DATE_TIME = {"type": "string", "format": "date-time"}


def _is_time(name: str) -> bool:
    return name in ("at", "time") or name.endswith("_at")


def _time_properties(schema: dict[str, Any], doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, schema) of every time-named property reachable from ``schema``."""
    found: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            seen.add(ref)
            walk(doc["components"]["schemas"][ref.rsplit("/", 1)[1]])
        for name, prop in (node.get("properties") or {}).items():
            if _is_time(name):
                found.append((name, prop))
        for value in node.values():
            walk(value)

    walk(schema)
    return found


def test_every_time_in_an_answer_is_a_date_time_in_the_openapi_document() -> None:
    doc = build()
    checked = 0
    for route in ROUTES:
        responses = doc["paths"][route.path][route.method]["responses"]
        for status in route.answers:
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            for name, prop in _time_properties(schema, doc):
                kinds = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
                assert kinds, (route.path, name)
                for kind in kinds:
                    assert {k: kind[k] for k in ("type", "format") if k in kind} == DATE_TIME, (
                        route.path,
                        name,
                        prop,
                    )
                    checked += 1
    assert checked >= 6  # registered_at, deadline_at, next_news_at, raised_at, at, time


def _utc(text: object) -> datetime:
    """``text`` parsed as RFC 3339 by the standard library, required to be in UTC."""
    assert isinstance(text, str), text
    when = datetime.fromisoformat(text)
    assert when.utcoffset() == timedelta(0), text
    assert text.endswith("Z"), text
    return when


def test_a_real_daemons_answers_give_rfc3339_times_in_utc(tmp_path: Path) -> None:
    with workspace(tmp_path, jobs={"slow": FOREVER, "odd": "mystery"}) as ws:
        ws.start_daemon()
        before = datetime.now(UTC) - timedelta(seconds=5)
        with api(ws) as client:
            tomorrow = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
            business = tomorrow.astimezone(timezone(timedelta(hours=1))).isoformat()
            assert business.endswith("+01:00")  # any offset in; UTC out
            first = watch(
                client, "op-slow", "slow", deadline_seconds=600, business_deadline_at=business
            )
            again = watch(
                client,
                "op-slow",
                "slow",
                deadline_seconds=600,
                business_deadline_at=datetime.fromisoformat(business).timestamp(),
            )
            assert again == {**first, "created": False}  # the same request, in either form
            view = client.call("GET", "/v1/operations/op-slow")
            registered = _utc(view["registered_at"])
            assert before <= registered <= datetime.now(UTC)
            deadline = _utc(view["deadline_at"])
            assert abs((deadline - registered).total_seconds() - 600) < 5
            assert registered <= _utc(view["next_news_at"]) <= deadline

            watch(client, "op-odd", "odd")
            odd = client.call("GET", "/v1/operations/op-odd", params={"wait": "20s"})
            assert odd["phase"] == "escalated"
            raised = _utc(odd["escalation"]["raised_at"])
            assert registered <= raised <= datetime.now(UTC)
            [listed] = client.call("GET", "/v1/escalations")["escalations"]
            assert listed["raised_at"] == odd["escalation"]["raised_at"]
            page = client.call("GET", "/v1/operations")
            assert {_utc(v["registered_at"]) for v in page["operations"]} >= {registered}

            story = client.call("GET", "/v1/operations/op-odd/story")
            times = [_utc(line["at"]) for line in story["lines"]]
            assert times == sorted(times)
            assert all(line["time"] == line["at"] for line in story["lines"])
        # The CLI reads the new form.
        status = ws.bide("status", "op-slow")
        assert status.returncode == 0, status.stdout + status.stderr
        shown = re.search(r" next (\S+)$", status.stdout.strip())
        assert shown, status.stdout
        assert _utc(shown.group(1)) >= registered
        listed_json = ws.bide("status", "--json")
        assert listed_json.returncode == 0, listed_json.stderr
        for v in json.loads(listed_json.stdout):
            _utc(v["registered_at"])


def test_the_client_reads_rfc3339_and_the_seconds_of_an_older_daemon() -> None:
    assert shown_time("2026-12-07T13:04:05.123Z") == "2026-12-07T13:04:05.123Z"
    assert shown_time("2026-12-07T14:04:05+01:00") == "2026-12-07T13:04:05Z"
    t = datetime(2026, 12, 7, 13, 4, 5, tzinfo=UTC).timestamp()
    assert shown_time(t) == "2026-12-07T13:04:05Z"
    assert api_time(t + 0.25) == datetime(2026, 12, 7, 13, 4, 5, 250000, tzinfo=UTC)
    for bad in ("2026-12-07T13:04:05", "soon", None, True):
        with pytest.raises(DaemonError, match="RFC 3339"):
            api_time(bad)


def test_now_is_shown_to_the_millisecond() -> None:
    now = time.time()
    text = shown_time(now)
    assert abs(datetime.fromisoformat(text).timestamp() - now) < 0.001
