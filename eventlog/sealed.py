"""Sealed blobs: opaque bytes carried outside the log (through the database's catalog), under
the log's data key. A recipe layer, like :mod:`eventlog.snapshot`: it picks the key id and
the nonce; :mod:`eventlog.seal` only encrypts.

A blob is one clear JSON header line (format, data key id, nonce) and the AES-256-GCM-SIV
ciphertext of the body. The associated data is a domain (what the blob is), the header, and
``bound``: what the blob must stay attached to (for a relayed request: the catalog's schema,
the shard, the row's random id and the direction). A blob moved elsewhere, or altered, or
sealed with another key, fails :func:`open_blob` with :class:`~eventlog.errors.DecryptError`;
no error names key material.
"""

from __future__ import annotations

import os

import msgspec

from eventlog.errors import DecryptError, UnknownKeyError
from eventlog.keys import KeyRing
from eventlog.seal import NONCE_BYTES, Sealer

BLOB_FORMAT = 1
_MAX_HEADER = 512


class _Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    kid: str
    nonce: bytes  # base64 in the JSON line


_header_decoder = msgspec.json.Decoder(_Header)


def _aad(domain: bytes, header: bytes, bound: bytes) -> bytes:
    return b"".join((domain, len(header).to_bytes(4, "big"), header, bound))


def seal_blob(keyring: KeyRing, domain: bytes, bound: bytes, body: bytes) -> bytes:
    """``body`` sealed under the active data key, bound to ``domain`` and ``bound``."""
    kid = keyring.active
    nonce = os.urandom(NONCE_BYTES)
    header = msgspec.json.encode(_Header(BLOB_FORMAT, kid, nonce))
    ct = Sealer(keyring.get(kid)).seal_with(nonce, body, _aad(domain, header, bound))
    return b"".join((header, b"\n", ct))


def open_blob(keyring: KeyRing, domain: bytes, bound: bytes, data: bytes, *, where: str) -> bytes:
    """The body of a blob :func:`seal_blob` made with the same ``domain`` and ``bound``.

    Raises :class:`DecryptError` (``where`` names the blob) when it is malformed, sealed with
    a key the keyring does not hold, or fails authentication.
    """
    end = data.find(b"\n", 0, _MAX_HEADER)
    if end <= 0:
        raise DecryptError(f"{where}: not a sealed blob (no header line)")
    raw = data[:end]
    try:
        header = _header_decoder.decode(raw)
    except (msgspec.DecodeError, ValueError):
        raise DecryptError(f"{where}: not a sealed blob (malformed header)") from None
    if header.format != BLOB_FORMAT or len(header.nonce) != NONCE_BYTES:
        raise DecryptError(f"{where}: sealed blob format {header.format} is not this bide's")
    try:
        key = keyring.get(header.kid)
    except UnknownKeyError:
        raise DecryptError(
            f"{where}: sealed with data key {header.kid}, which the keyring does not hold"
        ) from None
    return Sealer(key).open_raw(
        header.nonce, data[end + 1 :], _aad(domain, raw, bound), where=where
    )
