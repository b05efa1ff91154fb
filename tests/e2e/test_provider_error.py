"""The provider's own error reaches the human who decides, whole (issue 14): in the story,
``status --json``, ``escalations`` (text and JSON) and the outbox message, valid JSON when it
was stored whole, and marked where the contract's cap cut it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness import DEFAULT_CONTRACT, workspace

ERROR = {
    "code": "EXPORT_FAILED",
    "message": "the export could not be written",
    "details": [
        {
            "shard": n,
            "reason": "disk quota exceeded on volume vol-7 (shard "
            f"{n} of 12); retry after freeing space",
        }
        for n in range(6)
    ],
}


def test_a_678_byte_provider_error_is_shown_whole_where_a_human_decides(tmp_path: Path) -> None:
    text = json.dumps(ERROR, separators=(",", ":"))
    assert len(text) > 600  # longer than any cut the readers used to make
    steps: list[object] = ["running", {"state": "failed", "fields": {"error": ERROR}}]
    with workspace(tmp_path, {"exp": steps}) as ws:
        ws.start_daemon()
        assert ws.watch("exp", "exp").returncode == 0
        assert ws.bide("wait", "exp", "--timeout", "20s").returncode == 3  # escalated

        status = json.loads(ws.bide("status", "exp", "--json").stdout)
        assert status["stop_reason"] == "provider_failure"
        assert json.loads(status["provider_error"]) == ERROR
        assert status["provider_error_truncated"] is False

        [open_] = json.loads(ws.bide("escalations", "--json").stdout)
        assert json.loads(open_["provider_error"]) == ERROR
        shown = ws.bide("escalations").stdout
        assert "provider error:" in shown
        assert "shard 5 of 12" in shown

        outbox = (tmp_path / "state" / "outbox" / "exp.1.txt").read_text()
        quoted = [line.split("| ", 1)[1] for line in outbox.splitlines() if "| " in line]
        assert json.loads("\n".join(quoted)) == ERROR

        story = ws.bide("story", "exp").stdout
        assert repr(text) in story  # whole and quoted, not the first 200 characters
        assert "cut at" not in story


def test_an_error_past_the_cap_is_marked_as_cut(tmp_path: Path) -> None:
    steps: list[object] = [{"state": "failed", "fields": {"error": ERROR}}]
    with workspace(tmp_path, {"exp": steps}) as ws:
        ws.write_profile(contract=DEFAULT_CONTRACT + "error_cap_bytes = 128\n")
        ws.start_daemon()
        assert ws.watch("exp", "exp").returncode == 0
        assert ws.bide("wait", "exp", "--timeout", "20s").returncode == 3
        status = json.loads(ws.bide("status", "exp", "--json").stdout)
        assert status["provider_error_truncated"] is True
        assert len(status["provider_error"].encode()) <= 128
        assert "cut at the contract's error_cap_bytes" in ws.bide("story", "exp").stdout
        assert "cut at the contract's error_cap_bytes" in ws.bide("escalations").stdout
