"""``bide story OP --offline`` reads only what the operation's story needs: events whose
plaintext does not hold the operation id are neither decoded nor folded. It must tell exactly
the story the whole log tells, for ids that are prefixes of others and ids that JSON escapes."""

from __future__ import annotations

import json
from pathlib import Path

from daemon.config import load_config
from daemon.readers import load_log, op_action_events, op_events, open_keyring
from replay.actions import action_story
from replay.story import story_json
from tests.e2e.harness import until, workspace

OPS = {"op-1": "j1", "op-10": "j10", 'q"uo\\te': "j2", "ünï-1": "j3"}


def test_the_offline_story_of_each_operation_is_the_whole_logs(tmp_path: Path) -> None:
    jobs: dict[str, str | list[object]] = {
        job: "running x3, succeeded with result" for job in OPS.values()
    }
    with workspace(tmp_path, jobs) as ws:
        daemon = ws.start_daemon()
        for op, job in OPS.items():
            out = ws.watch(job, op)
            assert out.returncode == 0, out.stdout + out.stderr
        until(
            lambda: (
                all(op.phase == "succeeded" for op in ws.log().ops.values())
                and len(ws.log().ops) == len(OPS)
            ),
            30,
            "every operation to succeed",
        )
        assert daemon.stop() == 0
        cfg = load_config(str(ws.config))
        whole = load_log(cfg.log_dir, open_keyring(cfg))
        for op in OPS:
            expected = sorted(
                [*story_json(op_events(whole, op)), *action_story(op_action_events(whole, op))],
                key=lambda line: float(line["at"]),  # type: ignore[arg-type]
            )
            assert len(expected) >= 5, expected  # registered, polled three times, succeeded
            told = ws.bide("story", op, "--offline", "--json")
            assert told.returncode == 0, told.stderr
            as_api = [{**line, "at": line["time"]} for line in expected]  # RFC 3339, as the API
            assert json.loads(told.stdout) == json.loads(json.dumps(as_api))
        missing = ws.bide("story", "op-2", "--offline")
        assert missing.returncode != 0
        assert "no operation 'op-2' in the log" in missing.stderr
        assert "op-1" in missing.stderr  # the hint still names operations that exist
