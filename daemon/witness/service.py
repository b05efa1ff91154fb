"""`bide witness`: remembers the latest head of each trusted log, refuses heads that do not
extend it or that the log's keys did not sign, and countersigns the heads it accepts. Meant to
run on another host, under another user.

Who may publish (the trust directory, ``--trust-dir``): one subdirectory per log id, holding
that log's ``verify.pub`` (its root key) and ``token`` (a secret shared with the daemon that
publishes it, 0600). A POST must carry ``Authorization: Bearer <token>`` of the log it
publishes, or it is refused (401) before its body is read. A head is accepted only when its
checkpoint verifies through the log's certified chain of keys from that ``verify.pub``
(:mod:`eventlog.headchain`): on first contact the publisher sends the genesis record and the
key-certifying checkpoints before its first head (a proof); afterwards the witness keeps the
key in force per log, so each next head verifies against it. An unknown log, a bad token, an
unsigned or badly signed head changes nothing. GET is public: heads are public data.

State: one append-only file of JSON lines, each the state of one log after an accepted head
(the head, countersigned; the key in force; the certificates new since the line before),
fsynced before the head is acknowledged, so an acknowledged head survives SIGKILL or power
loss. On start the file is read back (a torn last line -- a crash while writing it, never
acknowledged -- is ignored) and compacted to one line per log, and again whenever it has grown
to several times that.

A head extends the one held when the checkpoint records sent with it link, by ``prev_cp``,
back to the held head's record hash (:func:`eventlog.heads.extends`).

Bounds: the request body (``MAX_BODY``), the logs (the trust directory), the heads kept (the
latest per log, plus the log's key certificates), concurrent connections (in all and per client
address), requests per client address (429 with Retry-After), and a timeout on every socket
operation -- including the TLS handshake, done in the connection's own thread, never in the
accepting one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import socket
import ssl
import stat
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from eventlog.fsync import fsync_dir
from eventlog.headchain import (
    ChainError,
    KeyState,
    Proof,
    advance,
    countersign_message,
    head_matches,
    is_cert,
    through,
)
from eventlog.heads import Head, decode_head, extends
from eventlog.keys import Signer, fingerprint, load_verify_key

MAX_BODY = 1024 * 1024  # 256 heads (the publisher's batch) are ~130 KB; a proof adds certs
MAX_CERTS = 100_000  # key certificates kept per log (one per epoch: hourly, 11 years)
TOKEN_BYTES_MIN = 16
_LOG_ID_LEN = 32


class HeadsBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    heads: list[Head]
    proof: Proof | None = None


def load_or_create_key(path: Path) -> Signer:
    """The witness's Ed25519 key (base64 seed, 0600), created on first use; its public half
    is written next to it (``<key>.pub``, base64) for daemons and auditors to pin."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            seed = os.urandom(32)
            os.write(fd, base64.b64encode(seed) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    if os.stat(path).st_mode & 0o077:
        raise PermissionError(f"witness key {path} is readable by others; fix: chmod 600 {path}")
    raw = base64.b64decode(path.read_bytes().strip(), validate=True)
    signer = Signer(Ed25519PrivateKey.from_private_bytes(raw))
    pub = path.with_name(path.name + ".pub")
    text = public_key_text(signer) + "\n"
    if not pub.exists() or pub.read_text() != text:
        pub.write_text(text)
    return signer


def public_key_text(signer: Signer) -> str:
    """The witness's public key as daemons pin it ([witness] witness_keys, --witness-key)."""
    return base64.b64encode(signer.public_bytes).decode("ascii")


@dataclass(frozen=True)
class Trusted:
    """A log the witness takes heads of: its root key and its publisher's token."""

    root: bytes = b""  # raw public key from verify.pub
    token_digest: bytes = b""  # sha256 of the token (compared in constant time)


class TrustError(Exception):
    """The trust directory is not usable; the message names the file and the fix."""


def load_trust(directory: Path) -> dict[str, Trusted]:
    """``directory/<log id>/verify.pub`` and ``.../token`` for every log id in it."""
    if not directory.is_dir():
        raise TrustError(
            f"trust directory {directory} does not exist; create it with one "
            f"subdirectory per log id holding verify.pub and token"
        )
    out: dict[str, Trusted] = {}
    for entry in sorted(directory.iterdir()):
        if not entry.is_dir():
            continue
        log = entry.name
        if len(log) != _LOG_ID_LEN or any(c not in "0123456789abcdef" for c in log):
            raise TrustError(f"{entry}: not a log id (32 hex digits, as `bide log head` prints it)")
        try:
            root = load_verify_key(entry / "verify.pub").raw
        except Exception as exc:  # a KeyFileError names the file
            raise TrustError(f"{entry / 'verify.pub'}: {exc}") from None
        out[log] = Trusted(root, hashlib.sha256(read_token(entry / "token")).digest())
    return out


def read_token(path: Path) -> bytes:
    """A token file's secret (stripped); refuses one others may read. Never shows it."""
    try:
        st = path.stat()
        data = path.read_bytes().strip()
    except OSError as exc:
        raise TrustError(
            f"cannot read token {path}: {exc.strerror}; create it with "
            f"`bide witness token --out {path}`"
        ) from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise TrustError(f"token {path} is readable by group or others; fix: chmod 600 {path}")
    if len(data) < TOKEN_BYTES_MIN:
        raise TrustError(
            f"token {path} is shorter than {TOKEN_BYTES_MIN} characters; "
            f"create one with `bide witness token --out {path}`"
        )
    return data


def write_token(path: Path) -> None:
    """A new random token, 0600, never overwriting one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


class Verdict(msgspec.Struct, frozen=True, omit_defaults=True):
    status: str  # "accepted", "refused", or "pending" (a part of a proof was kept)
    head: Head | None = None  # accepted: the head now held, countersigned
    reason: str = ""
    held: Head | None = None  # refused as a fork: the head held


class Entry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of the state file: a log's state after an accepted head."""

    log: str
    head: Head
    keys: KeyState
    certs: list[str] = msgspec.field(default_factory=list)  # new since the log's last line


@dataclass
class LogState:
    head: Head | None = None
    keys: KeyState | None = None
    certs: list[str] | None = None
    #: A proof sent in parts ahead of the heads (a long-lived log has more certificates than
    #: one body holds), kept in memory until the heads it is for arrive.
    pending: Proof | None = None


_entry_decoder = msgspec.json.Decoder(Entry)


class WitnessState:
    """The latest head, key state and key certificates per log, backed by the state file."""

    def __init__(self, path: Path, key: Signer, trust: dict[str, Trusted] | None = None) -> None:
        self.path = path
        self.key = key
        self.fingerprint = fingerprint(key.public_bytes)
        self.trust = trust or {}
        self._lock = threading.Lock()
        self.logs: dict[str, LogState] = {}
        self._lines = 0
        self._load()
        self.compact()

    @property
    def latest(self) -> dict[str, Head]:
        return {log: s.head for log, s in self.logs.items() if s.head is not None}

    def certs(self, log: str) -> list[str]:
        state = self.logs.get(log)
        return list(state.certs or []) if state is not None else []

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = _entry_decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError):
                try:  # a line of an earlier witness: a head alone, with no key state
                    head = decode_head(line)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue  # a torn last line
                self.logs[head.log] = LogState(head)
                continue
            state = self.logs.setdefault(entry.log, LogState())
            certs = (state.certs or []) if state.keys is not None else []
            state.head, state.keys, state.certs = entry.head, entry.keys, certs + entry.certs

    def compact(self) -> None:
        """Rewrite the state file as one line per log (atomically, durably)."""
        with self._lock:
            lines = [
                _encode_entry(log, s, s.certs or [])
                for log, s in sorted(self.logs.items())
                if s.head is not None and s.keys is not None
            ]
            lines += [
                msgspec.json.encode(s.head) + b"\n"
                for s in self.logs.values()
                if s.head is not None and s.keys is None
            ]
            tmp = self.path.with_name(self.path.name + ".tmp")
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"".join(lines))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
            self._lines = len(lines)

    def offer(self, chain: list[Head], proof: Proof | None = None) -> tuple[int, Verdict]:
        """Accept ``chain`` (consecutive heads of one log, oldest first) when the log is
        trusted, its heads verify through the log's keys, and they extend the head held; the
        newest becomes the held head, durably. Returns (HTTP status, verdict)."""
        if not chain:
            return 400, Verdict("refused", reason="no heads")
        log = chain[0].log
        if any(h.log != log for h in chain):
            return 400, Verdict("refused", reason="heads of several logs in one request")
        trusted = self.trust.get(log)
        if trusted is None:
            return 403, Verdict(
                "refused", reason=f"log {log[:32]} is not in this witness's trust directory"
            )
        with self._lock:
            state = self.logs.setdefault(log, LogState())
            held = state.head
            why = extends(held, chain)
            if why is not None:
                return 409, Verdict("refused", reason=why, held=held)
            new = [h for h in chain if held is None or h.seq > held.seq]
            if not new:
                return 200, Verdict("accepted", head=held)  # nothing new
            keys, certs, problem = self._keys_for(
                state, trusted.root, proof or state.pending, new[0].seq
            )
            if keys is None:
                return (
                    428 if problem.startswith("no proof") else 403,
                    Verdict("refused", reason=problem),
                )
            added = []
            for h in new:
                mismatch = head_matches(h)
                if mismatch is not None:
                    return 403, Verdict("refused", reason=mismatch)
                try:
                    keys = advance(keys, trusted.root, h.cp)
                except ChainError as exc:
                    return 403, Verdict(
                        "refused",
                        reason=f"head {h.seq} is not signed by the log's trusted keys: {exc}",
                    )
                if is_cert(h.cp):
                    added.append(h.cp)
            if len(certs) + len(added) > MAX_CERTS:
                return 507, Verdict(
                    "refused",
                    reason=f"log {log} has more than {MAX_CERTS} key certificates at this witness",
                )
            newest = new[-1]
            head = msgspec.structs.replace(
                newest,
                countersig=base64.b64encode(self.key.sign(countersign_message(newest))).decode(
                    "ascii"
                ),
                witness=self.fingerprint,
                received_t_us=_now_us(),
            )
            fresh = certs is not state.certs  # rebuilt from a proof: the line holds them all
            self._append(Entry(log, head, keys, (certs if fresh else []) + added))
            state.head, state.keys, state.certs = head, keys, certs + added
            state.pending = None
        if self._lines > 4 * max(len(self.logs), 16):
            self.compact()
        return 200, Verdict("accepted", head=head)

    def _keys_for(
        self, state: LogState, root: bytes, proof: Proof | None, first: int
    ) -> tuple[KeyState | None, list[str], str]:
        """The key state to check the first new head at ``first`` with, the certificates
        known, or None and why not."""
        if state.keys is not None and state.head is not None:
            return state.keys, state.certs or [], ""
        if proof is None:
            return (
                None,
                [],
                (
                    "no proof: this witness holds no key state for the log yet; send "
                    "its genesis record and key certificates with the heads"
                ),
            )
        if len(proof.certs) > MAX_CERTS:
            return None, [], f"the proof holds more than {MAX_CERTS} certificates"
        try:
            keys = through(root, proof, first)
        except ChainError as exc:
            return None, [], f"the proof does not verify from the trusted verify.pub: {exc}"
        if state.head is not None and keys.log != state.head.log:
            return None, [], "the proof is of another log"
        return keys, [c for c in proof.certs if is_cert(c)], ""

    def stash_proof(self, log: str, part: Proof) -> tuple[int, Verdict]:
        """Keep one part of a proof sent ahead of the heads: the first part carries the
        genesis record (and starts over), the next ones more certificates, in order. Checked
        when the heads come; at most ``MAX_CERTS`` certificates are kept per log."""
        if log not in self.trust:
            return 403, Verdict(
                "refused", reason=f"log {log[:32]} is not in this witness's trust directory"
            )
        with self._lock:
            state = self.logs.setdefault(log, LogState())
            if part.genesis:
                state.pending = part
            elif state.pending is None:
                return 428, Verdict(
                    "refused",
                    reason="no proof: its first part (with the genesis record) was not received",
                )
            else:
                certs = state.pending.certs + part.certs
                if len(certs) > MAX_CERTS:
                    state.pending = None
                    return 413, Verdict(
                        "refused", reason=f"a proof of more than {MAX_CERTS} certificates"
                    )
                state.pending = Proof(state.pending.genesis, certs)
            return 202, Verdict("pending")

    def _append(self, entry: Entry) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, (b"\n" if torn else b"") + msgspec.json.encode(entry) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self._lines += 1

    def authenticated_log(self, authorization: str | None) -> str | None:
        """The log whose token ``authorization`` ("Bearer <token>") carries, or None. Every
        trusted log's digest is compared, each in constant time."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        digest = hashlib.sha256(authorization[7:].strip().encode("utf-8", "replace")).digest()
        found = None
        for log, trusted in self.trust.items():
            if hmac.compare_digest(digest, trusted.token_digest):
                found = log
        return found


def _encode_entry(log: str, state: LogState, certs: list[str]) -> bytes:
    assert state.head is not None
    assert state.keys is not None
    return msgspec.json.encode(Entry(log, state.head, state.keys, certs)) + b"\n"


def _now_us() -> int:
    return time.time_ns() // 1000


class RateLimiter:
    """A token bucket per client address: ``rate`` requests a second, ``burst`` at once."""

    MAX_CLIENTS = 10_000

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def wait_for(self, client: str) -> float:
        """0 when ``client`` may go on now (one request taken), else seconds to wait."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                return (1.0 - tokens) / self.rate
            if client not in self._buckets and len(self._buckets) >= self.MAX_CLIENTS:
                self._buckets = {
                    c: b
                    for c, b in self._buckets.items()
                    if b[0] + (now - b[1]) * self.rate < self.burst
                }
                if len(self._buckets) >= self.MAX_CLIENTS:
                    return 1.0  # as many clients in debt as it remembers: new ones wait
            self._buckets[client] = (tokens - 1.0, now)
            return 0.0


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    max_per_client: int = 8  # connections at once from one client address
    timeout_seconds: float = 5.0  # every socket operation, the TLS handshake included
    rate: float = 20.0  # requests a second per client address
    burst: int = 40


def _handler(
    state: WitnessState, limiter: RateLimiter, timeout_seconds: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "bide-witness"
        timeout = timeout_seconds  # StreamRequestHandler sets it on the socket

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown the service's own messages

        def _reply(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
            data = msgspec.json.encode(body)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _admitted(self) -> bool:
            wait = limiter.wait_for(str(self.client_address[0]))
            if wait > 0:
                self._reply(
                    429,
                    {"error": "too many requests from this address"},
                    {"retry-after": str(max(1, int(wait + 0.999)))},
                )
            return wait == 0

        def do_GET(self) -> None:
            if not self._admitted():
                return
            parts = self.path.rstrip("/").split("/")
            if parts[:3] == ["", "v1", "heads"] and len(parts) == 3:
                held = [state.latest[log] for log in sorted(state.latest)]
                self._reply(200, {"witness": state.fingerprint, "heads": held})
            elif parts[:3] == ["", "v1", "heads"] and len(parts) == 4:
                head = state.latest.get(parts[3])
                self._reply(
                    200 if head else 404,
                    {
                        "witness": state.fingerprint,
                        "heads": [head] if head else [],
                        "certs": state.certs(parts[3]) if head else [],
                    },
                )
            else:
                self._reply(404, {"error": "GET /v1/heads or /v1/heads/<log id>"})

        def do_POST(self) -> None:
            if not self._admitted():
                return
            if self.path.rstrip("/") != "/v1/heads":
                self._reply(404, {"error": "POST /v1/heads"})
                return
            log = state.authenticated_log(self.headers.get("authorization"))
            if log is None:
                self._reply(
                    401,
                    {"error": "a publisher must send Authorization: Bearer <the log's token>"},
                    {"www-authenticate": 'Bearer realm="bide-witness"'},
                )
                return
            try:
                length = int(self.headers.get("content-length", ""))
            except ValueError:
                self._reply(411, {"error": "a content-length is required"})
                return
            if not 0 < length <= MAX_BODY:
                self._reply(413, {"error": f"a body of 1..{MAX_BODY} bytes is required"})
                return
            try:
                body = msgspec.json.decode(self.rfile.read(length), type=HeadsBody)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self._reply(400, {"error": f"not a list of heads: {exc}"})
                return
            if any(h.log != log for h in body.heads):
                self._reply(403, {"error": "the token is not this log's"})
                return
            if not body.heads and body.proof is not None:
                status, verdict = state.stash_proof(log, body.proof)
            else:
                status, verdict = state.offer(body.heads, body.proof)
            self._reply(status, verdict)

    return Handler


class WitnessServer(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` at once and ``max_per_client``
    from one address (more are closed at once); the TLS handshake runs in the connection's
    thread under the socket timeout, so a client that connects and says nothing holds one
    slot for ``timeout`` seconds at most."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self.tls = tls
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._count_lock = threading.Lock()
        self._per_client: dict[str, int] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        with self._count_lock:
            mine = self._per_client.get(client, 0)
            admitted = mine < self.limits.max_per_client and self._slots.acquire(blocking=False)
            if admitted:
                self._per_client[client] = mine + 1
        if not admitted:
            self.shutdown_request(request)  # full, or that client holds its share: later
            return
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: this connection is dropped
            self._release(client)
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def _release(self, client: str) -> None:
        with self._count_lock:
            left = self._per_client.pop(client, 1) - 1
            if left > 0:
                self._per_client[client] = left
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or stalls is its own loss: no traceback per connection
        (a stranger could fill the witness's log with them)."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        sock: socket.socket = request
        sock.settimeout(self.limits.timeout_seconds)
        if self.tls is None:
            super().finish_request(sock, client_address)
            return
        try:
            wrapped = self.tls.wrap_socket(sock, server_side=True)
        except (OSError, ssl.SSLError):
            return  # a failed or stalled handshake: that client's loss only
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()


def make_server(
    state: WitnessState,
    host: str,
    port: int,
    *,
    tls: tuple[Path, Path] | None = None,
    limits: Limits | None = None,
) -> WitnessServer:
    limits = limits or Limits()
    ctx = None
    if tls is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
    handler = _handler(state, RateLimiter(limits.rate, limits.burst), limits.timeout_seconds)
    return WitnessServer((host, port), handler, limits, ctx)


def ingest(
    state: WitnessState, heads: list[Head], proof: Proof | None = None
) -> list[tuple[str, Verdict]]:
    """Offer the heads of a heads file, log by log, in order."""
    by_log: dict[str, list[Head]] = {}
    for h in heads:
        by_log.setdefault(h.log, []).append(h)
    out = []
    for log, chain in by_log.items():
        held = state.latest.get(log)
        if held is not None:
            # What the file holds from the held head on; the held one proves the link.
            chain = [h for h in chain if h.seq >= held.seq] or chain[-1:]
        out.append((log, state.offer(chain, proof)[1]))
    return out


def held_heads(path: Path) -> list[Head]:
    """The heads in a witness state file, in order (lines of either format)."""
    out = []
    for line in path.read_bytes().split(b"\n") if path.exists() else []:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            out.append(_entry_decoder.decode(line).head)
            continue
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            out.append(decode_head(line))
    return out


def to_json(verdict: Verdict) -> str:
    return json.dumps(msgspec.to_builtins(verdict))
