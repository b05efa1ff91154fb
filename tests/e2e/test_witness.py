"""Rollback, cut and fork of a real daemon's log: refused by the daemon on open, reported by
`bide verify --witness` with their class; the `bide witness` service refuses forks, survives
SIGKILL, and is caught up with after being down. Real processes, files and a real HTTP
server on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec

from daemon.signing import log_identity
from daemon.witness.service import (
    held_heads,
    load_or_create_key,
    public_key_text,
    write_token,
)
from eventlog.envelope import decode_record, encode_record, record_hash
from eventlog.heads import Head, read_heads
from tests.e2e.harness import BIDE, Workspace, drop_registration, until, workspace
from tests.e2e.test_snapshot import FAST
from tests.eventlog._logtools import read_lines, write_lines

JOBS = {f"job-{i}": "running" for i in range(3)}


def _run(ws: Workspace, start: int, polls: int) -> None:
    """A daemon that registers op-<start>, polls ``polls`` more times, and stops cleanly."""
    daemon = ws.start_daemon()
    drop_registration(ws, f"op-{start}", f"job-{start}")
    seen = len(ws.sim.requests(kind="status"))
    ws.sim.wait_for_requests(seen + polls, kind="status", timeout=15)
    assert daemon.stop() == 0, daemon.output()


def _refused(ws: Workspace, kind: str, by: str = "this daemon published head") -> str:
    daemon = ws.start_daemon(ready=False)
    assert daemon.proc.wait(30) != 0, daemon.output()
    out = daemon.output()
    assert any(f"({k})" in out for k in kind.split("|")), out
    assert by in out, out
    assert "Traceback" not in out, out  # one line naming the fix
    return out


def _verify(ws: Workspace, witness: str | Path) -> subprocess.CompletedProcess[str]:
    return ws.bide("verify", "--json", "--witness", str(witness))


def test_rollback_cut_and_fork_are_refused_and_reported(tmp_path: Path) -> None:
    with workspace(
        tmp_path, JOBS, config_extra=('\n[witness]\nfile = "witness/heads.jsonl"\n')
    ) as ws:
        (tmp_path / "witness").mkdir()
        witness = tmp_path / "witness" / "heads.jsonl"
        ws.write_profile(contract=FAST)
        log, heads = tmp_path / "state" / "log", tmp_path / "state" / "heads.jsonl"
        _run(ws, 0, 20)
        older = tmp_path / "older"
        shutil.copytree(log, older)  # an earlier signed state (ends with a final checkpoint)
        _run(ws, 1, 20)
        until(lambda: read_heads(witness)[-1:] == read_heads(heads)[-1:], what="witness")
        ok = _verify(ws, witness)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        newer = tmp_path / "newer"
        shutil.copytree(log, newer)

        # 1. Rolled back to the earlier copy.
        shutil.rmtree(log)
        shutil.copytree(older, log)
        result = _verify(ws, witness)
        assert result.returncode == 4, result.stdout
        assert json.loads(result.stdout)["witness"]["kind"] == "rolled_back"
        out = _refused(ws, "rolled_back")
        assert read_heads(heads)[-1].hash in out  # names the published head ...
        assert "ends at signed checkpoint" in out  # ... and where the log ends

        # 1b. The state directory rolled back with it (heads.jsonl gone or older): the
        # daemon asks its witnesses before it opens the log, and they remember.
        heads.rename(tmp_path / "heads.saved")
        out = _refused(ws, "rolled_back", by=f"witness {witness} holds head")
        assert read_heads(witness)[-1].hash in out
        (tmp_path / "heads.saved").replace(heads)

        # 2. The signed end cut: the final checkpoint gone, unsigned records left.
        lines = read_lines(newer)
        last_cp = max(i for i, ln in enumerate(lines) if ln.kind == "Checkpoint")
        shutil.rmtree(log)
        shutil.copytree(newer, log)
        write_lines(log, lines[: last_cp - 1])
        result = _verify(ws, witness)
        assert result.returncode == 6, result.stdout
        assert json.loads(result.stdout)["witness"]["kind"] == "truncated"
        _refused(ws, "truncated")

        # 3. A fork: the earlier copy continued by a daemon that forgot what it published.
        # (A plain file target is no refusing witness: it will hold the fork's heads too.)
        before_fork = tmp_path / "witness-before-fork.jsonl"
        shutil.copyfile(witness, before_fork)
        shutil.rmtree(log)
        shutil.copytree(older, log)
        heads.rename(tmp_path / "heads.saved")
        (tmp_path / "state" / "witness").rename(tmp_path / "cursors.saved")
        witness.rename(tmp_path / "witness.saved")  # else the daemon would ask it, and stop
        _run(ws, 2, 30)
        seen = tmp_path / "witness.saved"
        seen.write_bytes(seen.read_bytes() + witness.read_bytes())
        seen.replace(witness)  # the file witness saw the real log, then the fork
        result = _verify(ws, witness)
        assert result.returncode == 5, result.stdout
        assert json.loads(result.stdout)["witness"]["kind"] == "forked"
        (tmp_path / "heads.saved").replace(heads)
        _refused(ws, "forked")

        # The real log, put back, is accepted again.
        shutil.rmtree(log)
        shutil.copytree(newer, log)
        assert _verify(ws, before_fork).returncode == 0
        assert _verify(ws, witness).returncode == 5  # the file also saw the fork's heads
        # The fork's head is the witness's latest: behind it or beside it, an operator decides.
        _refused(ws, "forked|rolled_back", by=f"witness {witness} holds head")
        shutil.copyfile(before_fork, witness)
        daemon = ws.start_daemon()
        assert daemon.stop() == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WitnessSetup:
    """A witness's files: its key (pinned by the daemon), the publisher's token (0600, the
    daemon's [witness] token_file) and its trust directory."""

    root: Path
    key_text: str
    token: Path

    @property
    def trust_dir(self) -> Path:
        return self.root / "trust"

    def config(self, url: str) -> str:
        """The daemon's [witness] table for this witness."""
        return (
            f'\n[witness]\nurls = ["{url}/v1/heads"]\ntoken_file = "{self.token}"\n'
            f'witness_keys = ["{self.key_text}"]\nretry_seconds = 0.2\n'
            "timeout_seconds = 2\nretries = 1\n"
        )

    def trust(self, log_id: str, verify_pub: Path) -> None:
        """Allow ``log_id``, signed by ``verify_pub``'s root key, to publish here."""
        entry = self.trust_dir / log_id
        entry.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(verify_pub, entry / "verify.pub")
        shutil.copyfile(self.token, entry / "token")
        (entry / "token").chmod(0o600)


def witness_setup(root: Path) -> WitnessSetup:
    root.mkdir(exist_ok=True)
    key = load_or_create_key(root / "witness.key")
    token = root / "publisher.token"
    write_token(token)
    (root / "trust").mkdir(exist_ok=True)
    return WitnessSetup(root, public_key_text(key), token)


def log_id_of(ws: Workspace) -> str:
    """The daemon's log id, once it made its log."""
    until(lambda: log_identity(ws.root / "state" / "log"), what="the log to exist")
    log_id = log_identity(ws.root / "state" / "log")
    assert log_id is not None
    return log_id


@contextmanager
def witness_service(
    root: Path, port: int, tls: tuple[Path, Path] | None = None, extra: Sequence[str] = ()
) -> Iterator[subprocess.Popen[str]]:
    tls_args = ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
    proc = subprocess.Popen(
        [
            *BIDE,
            "witness",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--state",
            str(root / "state.jsonl"),
            "--key",
            str(root / "witness.key"),
            "--trust-dir",
            str(root / "trust"),
            *tls_args,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert json.loads(first)["listening"] == f"127.0.0.1:{port}", first
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate(timeout=10)[0]
            raise AssertionError(f"the witness did not stop on SIGTERM: {out}") from None
        if proc.stdout is not None:
            proc.stdout.close()


def _held(url: str, log_id: str) -> Head | None:
    r = httpx.get(f"{url}/v1/heads/{log_id}", timeout=5)
    heads = msgspec.json.decode(r.content, type=dict[str, object]).get("heads") or []
    assert isinstance(heads, list)
    return msgspec.convert(heads[0], Head) if heads else None


def test_witness_service_refuses_forks_survives_sigkill_and_catches_up(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    wroot = tmp_path / "witness"
    setup = witness_setup(wroot)
    with workspace(tmp_path, JOBS, config_extra=setup.config(url)) as ws:
        ws.write_profile(contract=FAST)
        heads = tmp_path / "state" / "heads.jsonl"
        daemon = ws.start_daemon()
        log_id = log_id_of(ws)
        setup.trust(log_id, ws.root / "keys" / "verify.pub")
        with witness_service(wroot, port) as service:
            drop_registration(ws, "op-0", "job-0")
            until(lambda: read_heads(heads), what="a first signed head")
            until(lambda: _held(url, log_id) is not None, what="the witness to hold a head")
            held = _held(url, log_id)
            assert held is not None
            assert held.countersig
            # SIGKILL: what it acknowledged is in its state file.
            service.send_signal(signal.SIGKILL)
            service.wait(10)
        # The witness is down: the daemon keeps appending and signing.
        seen = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(seen + 10, kind="status", timeout=15)
        until(lambda: read_heads(heads)[-1].seq > held.seq, what="heads while it is down")
        until(
            lambda: "witness unreachable; heads stay queued on disk" in daemon.output(),
            what="the publisher to note the witness is down",
        )
        with witness_service(wroot, port):
            after = _held(url, log_id)
            assert after is not None
            assert after.seq >= held.seq  # nothing acknowledged was lost
            until(
                lambda: (
                    (h := _held(url, log_id)) is not None and h.seq == read_heads(heads)[-1].seq
                ),
                what="the witness to catch up",
            )
            until(lambda: "witness reachable again" in daemon.output(), what="its log line")

            # A forked head: a checkpoint that does not link to the held one.
            now = _held(url, log_id)
            assert now is not None
            rec = decode_record(now.cp.encode())
            # Far ahead, so the daemon's own heads cannot overtake it before it arrives (an
            # older head than the one held changes nothing and is answered as such).
            ahead = rec.seq + 1_000_000
            forged = encode_record(msgspec.structs.replace(rec, seq=ahead, prev_cp="ab" * 32))
            fork = Head(
                log_id, ahead, record_hash(forged), now.epoch, now.sig, now.t_us, forged.decode()
            )
            r = httpx.post(
                f"{url}/v1/heads",
                content=msgspec.json.encode({"heads": [fork]}),
                headers={"authorization": f"Bearer {setup.token.read_text().strip()}"},
                timeout=5,
            )
            assert r.status_code == 409, r.text
            assert "links to checkpoint hash" in r.json()["reason"]
            held_now = _held(url, log_id)
            assert held_now is not None
            # Still a head the daemon published (it may have moved on meanwhile), never the fork.
            assert held_now.seq < ahead
            assert held_now.hash in {h.hash for h in read_heads(heads)}
            assert daemon.stop() == 0
            until(
                lambda: (
                    (h := _held(url, log_id)) is not None and h.seq == read_heads(heads)[-1].seq
                ),
                what="the final head",
            )
            result = ws.bide("verify", "--json", "--witness", url)
            assert result.returncode == 0, result.stdout + result.stderr
        # Its state survives a restart: what it held is what it holds.
        state = held_heads(wroot / "state.jsonl")
        assert state[-1].seq == read_heads(heads)[-1].seq


def _private_ca(root: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for 127.0.0.1, as a private CA issues
    them to a witness host."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test witness CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = root / "ca.pem", root / "cert.pem", root / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o600)
    return paths


def test_heads_reach_a_witness_over_https_with_a_private_ca(tmp_path: Path) -> None:
    port = _free_port()
    url = f"https://127.0.0.1:{port}"
    wroot = tmp_path / "witness"
    setup = witness_setup(wroot)
    ca, cert, key = _private_ca(wroot)
    with workspace(tmp_path, JOBS, config_extra=setup.config(url) + f'ca_file = "{ca}"\n') as ws:
        ws.write_profile(contract=FAST)
        heads = tmp_path / "state" / "heads.jsonl"
        daemon = ws.start_daemon()
        setup.trust(log_id_of(ws), ws.root / "keys" / "verify.pub")
        with witness_service(wroot, port, tls=(cert, key)):
            drop_registration(ws, "op-0", "job-0")
            until(lambda: read_heads(heads), what="a first signed head")
            assert daemon.stop() == 0

            def held() -> list[tuple[int, str]]:
                return [(h.seq, h.hash) for h in held_heads(wroot / "state.jsonl")[-1:]]

            until(
                lambda: held() == [(h.seq, h.hash) for h in read_heads(heads)[-1:]],
                what="the witness to hold the final head, over TLS",
            )
            assert held_heads(wroot / "state.jsonl")[-1].countersig
            assert "witness unreachable" not in daemon.output()
            ok = ws.bide("verify", "--json", "--witness", url, "--witness-ca", str(ca))
            assert ok.returncode == 0, ok.stdout + ok.stderr
            # Against another CA the witness's certificate does not verify: refused.
            (tmp_path / "other").mkdir()
            other_ca = _private_ca(tmp_path / "other")[0]
            untrusted = ws.bide("verify", "--witness", url, "--witness-ca", str(other_ca))
            assert untrusted.returncode == 2, untrusted.stdout
            assert "cannot be reached" in untrusted.stderr
            # The daemon asks it on open, over TLS too, and opens: the log holds its head.
            again = ws.start_daemon()
            assert again.stop() == 0
            assert "could not ask a witness" not in again.output()
