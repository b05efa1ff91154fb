"""``bide mcp`` through the MCP SDK's own client, against a real daemon and the simulator.

The client starts ``bide mcp`` as a subprocess over stdio, as an agent's harness would; every
call goes from the SDK's client through the server to the daemon's socket and back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="bide[mcp] is not installed")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.e2e.harness import Workspace, workspace

SNAPSHOT = Path(__file__).parent / "tools.json"
TOOLS = {
    "watch_job",
    "submit_job",
    "get_operation",
    "list_my_operations",
    "wait_for_operation",
    "operation_story",
    "my_escalations",
}


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    jobs: dict[str, str | list[object]] = {
        "quick": "running, succeeded with result",
        "odd": "queued, manual_review",
        **{f"slow{i}": "running" for i in range(20)},
    }
    # The daemon caps every wait at 3 s here (60 s by default), so a wait asked for an hour
    # shows the cap without the suite sitting through a minute.
    with workspace(
        tmp_path, jobs=jobs, api="allow_self_approval = true\nmax_wait_seconds = 3\n"
    ) as w:
        w.start_daemon()
        yield w


@asynccontextmanager
async def session(ws: Workspace, command: list[str] | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=command[0] if command else sys.executable,
        args=command[1:] if command else ["-m", "daemon.cli", "mcp", "--config", str(ws.config)],
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


async def tool(s: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    result = await s.call_tool(name, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _schemas(tools: list[Any]) -> dict[str, Any]:
    return {
        t.name: {"description": t.description, "input": t.input_schema, "output": t.output_schema}
        for t in tools
    }


def test_tools_are_listed_with_their_schemas(ws: Workspace) -> None:
    async def main() -> dict[str, Any]:
        async with session(ws) as s:
            return _schemas((await s.list_tools()).tools)

    listed = anyio.run(main)
    assert set(listed) == TOOLS
    assert all(t["output"] is not None for t in listed.values())
    assert "decide" not in " ".join(listed)  # no tool answers an escalation
    if os.environ.get("BIDE_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(listed, indent=1, sort_keys=True) + "\n")
    assert listed == json.loads(SNAPSHOT.read_text()), (
        f"the tools' schemas changed; if on purpose, run with BIDE_UPDATE_SNAPSHOTS=1 and "
        f"commit {SNAPSHOT.name}"
    )


def test_watch_wait_story_and_an_escalation(ws: Workspace) -> None:
    async def main() -> None:
        async with session(ws) as s:
            watched = await tool(
                s, "watch_job", provider="sim", job_id="quick", operation_id="op-quick"
            )
            assert watched["phase"] == "live"
            again = await tool(
                s, "watch_job", provider="sim", job_id="quick", operation_id="op-quick"
            )
            assert again["operation_id"] == "op-quick"
            done = await tool(s, "wait_for_operation", operation_id="op-quick", timeout_seconds=30)
            assert (done["phase"], done["done"]) == ("succeeded", True)
            assert done["provider_results"]["result_url"].endswith("/results/quick")
            story = await tool(s, "operation_story", operation_id="op-quick")
            assert "succeeded" in story["text"]
            resource = await s.read_resource("bide://operations/op-quick/story")
            assert "registered job ⟨provider_text[0]⟩" in resource.contents[0].text  # type: ignore[union-attr]

            await tool(s, "watch_job", provider="sim", job_id="odd", operation_id="op-odd")
            escalated = await tool(
                s, "wait_for_operation", operation_id="op-odd", timeout_seconds=30
            )
            assert escalated["phase"] == "escalated"
            escalation = escalated["escalation"]
            assert [o["number"] for o in escalation["options"]] == list(
                range(1, len(escalation["options"]) + 1)
            )
            assert escalation["decide_command"].startswith("bide decide op-odd ")
            assert "a person must choose" in escalated["advice"]
            mine = await tool(s, "my_escalations")
            assert mine["count"] == 1
            listed = await tool(s, "list_my_operations")
            assert {o["operation_id"] for o in listed["operations"]} == {"op-quick", "op-odd"}

    anyio.run(main)


def test_errors_are_tool_errors_and_the_server_keeps_serving(ws: Workspace) -> None:
    async def main() -> None:
        async with session(ws) as s:
            missing = await s.call_tool("get_operation", {"operation_id": "nope"})
            assert missing.is_error
            assert "no operation 'nope'" in missing.content[0].text  # type: ignore[union-attr]
            unknown = await s.call_tool("watch_job", {"provider": "nobody", "job_id": "x"})
            assert unknown.is_error
            assert "no profile for provider" in unknown.content[0].text  # type: ignore[union-attr]
            bad = await s.call_tool("wait_for_operation", {"operation_id": 7})
            assert bad.is_error
            assert "Traceback" not in str(bad.content)
            assert (await tool(s, "list_my_operations"))["operations"] == []

    anyio.run(main)


def test_waits_are_bounded_and_independent(ws: Workspace) -> None:
    async def main() -> None:
        async with session(ws) as s:
            for i in range(20):
                await tool(
                    s,
                    "watch_job",
                    provider="sim",
                    job_id=f"slow{i}",
                    operation_id=f"op-slow{i}",
                    max_status_requests=1000,
                )
            started = time.monotonic()
            answers: list[dict[str, Any]] = []

            async def wait(i: int, seconds: float) -> None:
                answers.append(
                    await tool(
                        s, "wait_for_operation", operation_id=f"op-slow{i}", timeout_seconds=seconds
                    )
                )

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(wait, i, 1.0 + (i % 2))
            took = time.monotonic() - started
            assert len(answers) == 20
            assert all(a["still_running"] and a["next_news_at"] for a in answers)
            assert took < 10, took  # 20 waits of 1-2 s at once, not one after another
            capped = time.monotonic()
            long = await tool(
                s, "wait_for_operation", operation_id="op-slow0", timeout_seconds=3600
            )
            assert long["still_running"]
            assert time.monotonic() - capped < 10  # asked for an hour; capped

    anyio.run(main)


def test_without_the_daemon_a_tool_says_so(ws: Workspace) -> None:
    ws.daemons[0].stop()

    async def main() -> None:
        async with session(ws) as s:
            result = await s.call_tool("list_my_operations", {})
            assert result.is_error
            assert "not running" in result.content[0].text  # type: ignore[union-attr]

    anyio.run(main)
