"""Low-level AEAD sealing. Only :mod:`eventlog.writer` picks nonces and key ids.

AES-256-GCM-SIV with a random 96-bit nonce: nonce-misuse resistant, so even a repeated nonce
(a broken RNG, a cloned VM) leaks only whether two payloads were equal, never the key stream.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from eventlog.errors import DecryptError

NONCE_BYTES = 12


class Sealer:
    """Encrypts and decrypts with one data key; keeps the cipher object (its key schedule)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCMSIV(key)

    def seal(self, payload: bytes, aad: bytes, nonce: bytes | None = None) -> tuple[str, str]:
        """(nonce, ciphertext) in base64. ``nonce``, when given, is 12 bytes the caller drew
        from ``os.urandom`` (the writer draws a whole write's nonces in one call)."""
        if nonce is None:
            nonce = os.urandom(NONCE_BYTES)
        elif len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
        ct = self._aead.encrypt(nonce, payload, aad)
        return base64.b64encode(nonce).decode("ascii"), base64.b64encode(ct).decode("ascii")

    def seal_with(self, nonce: bytes, payload: bytes, aad: bytes) -> bytes:
        """The raw ciphertext, for callers that store the nonce themselves (a blob's header, a
        record the writer encodes in one pass). The caller draws ``nonce`` from
        ``os.urandom``."""
        return self._aead.encrypt(nonce, payload, aad)

    def open_raw(self, nonce: bytes, ct: bytes, aad: bytes, *, where: str) -> bytes:
        try:
            return self._aead.decrypt(nonce, ct, aad)
        except (InvalidTag, ValueError):
            raise DecryptError(
                f"{where}: failed authentication (wrong data key, or the file was altered)"
            ) from None

    def open(self, nonce_b64: str, ct_b64: str, aad: bytes) -> bytes:
        """The plaintext of a stored record's base64 nonce and ciphertext. The caller names
        the record in the error, so no text is built for records that open. ``a2b_base64``
        in strict mode decodes in C; ``b64decode`` with ``validate`` adds a regular
        expression per call."""
        try:
            nonce = binascii.a2b_base64(nonce_b64, strict_mode=True)
            ct = binascii.a2b_base64(ct_b64, strict_mode=True)
            return self._aead.decrypt(nonce, ct, aad)
        except (InvalidTag, binascii.Error, ValueError):
            raise DecryptError(
                "payload failed authentication (wrong data key, or the record or its header "
                "was altered); run `bide verify` on the log"
            ) from None
