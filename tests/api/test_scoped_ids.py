"""Operation ids are each registrant's own: two agents (real Unix users, prefix ``bidea``)
both use ``nightly``, each is answered as a fresh registration would be, and neither learns
that the other's exists, from a registration, a submit's duplicate check or a read."""

from __future__ import annotations

import json

import pytest

from tests.e2e.harness import workspace
from tests.e2e.test_actions import submit_profile
from tests.unixusers import as_user, python_for_everyone, shared_dir, unix_users, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")

GROUPS = ("bidea-sagents", "bidea-sapi")
USERS: dict[str, tuple[str, ...]] = {"bidea-s1": GROUPS, "bidea-s2": GROUPS}
CONFIG = '\n[spool]\nagents_group = "bidea-sagents"\n'
API = 'socket_group = "bidea-sapi"\nsocket_mode = "0660"\n'
SLOW = {"scenarios": {"slow": {"steps": "running"}}}


def test_two_agents_may_both_use_one_id_and_neither_learns_of_the_other() -> None:
    with unix_users(USERS, GROUPS) as users, shared_dir() as shared:
        s1, s2 = users["bidea-s1"], users["bidea-s2"]
        python = python_for_everyone(shared)
        root = shared / "ws"
        root.mkdir()
        with workspace(
            root, jobs={"j1": "running", "j2": "running"}, config_extra=CONFIG, api=API
        ) as ws:
            (root / "bide.toml").chmod(0o644)
            ws.start_daemon()

            def watch(user: str, job: str) -> dict[str, object]:
                out = as_user(
                    ws,
                    python,
                    users[user],
                    "watch",
                    "--provider",
                    "sim",
                    "--job",
                    job,
                    "--operation",
                    "nightly",
                    "--json",
                )
                assert out.returncode == 0, out.stdout + out.stderr
                answer: dict[str, object] = json.loads(out.stdout)
                return answer

            first, second = watch("bidea-s1", "j1"), watch("bidea-s2", "j2")
            assert first["operation_id"] == second["operation_id"] == "nightly"
            assert first["created"] is second["created"] is True  # a fresh registration
            assert set(first) == set(second)
            assert watch("bidea-s2", "j2")["created"] is False  # its own retry

            def status(user: str) -> dict[str, object]:
                out = as_user(ws, python, users[user], "status", "nightly", "--json")
                assert out.returncode == 0, out.stdout + out.stderr
                view: dict[str, object] = json.loads(out.stdout)
                return view

            assert status("bidea-s1")["provider_job_id"] == "j1"
            theirs = status("bidea-s2")
            assert (theirs["provider_job_id"], theirs["operation_id"]) == ("j2", "nightly")
            assert "~u" not in json.dumps(theirs)
            story = as_user(ws, python, s2, "story", "nightly").stdout
            assert "j2" in story
            assert "~u" not in story

            reserved = as_user(
                ws,
                python,
                s1,
                "watch",
                "--provider",
                "sim",
                "--job",
                "j1",
                "--operation",
                f"nightly~u{s2.uid}",
            )
            assert reserved.returncode != 0  # nobody takes another's scoped name
            assert "'~u' and a digit" in reserved.stdout + reserved.stderr

            ops = ws.log().ops
            assert ops["nightly"].registered_by_uid == s1.uid
            assert ops[f"nightly~u{s2.uid}"].registered_by_uid == s2.uid
            check = ws.bide("replay", "--check")
            assert check.returncode == 0, check.stdout + check.stderr


def test_the_duplicate_submit_check_compares_only_the_caller_s_own() -> None:
    with unix_users(USERS, GROUPS) as users, shared_dir() as shared:
        s1, s2 = users["bidea-s1"], users["bidea-s2"]
        python = python_for_everyone(shared)
        root = shared / "ws"
        root.mkdir()
        body = shared / "body.json"
        body.write_text('{"scenario": "slow"}')
        body.chmod(0o644)
        with workspace(root, config_extra=CONFIG, api=API, **SLOW) as ws:  # type: ignore[arg-type]
            submit_profile(ws)
            (root / "bide.toml").chmod(0o644)
            ws.start_daemon()
            # The duplicate-submit check compares the caller's own operations only.
            submitted = as_user(
                ws,
                python,
                s1,
                "submit",
                "--provider",
                "sim",
                "--body",
                str(body),
                "--operation",
                "exp-1",
            )
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            again = as_user(
                ws,
                python,
                s2,
                "submit",
                "--provider",
                "sim",
                "--body",
                str(body),
                "--operation",
                "exp-2",
            )
            assert again.returncode == 0, again.stdout + again.stderr
            assert "exp-1" not in again.stdout + again.stderr
            own = as_user(
                ws,
                python,
                s1,
                "submit",
                "--provider",
                "sim",
                "--body",
                str(body),
                "--operation",
                "exp-3",
            )
            assert own.returncode != 0  # the caller's own live duplicate is still caught
            assert "duplicate submit: operation exp-1" in own.stdout + own.stderr
