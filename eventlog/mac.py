"""Low-level MACs with the seal key. Only :mod:`eventlog.writer` and :mod:`eventlog.snapshot`
decide what gets sealed; this module only computes and checks tags.

The key is :attr:`eventlog.keys.Signer.mac_key`, derived from the signing key: a holder of the
data key alone can encrypt records and snapshots, but cannot seal them, so the writer does not
adopt them.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from eventlog.envelope import Seal, seal_message

TAG_BYTES = 32


def tag(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data``."""
    return hmac.digest(key, data, "sha256")


def seal_tag(key: bytes, log_id: str, seq: int, head: str) -> str:
    """The ``mac`` field of the seal record ``seq`` that follows the record hashing to ``head``."""
    return base64.b64encode(tag(key, seal_message(log_id, seq, head))).decode("ascii")


def seal_ok(key: bytes, seal: Seal) -> bool:
    """Whether ``seal`` carries the tag only the MAC key's holder can compute."""
    try:
        got = base64.b64decode(seal.mac, validate=True)
        want = tag(key, seal_message(seal.log, seal.seq, seal.prev))
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(got, want)
