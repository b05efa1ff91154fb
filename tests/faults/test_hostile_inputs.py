"""What an agent or a provider sends cannot steer the credential, crash the daemon, or poison
the log (issue 20, findings 1-3), against the real daemon and real loopback servers.

* A registration naming a URL (``status_location``) is refused: the provider at the profile's
  origin and a second host both see nothing.
* A status code of 999 is a protocol error, a 4 KB body nested 2,000 deep an unparseable
  response: recorded, the operation stopped, the daemon up; and every reader, and a restart
  with no snapshot, read the log afterwards.
* A credential file that is not one line of printable ASCII, or is open to others, refuses to
  load with an error naming the file; the request is ``not_sent``; the bytes appear nowhere.
* An idempotency key that is not visible ASCII is a usage error, before any file is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from daemon.spool import Spool, new_request_id
from replay.events import OperationStopped, StatusResponseReceived, TransportFailed
from replay.observations import Registration
from tests.e2e.harness import DEFAULT_CONTRACT, STATES, Workspace, until, workspace
from tests.faults.rawserver import RawServer


def raw_profile(ws: Workspace, raw: RawServer, credential: str = "sim.token") -> None:
    (ws.root / "profiles" / "raw.toml").write_text(
        f'[status]\nurl = "{raw.base_url}/jobs/{{job_id}}"\ntimeout_seconds = 2\n\n'
        f'[credential]\nfile = "{credential}"\n\n[contract]\n{DEFAULT_CONTRACT}\n{STATES}'
    )


def ended(ws: Workspace, *ops: str) -> bool:
    log = ws.log().ops
    return all(op in log and log[op].phase != "live" for op in ops)


def drop(ws: Workspace, reg: dict[str, object]) -> str:
    """A spool registration as an agent could write it, bypassing the CLI's checks."""
    spool = Spool(ws.root / "state" / "spool")
    rid = new_request_id()
    data = json.dumps({"version": 1, "request_id": rid, "registration": reg}).encode()
    spool.drop(spool.incoming, rid, data)
    return rid


def receipt(ws: Workspace, rid: str) -> dict[str, object]:
    path = ws.root / "state" / "spool" / "receipts" / f"{rid}.json"
    until(path.exists, what=f"the receipt of {rid}")
    result: dict[str, object] = json.loads(path.read_text())
    return result


@pytest.mark.parametrize(
    "location",
    [
        "{elsewhere}/jobs/steal",
        "{raw}/admin/users?export=all",
        "{raw}/jobs/a\tb",
        "http://127.0.0.1:99999/jobs/x",
        "http://xn--/jobs/x",
        "http://[::1/jobs/x",
    ],
)
def test_a_registration_naming_a_url_is_refused_and_nothing_is_sent(
    tmp_path: Path, raw: RawServer, elsewhere: RawServer, location: str
) -> None:
    with workspace(tmp_path) as ws:
        raw_profile(ws, raw)
        daemon = ws.start_daemon()
        url = location.format(raw=raw.base_url, elsewhere=elsewhere.base_url)
        rid = drop(
            ws,
            {
                "operation_id": "op",
                "provider": "raw",
                "provider_job_id": "late",
                "status_location": url,
            },
        )
        answer = receipt(ws, rid)
        assert answer["status"] == "rejected"
        assert "never a URL" in str(answer["reason"])
        # The daemon is up and still serves a proper registration on the same provider.
        assert (
            ws.bide(
                "watch",
                "--provider",
                "raw",
                "--job",
                "late",
                "--operation",
                "good",
                "--max-requests",
                "1",
            ).returncode
            == 0
        )
        until(lambda: ended(ws, "good"), what="the proper registration to be polled")
        assert [s.path for s in raw.seen] == ["/jobs/late"]
        assert elsewhere.seen == []
        assert daemon.proc.poll() is None


def test_status_999_and_a_deeply_nested_body_are_recorded_not_fatal(
    tmp_path: Path, raw: RawServer
) -> None:
    with workspace(tmp_path) as ws:
        raw_profile(ws, raw)
        daemon = ws.start_daemon()
        for job in ("status-999", "deep"):
            assert (
                ws.bide(
                    "watch",
                    "--provider",
                    "raw",
                    "--job",
                    job,
                    "--operation",
                    job,
                    "--max-requests",
                    "1",
                ).returncode
                == 0
            )
        until(lambda: ended(ws, "status-999", "deep"), what="both to end")
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0
        log = ws.log()
        fact = next(
            e
            for _, e in log.events
            if e.operation_id == "status-999"
            and isinstance(e, TransportFailed | StatusResponseReceived)
        )
        assert isinstance(fact, TransportFailed)
        assert (fact.kind, "999") == ("protocol_error", fact.detail.split()[2])
        stop = next(
            e for _, e in log.events if e.operation_id == "deep" and isinstance(e, OperationStopped)
        )
        assert stop.reason == "unparseable_response"
        assert "deeper than 64" in stop.detail
        # Every reader reads the log, and a start with no snapshot replays it.
        for command in (
            ("status", "--json", "--offline"),
            ("story", "deep", "--offline"),
            ("escalations", "--offline"),
            ("replay", "--check"),
            ("verify",),
        ):
            done = ws.bide(*command)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        (ws.root / "state" / "snapshot").unlink()
        again = ws.start_daemon()
        assert again.stop() == 0


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (b"tok\xc3\xa9n\n", 0o600, "non-ASCII"),
        (b"abc\x00def\n", 0o600, "control character"),
        (b"line one\nline two\n", 0o600, "one non-empty line"),
        (b"group-readable-secret-9x\n", 0o640, "chmod 0600"),
    ],
)
def test_a_hostile_credential_file_is_refused_by_name_never_by_content(
    tmp_path: Path, raw: RawServer, content: bytes, mode: int, says: str
) -> None:
    with workspace(tmp_path) as ws:
        bad = ws.root / "creds" / "bad.token"
        bad.write_bytes(content)
        os.chmod(bad, mode)
        raw_profile(ws, raw, credential="bad.token")
        daemon = ws.start_daemon()
        assert (
            ws.bide(
                "watch",
                "--provider",
                "raw",
                "--job",
                "late",
                "--operation",
                "op",
                "--deadline",
                "3s",
                "--max-requests",
                "2",
            ).returncode
            == 0
        )
        until(lambda: ended(ws, "op"), what="the operation to end at its deadline")
        assert daemon.proc.poll() is None, "the daemon died on a credential file"
        assert raw.seen == [], "a request left with a credential that cannot be sent"
        output = daemon.output()
        assert str(bad) in output
        assert says in output
        assert daemon.stop() == 0
        secret = content.strip().splitlines()[0]
        for path in (ws.root / "state").rglob("*"):
            if path.is_file():
                assert secret not in path.read_bytes(), f"credential bytes in {path}"
        assert secret.decode("latin-1") not in output
        assert secret.decode("latin-1") not in ws.bide("story", "op").stdout


def test_an_idempotency_key_that_is_not_visible_ascii_is_refused_before_the_spool(
    tmp_path: Path,
) -> None:
    with workspace(tmp_path) as ws:
        body = tmp_path / "body.json"
        body.write_text("{}")
        done = ws.bide(
            "submit", "--provider", "sim", "--body", str(body), "--idempotency-key", "clé"
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--idempotency-key" in done.stderr
        incoming = ws.root / "state" / "spool" / "incoming"
        assert not incoming.exists() or not list(incoming.iterdir())


def test_the_daemon_refuses_a_spool_submit_with_a_non_ascii_key(tmp_path: Path) -> None:
    """The CLI checks first, but a file written by hand reaches the daemon: refused there."""
    with workspace(tmp_path) as ws:
        ws.start_daemon()
        spool = Spool(ws.root / "state" / "spool")
        rid = new_request_id()
        reg = Registration(operation_id="s", provider="sim", provider_job_id="pending")
        data = msgspec.json.encode(
            {
                "version": 1,
                "request_id": rid,
                "kind": "submit",
                "registration": reg,
                "body": b"{}",
                "idempotency_key": "clé",
            }
        )
        spool.drop(spool.incoming, rid, data)
        answer = receipt(ws, rid)
        assert answer["status"] == "rejected"
        assert "idempotency_key" in str(answer["reason"])
