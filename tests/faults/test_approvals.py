"""Approvals count only from approvers (issue 20, finding 5; S36), with real Unix users.

The daemon runs with ``[spool] approvers_group`` set. A decision file is placed atomically
(written elsewhere, owned and moded as the case needs, then renamed in), so the daemon sees
exactly the owner, links, mode and ACL the case sets up. Only the last case is an approval.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from daemon.spool import DecisionFile, Spool, approval_refusal, new_request_id
from replay.events import DecisionRecorded
from tests.e2e.harness import Workspace, until, workspace

GROUP, ALICE, MALLORY = "bidetappr", "bidetalice", "bidetmallory"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create the approver users (CI runs as root)",
)


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, int]]:
    for name in (ALICE, MALLORY):
        subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", GROUP], capture_output=True)
    _run("groupadd", GROUP)
    try:
        _run("useradd", "-M", "-N", "-G", GROUP, ALICE)
        _run("useradd", "-M", "-N", MALLORY)
        yield {name: pwd.getpwnam(name).pw_uid for name in (ALICE, MALLORY)}
    finally:
        for name in (ALICE, MALLORY):
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


def _place(
    ws: Workspace,
    op: str,
    *,
    owner: int,
    escalation: int | None = 1,
    mode: int = 0o640,
    link: bool = False,
    acl_for: str | None = None,
) -> str:
    spool = Spool(ws.root / "state" / "spool")
    rid = new_request_id()
    staging = ws.root / "staging"
    staging.mkdir(exist_ok=True)
    path = staging / f"{rid}.json"
    path.write_bytes(msgspec.json.encode(DecisionFile(1, rid, op, "abandon", "", escalation)))
    os.chown(path, owner, -1)
    os.chmod(path, mode)
    if link:
        os.link(path, staging / f"{rid}.second")
    if acl_for is not None:
        _run("setfacl", "-m", f"u:{acl_for}:rw", str(path))
    os.rename(path, spool.decisions / path.name)
    return rid


def _outcome(ws: Workspace, rid: str) -> tuple[str, str]:
    spool = Spool(ws.root / "state" / "spool")
    until(lambda: spool.read_receipt(rid, decision=True) is not None, what=f"the receipt of {rid}")
    receipt = spool.read_receipt(rid, decision=True)
    assert receipt is not None
    return receipt.status, receipt.reason


def test_only_an_approver_s_own_plain_file_naming_the_escalation_counts(
    tmp_path: Path, users: dict[str, int]
) -> None:
    cases = ("by-daemon", "by-outsider", "linked", "acl", "writable", "unnumbered", "approved")
    jobs: dict[str, str | list[object]] = dict.fromkeys(cases, "paused")
    extra = f'\n[spool]\napprovers_group = "{GROUP}"\n'
    with workspace(tmp_path, jobs, config_extra=extra) as ws:
        text = ws.config.read_text()
        if "[spool]" in text.split(extra)[0]:
            pytest.skip("the harness config already has a [spool] table")
        daemon = ws.start_daemon()
        for op in cases:
            assert ws.watch(op, op, "--max-requests", "3").returncode == 0
        until(
            lambda: all(ws.log().ops[op].phase == "escalated" for op in cases),
            what="every case to escalate",
        )
        alice = users[ALICE]
        rids = {
            "by-daemon": _place(ws, "by-daemon", owner=os.geteuid()),
            "by-outsider": _place(ws, "by-outsider", owner=users[MALLORY]),
            "linked": _place(ws, "linked", owner=alice, link=True),
            "writable": _place(ws, "writable", owner=alice, mode=0o666),
            "unnumbered": _place(ws, "unnumbered", owner=alice, escalation=None),
        }
        if shutil.which("setfacl"):
            rids["acl"] = _place(ws, "acl", owner=alice, acl_for=MALLORY)
        expected = {
            "by-daemon": "daemon's own user",
            "by-outsider": "not in the approvers'",
            "linked": "2 hard links",
            "writable": "writable by group or others",
            "unnumbered": "names no escalation number",
            "acl": "POSIX ACL",
        }
        for case, rid in rids.items():
            status, reason = _outcome(ws, rid)
            assert status == "rejected", (case, reason)
            assert expected[case] in reason, (case, reason)

        # The directory opened to everyone after start: decisions wait, then go on.
        decisions = tmp_path / "state" / "spool" / "decisions"
        os.chmod(decisions, 0o733)
        until(lambda: "decisions are not read" in daemon.output(), what="the unsafe dir seen")
        good = _place(ws, "approved", owner=alice)
        spool = Spool(ws.root / "state" / "spool")
        assert spool.read_receipt(good, decision=True) is None
        os.chmod(decisions, 0o730)
        assert _outcome(ws, good)[0] == "recorded"
        [decided] = [
            e
            for _, e in ws.log().events
            if isinstance(e, DecisionRecorded) and e.operation_id == "approved"
        ]
        assert decided.approver == ALICE  # from the kernel, not from the file
        assert all(ws.log().ops[op].phase == "escalated" for op in rids)
        assert daemon.stop() == 0


def test_root_approves_only_when_the_config_says_so(tmp_path: Path, users: dict[str, int]) -> None:
    path = tmp_path / "d.json"
    path.write_text("{}")
    os.chmod(path, 0o640)
    st = os.stat(path)  # owned by root: the test runs as root
    assert st.st_uid == 0
    refusal = approval_refusal(
        path, st, approvers_group=GROUP, daemon_uid=users[MALLORY], allow_root=False
    )
    assert refusal is not None
    assert "owned by root" in refusal
    # Allowed, root must still be an approver by group: it is not in GROUP here.
    allowed = approval_refusal(
        path, st, approvers_group=GROUP, daemon_uid=users[MALLORY], allow_root=True
    )
    assert allowed is not None
    assert "not in the approvers' group" in allowed
