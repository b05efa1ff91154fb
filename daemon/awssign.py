"""AWS Signature V4 for profiles with an ``[aws]`` table (the optional extra ``bide[aws]``).

AWS's JSON-protocol APIs (Step Functions, Batch) take every call, reads included, as a signed
POST. The signing is botocore's own (``SigV4Auth`` over an ``AWSRequest``), never written
here: :meth:`Signer.sign` hands it the exact method, URL, headers and body bide is about to
send, and returns those headers plus ``X-Amz-Date``, ``Authorization`` (and
``X-Amz-Security-Token`` for temporary credentials), computed afresh for every request.

Credentials come from one file the operator controls, under ``credentials_dir`` (or
``$CREDENTIALS_DIRECTORY``) like a token file, mode 0600, holding JSON::

    {"access_key_id": "AKIA...", "secret_access_key": "...", "session_token": "..."}

(``session_token`` only for temporary credentials). The file is read again whenever it
changes, so rotation needs no restart. No error names a key's value: only the file and what
is wrong with it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from daemon.secretfiles import CredentialError, read_private_file

INSTALL_HINT = "install bide[aws] (pip install 'bide[aws]') for AWS Signature V4"


class AwsSigning(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The profile's ``[aws]`` table: sign every request to the provider with SigV4."""

    region: Annotated[str, Meta(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$")]
    service: Annotated[str, Meta(pattern=r"^[a-z0-9-]{1,64}$")]
    credentials_file: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")] = (
        "aws.json"
    )


class SigningError(Exception):
    """The request cannot be signed (no botocore, credentials missing or unreadable); the
    message names the file and the fix, never a key."""


def botocore_missing() -> str | None:
    """Why SigV4 cannot be used here (``None`` when botocore's signer imports)."""
    try:
        import botocore.auth
        import botocore.awsrequest
        import botocore.credentials  # noqa: F401
    except ImportError:
        return f"this profile signs its requests with AWS Signature V4: {INSTALL_HINT}"
    return None


class _Keys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    access_key_id: Annotated[str, Meta(pattern=r"^[A-Z0-9]{16,128}$")]
    secret_access_key: Annotated[str, Meta(min_length=1, max_length=256)]
    session_token: Annotated[str, Meta(min_length=1, max_length=8192)] | None = None


def read_keys(path: Path, provider: str) -> _Keys:
    """The key pair in ``path`` (0600, JSON); :class:`SigningError` names what is wrong."""
    try:
        raw = read_private_file(path, "AWS credentials file", provider)
    except CredentialError as exc:
        raise SigningError(str(exc)) from None
    try:
        return msgspec.json.decode(raw, type=_Keys)
    except (msgspec.DecodeError, msgspec.ValidationError):
        # msgspec's message may quote the value it rejected: never repeated.
        raise SigningError(
            f"AWS credentials file {path} for provider {provider} must be JSON with "
            f'"access_key_id" (upper-case letters and digits), "secret_access_key" and, for '
            f'temporary credentials, "session_token"'
        ) from None


class Signer:
    """Signs one provider's requests; the credentials file is re-read when it changes."""

    def __init__(self, config: AwsSigning, credentials_dir: Path | None, provider: str) -> None:
        self.config = config
        self.provider = provider
        self._path = credentials_dir / config.credentials_file if credentials_dir else None
        self._seen: tuple[tuple[int, ...], Any] | None = None
        # botocore logs the canonical request at DEBUG, and with temporary credentials that
        # holds the session token: never, whatever level the daemon's logging is at.
        logging.getLogger("botocore.auth").setLevel(logging.INFO)

    def _credentials(self) -> Any:
        """botocore ``Credentials`` as the file holds them now."""
        if self._path is None:
            raise SigningError(
                f"profile {self.provider} signs with AWS credentials file "
                f"{self.config.credentials_file} but neither [paths] credentials_dir nor "
                f"$CREDENTIALS_DIRECTORY is set"
            )
        try:
            st = os.stat(self._path)
            key: tuple[int, ...] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        except OSError:
            key = ()
        if self._seen is not None and key and self._seen[0] == key:
            return self._seen[1]
        from botocore.credentials import Credentials

        keys = read_keys(self._path, self.provider)
        credentials = Credentials(keys.access_key_id, keys.secret_access_key, keys.session_token)
        self._seen = (key, credentials)
        return credentials

    def check(self) -> None:
        """Raise :class:`SigningError` if a request could not be signed right now."""
        missing = botocore_missing()
        if missing is not None:
            raise SigningError(missing)
        self._credentials()

    def sign(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> dict[str, str]:
        """``headers`` plus the SigV4 headers for exactly this request (timestamped now)."""
        missing = botocore_missing()
        if missing is not None:
            raise SigningError(missing)
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, headers=dict(headers), data=body or b"")
        SigV4Auth(self._credentials(), self.config.service, self.config.region).add_auth(request)
        return {name: str(value) for name, value in request.headers.items()}
