"""Hostile input from the other side of the spool, against the real daemon.

``tests/e2e/test_daemon.py`` covers malformed JSON, a symlink to /etc/passwd, a 600 KB file, an
unknown provider, one path-escaping job id and one option never offered. These add: a sparse
file of 10 GB, a FIFO (a read would block forever), a dangling symlink and a symlink to a
directory, a hard link to a secret (its content must not surface in the reason), duplicate
registrations (same job: idempotent; another job under a taken id: refused), files dropped
in the wrong directory, a batch of job ids built to escape the status path, and decisions that
name an unknown operation, a stale escalation, an option never offered, an oversized note. A job id
of ``.`` or ``..`` is refused at the spool: percent-encoding does not keep a dot segment in place
(RFC 3986 §6.2.2.2 lets a normaliser decode ``%2E``, and §5.2.4 then removes the segment).
Each is refused with a reason beside it and changes nothing else: no operation appears, the
escalation stays open with its counters, and the provider sees only well-formed status paths.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from daemon.spool import DecisionFile, RegistrationFile, Spool, new_request_id
from replay.events import DecisionRecorded, DecisionRejected
from replay.observations import Registration
from tests.e2e.harness import Workspace, until, workspace

ESCAPES = [
    "%2e%2e",
    "...",
    "a/../../_sim/requests",
    "x?y=1#z",
    "/etc/passwd",
    "\u202eevil",
    "%00",
    "a%2F..%2F..%2Fb",
    "\\..\\..",
    ";..;",
]
DOTS = [".", ".."]  # no encoding keeps a dot segment in place: refused at the spool


def _registration(op: str, job: str) -> bytes:
    rid = new_request_id()
    reg = Registration(operation_id=op, provider="sim", provider_job_id=job)
    return msgspec.json.encode(RegistrationFile(1, rid, reg))


def _drop(directory: Path, data: bytes, rid: str | None = None) -> str:
    if rid is None:
        found = msgspec.json.decode(data, type=dict[str, object]).get("request_id")
        rid = found if isinstance(found, str) else new_request_id()
    Spool(directory.parent).drop(directory, rid, data)
    return rid


def name() -> str:
    return new_request_id() + ".json"


def _reasons(spool: Spool) -> list[str]:
    return sorted(p.read_text() for p in spool.rejected.glob("*.reason"))


def test_hostile_spool_files_are_refused_and_change_nothing(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret-value-81f3\n")
    with workspace(
        tmp_path,
        {
            "esc": "queued, manual_review",
            "fine": "running",
            **dict.fromkeys(ESCAPES + DOTS, "running"),
        },
    ) as ws:
        ws.start_daemon()
        spool = Spool(tmp_path / "state" / "spool")
        assert ws.watch("esc", "esc").returncode == 0
        assert ws.bide("wait", "esc", "--timeout", "30s").returncode == 3  # escalated
        assert (
            ws.watch("fine", "fine", "--deadline", "1h", "--max-requests", "1000").returncode == 0
        )
        before = ws.log()
        esc_before = before.ops["esc"]
        rejected_before = len(_reasons(spool))

        # Built beside the spool and renamed in, so the daemon never sees it empty.
        sparse = tmp_path / "sparse.json"
        with sparse.open("wb") as f:
            f.truncate(10 * 1024**3)  # 10 GB, no blocks: a read would be the attack
        sparse.rename(spool.incoming / name())
        os.mkfifo(spool.incoming / name())
        os.symlink(tmp_path / "does-not-exist", spool.incoming / name())
        os.symlink(tmp_path, spool.decisions / name())
        os.link(secret, spool.incoming / name())
        # Registrations in the approvers' directory, decisions among the agents' files.
        _drop(spool.decisions, _registration("sneaky", "fine"))
        wrong = DecisionFile(1, new_request_id(), "esc", "abandon")
        _drop(spool.incoming, msgspec.json.encode(wrong), wrong.request_id)
        # Duplicates: the same job again is idempotent; a taken id for another job is not.
        again = _drop(spool.incoming, _registration("fine", "fine"))
        taken = _drop(spool.incoming, _registration("fine", "esc"))
        # Decisions that must not land.
        for op, option, esc_id, note in (
            ("nobody", "abandon", None, ""),
            ("esc", "abandon", 99, ""),
            ("esc", "cancel_at_provider", 1, ""),
            ("esc", "abandon", None, ""),
            ("esc", "abandon", None, "n" * 5000),
        ):
            d = DecisionFile(1, new_request_id(), op, option, note, esc_id)
            _drop(spool.decisions, msgspec.json.encode(d), d.request_id)
        refused = 13  # the same-job duplicate is not among them: it is idempotent
        until(
            lambda: len(_reasons(spool)) >= rejected_before + refused,
            timeout=20,
            what=f"{refused} refusals",
        )
        until(lambda: spool.read_receipt(again) is not None, what="the duplicate's receipt")

        reasons = _reasons(spool)
        text = "\n".join(reasons)
        for expected in (
            "limit is",
            "not a regular file",
            "symbolic link",
            "not a valid spool file",
            "not a valid decision",
            "already in use",
            "no operation or action 'nobody'",
            "escalation 99",
            "was not offered",
            "names no escalation number",
        ):
            assert expected in text, f"no reason mentions {expected!r}:\n{text}"
        assert "top-secret-value" not in text, "a refused file's content surfaced in a reason"
        assert secret.read_text() == "top-secret-value-81f3\n"
        receipt = spool.read_receipt(again)
        assert receipt is not None
        assert receipt.status == "registered"
        taken_receipt = spool.read_receipt(taken)
        assert taken_receipt is not None
        assert taken_receipt.status == "rejected"
        assert [p.name for p in spool.incoming.iterdir()] == []
        assert [p.name for p in spool.decisions.iterdir()] == []

        after = ws.log()
        assert set(after.ops) == set(before.ops), "a refused file created an operation"
        esc_after = after.ops["esc"]
        assert esc_after.phase == "escalated"
        assert esc_after.escalation == esc_before.escalation
        assert esc_after.deadline_at == esc_before.deadline_at
        assert esc_after.max_status_requests == esc_before.max_status_requests
        assert after.ops["fine"].provider_job_id == "fine"
        new_events = [e for _, e in after.events[len(before.events) :] if e.operation_id == "esc"]
        assert all(isinstance(e, DecisionRejected) for e in new_events), new_events
        assert not any(isinstance(e, DecisionRecorded) for _, e in after.events)
        _assert_status_paths_stay_put(ws)


def _assert_status_paths_stay_put(ws: Workspace) -> None:
    """Job ids built to escape the status path: each request is one segment under /jobs/,
    and names a job the provider knows (no 404, no other endpoint reached)."""
    seen = len(ws.sim.requests())
    for job in DOTS:
        refused = ws.watch(job, f"dots-{len(job)}")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "dot segment" in refused.stdout, refused.stdout
    for i, job in enumerate(ESCAPES):
        assert (
            ws.watch(job, f"escape-{i}", "--deadline", "1m", "--max-requests", "1").returncode == 0
        )

    def ended() -> bool:
        ops = ws.log().ops
        return all(ops[f"escape-{i}"].phase != "live" for i in range(len(ESCAPES)))

    until(ended, timeout=20, what="every escape-* operation to end")
    received = [r for r in ws.sim.requests()[seen:] if r.target != "/jobs/fine"]
    assert len(received) == len(ESCAPES), [(r.target, r.job_id) for r in received]
    for req in received:
        assert req.kind == "status", (req.kind, req.target)
        assert req.status == 200, (req.status, req.target)
        path = req.target
        assert path.startswith("/jobs/"), req.target
        assert "/" not in path.removeprefix("/jobs/"), req.target
        assert "?" not in req.target, req.target
        assert "#" not in req.target, req.target
