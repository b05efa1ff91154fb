"""What a witness holds for one log: from `bide witness serve` at a URL, or from a witness
file. ``bide verify --witness`` checks a log against it; ``bide run`` asks every witness it
publishes to before it opens the log, so a rolled-back log is refused even where the state
directory's own ``heads.jsonl`` went back with it.

Neither believes a head on the witness's word: each must verify from the log's own
``verify.pub`` and genesis record through the key certificates the witness gives
(:func:`eventlog.headchain.head_problem`), and, from a URL, carry a countersignature by a
pinned witness key when keys are pinned. A head that fails is a lying witness's, reported as
such (:class:`Lie`), never taken as evidence that the log was rolled back."""

from __future__ import annotations

import base64
import binascii
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import certifi
import httpx
import msgspec

from eventlog.headchain import head_problems, is_cert
from eventlog.heads import Head, decode_head
from eventlog.keys import fingerprint


class WitnessUnreachable(Exception):
    """The witness could not be asked; the message names it (never a credential)."""


class _Answer(msgspec.Struct, frozen=True):
    heads: list[Head]
    certs: list[str] = msgspec.field(default_factory=list)
    witness: str = ""


class _Entry(msgspec.Struct, frozen=True):
    """A line of a `bide witness serve` state file."""

    log: str
    head: Head
    certs: list[str] = msgspec.field(default_factory=list)


@dataclass
class Witnessed:
    """What one witness returned for a log: heads, and the key certificates to check them."""

    source: str
    heads: list[Head]
    certs: list[str] = field(default_factory=list)
    url: bool = False


@dataclass(frozen=True)
class Lie:
    """A head a witness returned that does not verify: the witness lies (or was tampered)."""

    source: str
    head: Head
    reason: str


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verification on, against ``ca_file`` (a private CA's PEM) or certifi's roots."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def pinned_keys(texts: list[str]) -> dict[str, bytes]:
    """Witness public keys by fingerprint, from base64 text or files holding it (the
    ``<key>.pub`` `bide witness serve` writes). Raises ValueError naming a bad one."""
    out = {}
    for text in texts:
        value = text.strip()
        path = Path(value)
        if not _is_key(value) and path.is_file():
            value = path.read_text().strip()
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(
                f"witness key {text[:60]!r} is not a base64 Ed25519 public key "
                f"(as `bide witness serve` prints it) nor a file holding one"
            )
        out[fingerprint(raw)] = raw
    return out


def _is_key(text: str) -> bool:
    try:
        return len(base64.b64decode(text, validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


def witnessed(
    source: str, log_id: str, *, timeout: float = 10.0, ca_file: Path | None = None
) -> Witnessed:
    """What ``source`` (an http(s) URL or a file) holds for ``log_id``."""
    if source.startswith(("http://", "https://")):
        url = source.rstrip("/")
        if not url.endswith("/v1/heads"):
            url += "/v1/heads"
        try:
            response = httpx.get(
                f"{url}/{log_id}",
                timeout=timeout,
                follow_redirects=False,
                trust_env=False,
                verify=tls_context(ca_file),
            )
        except httpx.HTTPError as exc:
            raise WitnessUnreachable(
                f"witness {shown(source)} cannot be reached ({type(exc).__name__})"
            ) from None
        if response.status_code == 404:
            return Witnessed(source, [], url=True)
        if response.status_code != 200:
            raise WitnessUnreachable(f"witness {shown(source)} answered {response.status_code}")
        try:
            answer = msgspec.json.decode(response.content, type=_Answer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise WitnessUnreachable(f"witness {shown(source)} did not answer with heads") from None
        return Witnessed(source, answer.heads, answer.certs, url=True)
    path = Path(source)
    if not path.is_file():
        raise WitnessUnreachable(f"witness file {source} does not exist")
    heads: list[Head] = []
    certs: list[str] = []
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = msgspec.json.decode(line, type=_Entry)
        except (msgspec.DecodeError, msgspec.ValidationError):
            try:
                head = decode_head(line)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # a torn last line
        else:
            if entry.log == log_id:
                heads.append(entry.head)
                certs += entry.certs
            continue
        if head.log == log_id:
            heads.append(head)
            if is_cert(head.cp):  # a heads file holds every checkpoint: its certificates too
                certs.append(head.cp)
    return Witnessed(source, heads, certs)


def believed(
    w: Witnessed, root: bytes, genesis: str, pinned: dict[str, bytes] | None
) -> tuple[list[Head], list[Lie]]:
    """The heads of ``w`` that verify from ``root`` and ``genesis`` (and, from a URL with
    ``pinned`` keys, carry a countersignature by one), and the lies among them."""
    good, lies = [], []
    problems = head_problems(w.heads, root, genesis, w.certs, pinned if w.url else None)
    for head, problem in zip(w.heads, problems, strict=True):
        if problem is None:
            good.append(head)
        else:
            lies.append(Lie(w.source, head, problem))
    return good, lies


def shown(source: str) -> str:
    """A source for a message: a URL without userinfo or query; a path as it is."""
    if not source.startswith(("http://", "https://")):
        return source
    try:
        u = httpx.URL(source)
    except (httpx.InvalidURL, ValueError):
        return "(invalid URL)"
    return f"{u.scheme}://{u.host}{':' + str(u.port) if u.port else ''}{u.path}"
