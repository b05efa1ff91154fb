"""`bide witness`: remembers the latest head of each log, refuses heads that do not extend it,
and countersigns the heads it accepts. Meant to run on another host, under another user.

State: one append-only file of heads (JSON lines, each the accepted head with the witness's
countersignature), fsynced before a head is acknowledged, so an acknowledged head survives
SIGKILL or power loss. On start the file is read back; a torn last line (a crash while
writing it, never acknowledged) is ignored and a fresh line started after it.

A head extends the one held when the checkpoint records sent with it link, by ``prev_cp``,
back to the held head's record hash (:func:`eventlog.heads.extends`). The first head of a
log is accepted as it comes (trust on first use): start the witness before the daemon.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from eventlog.heads import Head, encode_head, extends, read_heads
from eventlog.keys import Signer, fingerprint

_COUNTERSIGN_DOMAIN = b"bide.witness.v1\n"
MAX_BODY = 8 * 1024 * 1024


class HeadsBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    heads: list[Head]


def countersign_message(head: Head) -> bytes:
    return b"".join((_COUNTERSIGN_DOMAIN, bytes.fromhex(head.log),
                     head.seq.to_bytes(8, "big"), bytes.fromhex(head.hash)))


def load_or_create_key(path: Path) -> Signer:
    """The witness's Ed25519 key (base64 seed, 0600), created on first use."""
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
    return Signer(Ed25519PrivateKey.from_private_bytes(raw))


class Verdict(msgspec.Struct, frozen=True):
    status: str  # "accepted" or "refused"
    head: Head | None = None  # accepted: the head now held, countersigned
    reason: str = ""
    held: Head | None = None  # refused: the head held


class WitnessState:
    """The latest head per log, backed by the append-only state file."""

    def __init__(self, path: Path, key: Signer) -> None:
        self.path = path
        self.key = key
        self.fingerprint = fingerprint(key.public_bytes)
        self._lock = threading.Lock()
        self.latest: dict[str, Head] = {}
        for head in read_heads(path):
            self.latest[head.log] = head

    def offer(self, chain: list[Head]) -> Verdict:
        """Accept ``chain`` (consecutive heads of one log, oldest first) when it extends the
        head held for that log; the newest becomes the held head, durably."""
        if not chain:
            return Verdict("refused", reason="no heads")
        log = chain[0].log
        if any(h.log != log for h in chain):
            return Verdict("refused", reason="heads of several logs in one request")
        with self._lock:
            held = self.latest.get(log)
            why = extends(held, chain)
            if why is not None:
                return Verdict("refused", reason=why, held=held)
            newest = max(chain, key=lambda h: h.seq)
            if held is not None and newest.seq <= held.seq:
                return Verdict("accepted", head=held)  # nothing new
            head = msgspec.structs.replace(
                newest, countersig=base64.b64encode(
                    self.key.sign(countersign_message(newest))).decode("ascii"),
                witness=self.fingerprint, received_t_us=_now_us())
            self._append(head)
            self.latest[log] = head
            return Verdict("accepted", head=head)

    def _append(self, head: Head) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, (b"\n" if torn else b"") + encode_head(head) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


def _now_us() -> int:
    return time.time_ns() // 1000


def _handler(state: WitnessState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "bide-witness"
        timeout = 10  # seconds per socket operation: a client that stalls loses its thread

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would drown the service's own messages

        def _reply(self, status: int, body: object) -> None:
            data = msgspec.json.encode(body)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = self.path.rstrip("/").split("/")
            if parts[:3] == ["", "v1", "heads"] and len(parts) == 3:
                held = [state.latest[log] for log in sorted(state.latest)]
                self._reply(200, {"witness": state.fingerprint, "heads": held})
            elif parts[:3] == ["", "v1", "heads"] and len(parts) == 4:
                head = state.latest.get(parts[3])
                self._reply(200 if head else 404,
                            {"witness": state.fingerprint, "heads": [head] if head else []})
            else:
                self._reply(404, {"error": "GET /v1/heads or /v1/heads/<log id>"})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/heads":
                self._reply(404, {"error": "POST /v1/heads"})
                return
            try:
                length = int(self.headers.get("content-length", "0"))
            except ValueError:
                length = -1
            if not 0 < length <= MAX_BODY:
                self._reply(400, {"error": f"a body of 1..{MAX_BODY} bytes is required"})
                return
            try:
                body = msgspec.json.decode(self.rfile.read(length), type=HeadsBody)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self._reply(400, {"error": f"not a list of heads: {exc}"})
                return
            verdict = state.offer(body.heads)
            self._reply(200 if verdict.status == "accepted" else 409, verdict)

    return Handler


def make_server(state: WitnessState, host: str, port: int, *,
                tls: tuple[Path, Path] | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), _handler(state))
    if tls is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return server


def ingest(state: WitnessState, heads: list[Head]) -> list[tuple[str, Verdict]]:
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
        out.append((log, state.offer(chain)))
    return out


def to_json(verdict: Verdict) -> str:
    return json.dumps(msgspec.to_builtins(verdict))
