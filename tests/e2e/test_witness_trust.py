"""Who may publish to a witness, and what a witness's word is worth (issue 34).

A real daemon makes a real log and its signed heads once; each test then runs a real
`bide witness serve` on 127.0.0.1 and talks to it over HTTP(S) as a stranger, as a publisher
with the wrong credentials or the wrong keys, or as a flood. A lying witness is a real HTTP
server that answers with a forged head, asked by a real `bide verify` and a real `bide run`.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgspec
import pytest

from daemon.witness.service import (
    MAX_BODY,
    held_heads,
    load_or_create_key,
    public_key_text,
    write_token,
)
from eventlog import keys
from eventlog.envelope import decode_record, encode_record, record_hash
from eventlog.headchain import Proof, countersign_message, genesis_line
from eventlog.heads import Head, read_heads
from eventlog.keys import fingerprint
from tests.e2e.harness import Workspace, drop_registration, until, workspace
from tests.e2e.test_snapshot import FAST
from tests.e2e.test_witness import (
    JOBS,
    _free_port,
    _private_ca,
    log_id_of,
    witness_service,
    witness_setup,
)


@dataclass(frozen=True)
class Made:
    """A real log's signed heads, what a publisher sends on first contact."""

    ws: Workspace
    log_id: str
    heads: list[Head]
    genesis: str
    verify_pub: Path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Made]:
    tmp = tmp_path_factory.mktemp("made")
    with workspace(tmp, JOBS) as ws:
        ws.write_profile(contract=FAST)
        daemon = ws.start_daemon()
        drop_registration(ws, "op-0", "job-0")
        heads_file = tmp / "state" / "heads.jsonl"
        until(lambda: len(read_heads(heads_file)) >= 3, what="three signed heads")
        assert daemon.stop() == 0
        heads = read_heads(heads_file)
        genesis = genesis_line(tmp / "state" / "log")
        assert genesis is not None
        yield Made(ws, heads[0].log, heads, genesis, tmp / "keys" / "verify.pub")


def _body(heads: list[Head], proof: Proof | None) -> bytes:
    return msgspec.json.encode({"heads": heads, "proof": proof})


def _post(url: str, body: bytes, token: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.post(f"{url}/v1/heads", content=body, headers=headers, timeout=10)


def _get(url: str, log_id: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/heads/{log_id}", timeout=5)


def test_an_unauthenticated_post_is_refused_and_changes_nothing(made: Made, tmp_path: Path) -> None:
    setup = witness_setup(tmp_path / "w")
    setup.trust(made.log_id, made.verify_pub)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    body = _body(made.heads, Proof(made.genesis))
    with witness_service(setup.root, port):
        for token in (None, "not-the-token-0123456789abcdef"):
            r = _post(url, body, token)
            assert r.status_code == 401, r.text
            assert "Bearer" in r.headers["www-authenticate"]
            assert _get(url, made.log_id).status_code == 404
        assert held_heads(setup.root / "state.jsonl") == []
        # The same heads with the log's token: accepted and countersigned.
        r = _post(url, body, setup.token.read_text().strip())
        assert r.status_code == 200, r.text
        held = msgspec.convert(r.json()["head"], Head)
        assert (held.seq, held.hash) == (made.heads[-1].seq, made.heads[-1].hash)
        assert held.countersig


def test_heads_not_signed_by_the_trusted_root_or_of_an_untrusted_log_are_refused(
    made: Made, tmp_path: Path
) -> None:
    setup = witness_setup(tmp_path / "w")
    other_keys = tmp_path / "other-keys"
    keys.generate(other_keys)
    # The log's id, trusted with another root key: its real heads do not verify from it.
    setup.trust(made.log_id, other_keys / "verify.pub")
    # Another log, trusted and holding its own token: that token is no key to this log.
    other_log = "0" * 32
    setup.trust(other_log, other_keys / "verify.pub")
    other_token = setup.trust_dir / other_log / "token"
    other_token.unlink()
    write_token(other_token)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token = setup.token.read_text().strip()
    with witness_service(setup.root, port):
        r = _post(url, _body(made.heads, Proof(made.genesis)), token)
        assert r.status_code == 403, r.text
        assert "does not verify from the trusted verify.pub" in r.json()["reason"]
        r = _post(url, _body(made.heads, Proof(made.genesis)), other_token.read_text().strip())
        assert r.status_code == 403, r.text
        assert _get(url, made.log_id).status_code == 404
    # The right root, but a head whose signature was tampered with, or no proof at all.
    shutil.rmtree(setup.trust_dir / made.log_id)
    setup.trust(made.log_id, made.verify_pub)
    first, second = made.heads[0], made.heads[1]
    rec = decode_record(second.cp.encode())
    sig = base64.b64decode(second.sig)
    bad_sig = base64.b64encode(bytes([sig[0] ^ 1]) + sig[1:]).decode()
    forged = encode_record(msgspec.structs.replace(rec, sig=bad_sig)).decode()
    bad = msgspec.structs.replace(second, sig=bad_sig, cp=forged, hash=record_hash(forged.encode()))
    with witness_service(setup.root, port):
        r = _post(url, _body([first, bad], Proof(made.genesis)), token)
        assert r.status_code == 403, r.text
        assert "not signed by the log's trusted keys" in r.json()["reason"]
        r = _post(url, _body([first], None), token)
        assert r.status_code == 428, r.text  # first contact needs the proof
        assert _get(url, made.log_id).status_code == 404
        assert held_heads(setup.root / "state.jsonl") == []
        assert _post(url, _body([first], Proof(made.genesis)), token).status_code == 200
        # Held, and what follows now verifies against the key it keeps: no proof needed.
        r = _post(url, _body(made.heads, None), token)
        assert r.status_code == 200, r.text
        assert held_heads(setup.root / "state.jsonl")[-1].seq == made.heads[-1].seq


def test_an_oversized_body_is_refused_and_rate_limit_answers_429(
    made: Made, tmp_path: Path
) -> None:
    setup = witness_setup(tmp_path / "w")
    setup.trust(made.log_id, made.verify_pub)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token = setup.token.read_text().strip()
    with witness_service(setup.root, port, extra=["--rate", "1", "--burst", "4"]):
        r = _post(url, b" " * (MAX_BODY + 1), token)
        assert r.status_code == 413, r.text
        # The largest body taken is read and judged (not a list of heads: 400).
        r = _post(url, b" " * MAX_BODY, token)
        assert r.status_code == 400, r.text
        statuses = [_get(url, made.log_id) for _ in range(4)]
        limited = [r for r in statuses if r.status_code == 429]
        assert limited, [r.status_code for r in statuses]
        assert int(limited[0].headers["retry-after"]) >= 1
        assert held_heads(setup.root / "state.jsonl") == []


def test_an_idle_tls_connection_does_not_stop_another_client(made: Made, tmp_path: Path) -> None:
    setup = witness_setup(tmp_path / "w")
    _, cert, key = _private_ca(setup.root)
    port = _free_port()
    with witness_service(setup.root, port, tls=(cert, key), extra=["--timeout", "30"]):
        idle = socket.create_connection(("127.0.0.1", port))  # connects, says nothing
        try:
            started = time.monotonic()
            r = httpx.get(
                f"https://127.0.0.1:{port}/v1/heads/{made.log_id}", timeout=5, verify=False
            )  # the point is the server, not the CA
            assert r.status_code == 404
            assert time.monotonic() - started < 3
        finally:
            idle.close()


def test_one_address_cannot_take_every_connection(made: Made, tmp_path: Path) -> None:
    setup = witness_setup(tmp_path / "w")
    _, cert, key = _private_ca(setup.root)
    port = _free_port()
    with witness_service(
        setup.root,
        port,
        tls=(cert, key),
        extra=["--timeout", "30", "--max-connections", "4", "--max-per-client", "2"],
    ):
        idle = []
        try:
            for _ in range(5):  # from another loopback address, all silent
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                idle.append(s)
            # Beyond its share, that address's connections are closed at once.
            idle[-1].settimeout(5)
            assert idle[-1].recv(1) == b""
            r = httpx.get(
                f"https://127.0.0.1:{port}/v1/heads/{made.log_id}", timeout=5, verify=False
            )
            assert r.status_code == 404
        finally:
            for s in idle:
                s.close()


class _Liar:
    """A witness that answers every GET with ``answer`` (a forged head, once the test made
    one) and acknowledges every POST."""

    def __init__(self) -> None:
        self.answer = b'{"heads": []}'
        liar = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(liar.answer)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self._send(b'{"status": "accepted"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_a_lying_witness_is_reported_as_lying_and_does_not_stop_the_daemon(tmp_path: Path) -> None:
    liar_key = load_or_create_key(tmp_path / "liar.key")
    token = tmp_path / "token"
    write_token(token)
    liar = _Liar()
    try:
        with workspace(
            tmp_path,
            JOBS,
            config_extra=(
                f'\n[witness]\nurls = ["{liar.url}/v1/heads"]\ntoken_file = "{token}"\n'
                f'witness_keys = ["{public_key_text(liar_key)}"]\nretry_seconds = 0.2\n'
                "timeout_seconds = 2\nretries = 1\n"
            ),
        ) as ws:
            ws.write_profile(contract=FAST)
            daemon = ws.start_daemon()
            log_id_of(ws)
            drop_registration(ws, "op-0", "job-0")
            heads_file = tmp_path / "state" / "heads.jsonl"
            until(lambda: len(read_heads(heads_file)) >= 2, what="signed heads")
            assert daemon.stop() == 0
            real = read_heads(heads_file)[-1]
            # A head 50 records past the log's end, countersigned by the (pinned) liar: on
            # its word alone the log would be "rolled back".
            rec = decode_record(real.cp.encode())
            cp = encode_record(
                msgspec.structs.replace(rec, seq=rec.seq + 50, prev_cp=real.hash, final=False)
            )
            forged = Head(
                real.log,
                rec.seq + 50,
                record_hash(cp),
                real.epoch,
                real.sig,
                real.t_us,
                cp.decode(),
            )
            forged = msgspec.structs.replace(
                forged,
                witness=fingerprint(liar_key.public_bytes),
                countersig=base64.b64encode(liar_key.sign(countersign_message(forged))).decode(),
            )
            liar.answer = msgspec.json.encode({"witness": forged.witness, "heads": [forged]})

            result = ws.bide(
                "verify",
                "--json",
                "--witness",
                liar.url,
                "--witness-key",
                public_key_text(liar_key),
            )
            assert result.returncode == 7, result.stdout + result.stderr
            report = json.loads(result.stdout)
            assert report["witness"]["kind"] is None  # not rolled back ...
            assert report["witness"]["finding"] == "witness_lied"  # ... but lied to
            assert report["verdict"] == "witness_lied"
            lie = report["witness_lied"][0]
            assert lie["head"]["seq"] == forged.seq
            assert "does not verify" in lie["reason"]
            text = ws.bide(
                "verify", "--witness", liar.url, "--witness-key", public_key_text(liar_key)
            )
            assert "witness_lied" in text.stdout, text.stdout

            # A real daemon asks it before it opens the log, names it, and starts.
            again = ws.start_daemon()
            until(lambda: "witness_lied" in again.output(), what="the lying witness named")
            assert liar.url.removeprefix("http://") in again.output()
            assert "rolled_back" not in again.output()
            assert again.stop() == 0
    finally:
        liar.close()


def test_expect_signer_with_another_fingerprint_fails(made: Made) -> None:
    ws = made.ws
    ok = ws.bide("verify", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    signer = json.loads(ok.stdout)["signer"]
    root = keys.load_verify_key(made.verify_pub)
    assert signer["fingerprint"] == root.fingerprint
    assert signer["epoch"] == 1
    text = ws.bide("verify")
    assert f"signer: root key {root.fingerprint}, last signed checkpoint in epoch 1" in text.stdout
    assert ws.bide("verify", "--expect-signer", root.fingerprint).returncode == 0
    wrong = ws.bide("verify", "--expect-signer", "ab" * 32)
    assert wrong.returncode == 8, wrong.stdout + wrong.stderr
    assert "SIGNER MISMATCH" in wrong.stderr
    assert root.fingerprint in wrong.stderr


def test_heads_across_epochs_verify_at_the_witness_and_against_a_rolled_back_log(
    tmp_path: Path,
) -> None:
    """Epoch keys rotate every 2 checkpoints: the witness follows the certified chain; a
    witness first reached mid-log gets the certificates in the proof; a log rolled back to
    an earlier epoch is judged rolled back (the witness's certificates prove its head), not
    a lie."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    setup = witness_setup(tmp_path / "w")
    with workspace(
        tmp_path, JOBS, config_extra="epoch_checkpoints = 2\n" + setup.config(url)
    ) as ws:
        ws.write_profile(contract=FAST)
        heads_file = tmp_path / "state" / "heads.jsonl"
        log = tmp_path / "state" / "log"
        daemon = ws.start_daemon()
        setup.trust(log_id_of(ws), ws.root / "keys" / "verify.pub")
        with witness_service(setup.root, port):
            drop_registration(ws, "op-0", "job-0")
            until(lambda: len(read_heads(heads_file)) >= 2, what="two heads")
            assert daemon.stop() == 0
            older = tmp_path / "older"
            shutil.copytree(log, older)
            daemon = ws.start_daemon()
            start_epoch = read_heads(heads_file)[-1].epoch
            until(
                lambda: read_heads(heads_file)[-1].epoch >= start_epoch + 3,
                what="three more epochs",
            )
            assert daemon.stop() == 0
            final = read_heads(heads_file)[-1]
            until(
                lambda: (
                    [(h.seq, h.hash) for h in held_heads(setup.root / "state.jsonl")][-1:]
                    == [(final.seq, final.hash)]
                ),
                what="the witness to hold the final head",
            )
            pin = ("--witness-key", setup.key_text)
            ok = ws.bide("verify", "--json", "--witness", url, *pin)
            assert ok.returncode == 0, ok.stdout + ok.stderr
            newer = tmp_path / "newer"
            shutil.copytree(log, newer)

            shutil.rmtree(log)
            shutil.copytree(older, log)
            rolled = ws.bide("verify", "--json", "--witness", url, *pin)
            assert rolled.returncode == 4, rolled.stdout + rolled.stderr
            report = json.loads(rolled.stdout)
            assert report["witness"]["kind"] == "rolled_back"
            assert report["witness_lied"] == []
            shutil.rmtree(log)
            shutil.copytree(newer, log)

        # A second witness, first reached when heads.jsonl holds only the last heads: the
        # daemon's proof carries the key certificates, read from the log.
        second = tmp_path / "w2"
        second.mkdir()
        shutil.copy2(setup.root / "witness.key", second / "witness.key")
        shutil.copytree(setup.trust_dir, second / "trust")
        lines = heads_file.read_bytes().splitlines(keepends=True)
        heads_file.write_bytes(b"".join(lines[-2:]))
        shutil.rmtree(tmp_path / "state" / "witness")  # the publisher's cursors
        assert read_heads(heads_file)[0].epoch > 1  # certificates are needed to reach it
        with witness_service(second, port):
            daemon = ws.start_daemon()
            until(
                lambda: (
                    held_heads(second / "state.jsonl")[-1:] != []
                    and held_heads(second / "state.jsonl")[-1].seq == read_heads(heads_file)[-1].seq
                ),
                what="the second witness to catch up",
            )
            assert daemon.stop() == 0
            assert "witness rejects" not in daemon.output(), daemon.output()
