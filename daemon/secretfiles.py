"""Files holding a provider's secrets (a token, a key pair), read with the same refusals.

A leaf module: the credential command, the HTTP shell and the AWS signer all use it, and it
imports none of them."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class CredentialError(Exception):
    """A credential cannot be had; the message names the file or program, never the value."""


def read_private_file(path: Path, what: str, provider: str) -> bytes:
    """The bytes of a file holding a secret (a token, a key pair). A file that cannot be read,
    or that group or others may open, is refused naming the file and the fix, never its
    content."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        raw = path.read_bytes()
    except OSError as exc:
        raise CredentialError(f"{what} {path} for provider {provider}: {exc.strerror}") from None
    if mode & 0o077:
        raise CredentialError(
            f"{what} {path} for provider {provider} is open to group or others "
            f"(mode {mode:04o}); fix: chmod 0600 {path}"
        )
    return raw
