"""The whole ingest path under fuzz (issue 20): a spool file as any agent could write it, its
registration, and the first poll against a provider answering anything at all.

One real daemon serves every example. Whatever the file and the answer, the daemon stays up and
answers every file with a receipt; no request leaves for any origin but the profile's, and none
for a path outside its status resources; afterwards ``replay --check`` and ``verify`` pass and a
restart replays the log.
"""

from __future__ import annotations

import json
import string
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.spool import Spool, new_request_id
from tests.e2e.harness import DEFAULT_CONTRACT, STATES, until, workspace
from tests.faults.rawserver import RawServer

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.none())
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
STATES_SEEN = st.sampled_from(["queued", "running", "succeeded", "failed", "paused", "", "x"])


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["state", "json", "deep", "bytes"]))
    if kind == "state":
        doc = {
            "status": draw(STATES_SEEN),
            "id": draw(TEXT),
            "result_url": draw(TEXT),
            "next_check_at": draw(TEXT | NUMBERS),
            "poll_after_seconds": draw(NUMBERS),
            "expires_at": draw(TEXT | NUMBERS),
            "error": draw(JSON),
        }
        return json.dumps(doc).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(60, 3000))
        return b"[" * depth + b"]" * depth
    return draw(st.binary(max_size=300))


@st.composite
def replies(draw: st.DrawFn) -> bytes:
    status = draw(st.integers(0, 1200))
    reason = draw(st.sampled_from(["OK", "Weird", ""]))
    body = draw(bodies())
    headers = [b"Connection: close", b"Content-Length: " + str(len(body)).encode()]
    for name in draw(
        st.lists(
            st.sampled_from(
                [
                    "Retry-After",
                    "Location",
                    "RateLimit",
                    "RateLimit-Policy",
                    "X-Request-Id",
                    "Content-Type",
                    "Operation-Location",
                ]
            ),
            max_size=4,
            unique=True,
        )
    ):
        value = draw(st.text(alphabet=string.printable.strip("\r\n\x0b\x0c"), max_size=60))
        headers.append(f"{name}: {value}".encode())
    head = f"HTTP/1.1 {status} {reason}".encode()
    return b"\r\n".join([head, *headers, b"", b""]) + body


@st.composite
def registrations(draw: st.DrawFn) -> dict[str, object]:
    """Mostly plausible (so that most reach a first poll), sometimes hostile in any field."""
    reg: dict[str, object] = {
        "provider": "raw",
        "max_status_requests": 2,
        "first_poll_after_seconds": 0,
    }
    if draw(st.integers(0, 2)) == 0:
        reg.update(
            {
                "provider": draw(st.sampled_from(["raw", "nope", ""])),
                "deadline_at": draw(
                    st.one_of(st.none(), st.floats(allow_nan=False), st.floats(0, 1e10))
                ),
                "max_status_requests": draw(st.one_of(st.none(), st.integers(-5, 2_000_000))),
                "max_transport_failures": draw(st.one_of(st.none(), st.integers(-5, 50))),
                "first_poll_after_seconds": draw(st.one_of(st.none(), st.floats(-1, 0.2))),
                "account_context": draw(TEXT),
            }
        )
    if draw(st.integers(0, 3)) == 0:
        reg["status_location"] = draw(
            st.one_of(
                TEXT,
                st.sampled_from(
                    [
                        "http://127.0.0.1:1/jobs/x",
                        "http://[::1/x",
                        "http://127.0.0.1:99999/",
                        "{elsewhere}/steal",
                    ]
                ),
            )
        )
    if draw(st.integers(0, 9)) == 0:
        reg[draw(st.sampled_from(["extra", "status_url", "url"]))] = draw(TEXT)
    return reg


def test_any_spool_file_and_any_answer_leave_the_daemon_up_and_the_log_whole(
    tmp_path: Path,
) -> None:
    raw, elsewhere = RawServer(), RawServer()
    try:
        with workspace(tmp_path) as ws:
            (ws.root / "profiles" / "raw.toml").write_text(
                f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\ntimeout_seconds = 1\n\n'
                f'[credential]\nfile = "sim.token"\n\n[quota]\nrequests_per_second = 1000\n'
                f"burst = 1000\nmax_in_flight = 16\n\n[contract]\n{DEFAULT_CONTRACT}\n{STATES}"
            )
            daemon = ws.start_daemon()
            spool = Spool(ws.root / "state" / "spool")
            receipts = ws.root / "state" / "spool" / "receipts"
            counter = iter(range(10**6))
            registered: list[str] = []

            @settings(
                max_examples=80,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(
                reg=registrations(),
                reply=replies(),
                op_id=st.text(string.ascii_letters, max_size=8),
            )
            def example(reg: dict[str, object], reply: bytes, op_id: str) -> None:
                n = next(counter)
                job = f"fz{n}"
                raw.replies[job] = reply
                if reg.get("status_location") == "{elsewhere}/steal":
                    reg["status_location"] = f"{elsewhere.base_url}/steal"
                rid = new_request_id()
                body = {"operation_id": f"o{n}-{op_id}", "provider_job_id": job, **reg}
                spool.drop(
                    spool.incoming,
                    rid,
                    json.dumps({"version": 1, "request_id": rid, "registration": body}).encode(),
                )
                until(
                    lambda: (receipts / f"{rid}.json").exists(),
                    timeout=10,
                    what=f"a receipt for example {n}",
                )
                answer = json.loads((receipts / f"{rid}.json").read_text())
                assert daemon.proc.poll() is None, daemon.output()[-3000:]
                if answer["status"] == "registered":
                    registered.append(answer["operation_id"])
                    assert "status_location" not in reg, "a URL from an agent was accepted"

            example()
            assert len(registered) >= 10, "the fuzz no longer reaches the first poll"
            # Let the registered operations make their first polls, then check the record.
            until(
                lambda: (
                    all(
                        op in ws.log().ops and ws.log().ops[op].status_requests_used
                        for op in registered[-5:]
                    )
                    if registered
                    else True
                ),
                timeout=20,
                what="the last registrations to be polled",
            )
            time.sleep(0.5)
            assert daemon.proc.poll() is None, daemon.output()[-3000:]
            assert elsewhere.seen == [], "a request reached another origin"
            assert all(s.path.startswith("/jobs/fz") for s in raw.seen), [s.path for s in raw.seen]
            assert daemon.stop() == 0
            for command in (("replay", "--check"), ("verify",), ("status", "--json", "--offline")):
                done = ws.bide(*command)
                assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
            again = ws.start_daemon()
            assert again.stop() == 0
    finally:
        raw.close()
        elsewhere.close()
