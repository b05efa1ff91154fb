"""What a witness holds for one log: from `bide witness serve` at a URL, or from a witness
file. ``bide verify --witness`` checks a log against it; ``bide run`` asks every witness it
publishes to before it opens the log, so a rolled-back log is refused even where the state
directory's own ``heads.jsonl`` went back with it."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import httpx
import msgspec

from eventlog.heads import Head, read_heads


class WitnessUnreachable(Exception):
    """The witness could not be asked; the message names it (never a credential)."""


class _Heads(msgspec.Struct, frozen=True):
    heads: list[Head]


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verification on, against ``ca_file`` (a private CA's PEM) or certifi's roots."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def heads_held(source: str, log_id: str, *, timeout: float = 10.0,
               ca_file: Path | None = None) -> list[Head]:
    """The heads ``source`` (an http(s) URL or a file) holds for ``log_id``."""
    if source.startswith(("http://", "https://")):
        url = source.rstrip("/")
        if not url.endswith("/v1/heads"):
            url += "/v1/heads"
        try:
            response = httpx.get(f"{url}/{log_id}", timeout=timeout, follow_redirects=False,
                                 trust_env=False, verify=tls_context(ca_file))
        except httpx.HTTPError as exc:
            raise WitnessUnreachable(
                f"witness {_shown(source)} cannot be reached ({type(exc).__name__})") from None
        if response.status_code == 404:
            return []
        if response.status_code != 200:
            raise WitnessUnreachable(
                f"witness {_shown(source)} answered {response.status_code}")
        try:
            return msgspec.json.decode(response.content, type=_Heads).heads
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise WitnessUnreachable(
                f"witness {_shown(source)} did not answer with heads") from None
    path = Path(source)
    if not path.is_file():
        raise WitnessUnreachable(f"witness file {source} does not exist")
    return [h for h in read_heads(path) if h.log == log_id]


def _shown(source: str) -> str:
    """A URL for a message: without userinfo or query."""
    try:
        u = httpx.URL(source)
    except (httpx.InvalidURL, ValueError):
        return "(invalid URL)"
    return f"{u.scheme}://{u.host}{':' + str(u.port) if u.port else ''}{u.path}"
