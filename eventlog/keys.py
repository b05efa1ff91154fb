"""Keys: the data keyring (AEAD), the signing key and its public verify key.

Files (each one line of base64, so they survive copy-paste and systemd credentials):
    data.key          the active data key (32 bytes), 0600
    data-<kid>.key    older data keys kept readable after a rotation; delete one to retire it
                      (its records stay verifiable, their payloads become unreadable)
    signing.key       the Ed25519 private key (32-byte seed), 0600; the seal MAC key that
                      authenticates every write batch and the snapshot is derived from it
    verify.pub        the Ed25519 public key (32 bytes); not a secret: give it to auditors

What each key lets its holder do: ``data.key`` reads and writes payloads (it does not make
history the daemon accepts); ``signing.key`` makes history: it signs checkpoints and, through
the derived MAC key, seals the records after the last checkpoint and the state snapshot;
``verify.pub`` only checks the signatures.

Keys load from a directory, or from ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``).
A secret key file must be 0600 or stricter and owned by the daemon's user or root, in a
directory no group or other user may write to. Errors name the file and the fix, never key
material.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from eventlog.errors import KeyFileError, UnknownKeyError
from eventlog.fsync import fsync_dir

DATA_KEY = "data.key"
SIGNING_KEY = "signing.key"
VERIFY_KEY = "verify.pub"
KEY_BYTES = 32


def key_id(key: bytes) -> str:
    """A data key's id: 16 hex chars, derived from the key (records name it)."""
    return hashlib.sha256(b"bide.kid.v1\n" + key).hexdigest()[:16]


def fingerprint(public_key: bytes) -> str:
    """A verify key's fingerprint, written into the genesis record."""
    return hashlib.sha256(b"bide.fp.v1\n" + public_key).hexdigest()


@dataclass(frozen=True)
class KeyRing:
    """Data keys by id; ``active`` encrypts new records."""

    active: str
    keys: dict[str, bytes] = field(repr=False)

    def get(self, kid: str) -> bytes:
        try:
            return self.keys[kid]
        except KeyError:
            raise UnknownKeyError(
                f"no data key with id {kid} in the keyring; it was retired or the wrong keys "
                f"directory is configured (a rotated key is kept as data-{kid}.key)"
            ) from None


@dataclass(frozen=True)
class Signer:
    private: Ed25519PrivateKey = field(repr=False)

    @property
    def public_bytes(self) -> bytes:
        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_bytes)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    @cached_property
    def mac_key(self) -> bytes:
        """The seal MAC key (HMAC-SHA256), derived from the signing seed with HKDF: whoever
        may sign checkpoints may seal batches, and nobody else (not the data key's holders,
        not the auditors) can. No file of its own to distribute, back up or leak."""
        seed = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return HKDF(hashes.SHA256(), KEY_BYTES, salt=None, info=b"bide.seal-mac.v1").derive(seed)


@dataclass(frozen=True)
class VerifyKey:
    public: Ed25519PublicKey
    raw: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.raw)


def keys_directory(explicit: Path | None) -> Path:
    """``explicit``, else ``$CREDENTIALS_DIRECTORY``; a clear error when neither is set."""
    if explicit is not None:
        return explicit
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds:
        return Path(creds)
    raise KeyFileError(
        "no keys directory: pass one (config [paths] keys_dir) or run under systemd with "
        "LoadCredential= so $CREDENTIALS_DIRECTORY is set"
    )


def _check_directory(directory: Path) -> None:
    """Refuse a keys directory others may write to: they could swap a key file in it."""
    try:
        st = directory.stat()
    except OSError:
        return  # the key file's own error names what is missing
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise KeyFileError(
            f"keys directory {directory} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}), so anyone there could replace a key; "
            f"fix: chmod 700 {directory}"
        )


def _owner_only(path: Path, st: os.stat_result, what: str) -> None:
    """Refuse a secret file that group or others may open, naming the fix."""
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise KeyFileError(
            f"{what} {path} is accessible by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); fix: chmod 600 {path}"
        )


def _read_secret(path: Path) -> bytes:
    _check_directory(path.parent)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(
            f"key file {path} does not exist; create keys with `bide keygen {path.parent}`"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    _owner_only(path, st, "key file")
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        raise KeyFileError(
            f"key file {path} is owned by uid {st.st_uid}, not by this process's user "
            f"(uid {uid}) or root, so that user could replace it; fix: chown {uid} {path}"
        )
    return _decode_key_file(path)


def _decode_key_file(path: Path) -> bytes:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise KeyFileError(
            f"{path} is not a bide key (expected one line of base64 encoding {KEY_BYTES} "
            f"bytes); recreate it with `bide keygen`"
        )
    return raw


def load_keyring(directory: Path) -> KeyRing:
    active = _read_secret(directory / DATA_KEY)
    keys = {key_id(active): active}
    for path in sorted(directory.glob("data-*.key")):
        raw = _read_secret(path)
        keys[key_id(raw)] = raw
    return KeyRing(active=key_id(active), keys=keys)


def load_signer(directory: Path) -> Signer:
    return Signer(Ed25519PrivateKey.from_private_bytes(_read_secret(directory / SIGNING_KEY)))


def load_verify_key(path: Path) -> VerifyKey:
    if not path.exists():
        raise KeyFileError(
            f"verify key {path} does not exist; it is the verify.pub that `bide keygen` wrote"
        )
    raw = _decode_key_file(path)
    return VerifyKey(Ed25519PublicKey.from_public_bytes(raw), raw)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # O_CREAT's mode is filtered by the umask


def _b64line(raw: bytes) -> bytes:
    return base64.b64encode(raw) + b"\n"


@dataclass(frozen=True)
class Generated:
    directory: Path
    created: list[Path]
    active_kid: str
    signer_fingerprint: str


def generate(directory: Path, *, rotate: bool = False) -> Generated:
    """Create a fresh key set in ``directory``, or with ``rotate`` a new active data key.

    Never overwrites a key: creating keys where some exist is an error naming them, and a
    rotation keeps the old data key as ``data-<kid>.key``.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    created: list[Path] = []
    if rotate:
        old = _read_secret(directory / DATA_KEY)
        retired = directory / f"data-{key_id(old)}.key"
        os.rename(directory / DATA_KEY, retired)
        new = os.urandom(KEY_BYTES)
        _write_new(directory / DATA_KEY, _b64line(new), 0o600)
        fsync_dir(directory)
        signer = load_signer(directory)
        return Generated(
            directory, [directory / DATA_KEY, retired], key_id(new), signer.fingerprint
        )
    existing = [p for p in (DATA_KEY, SIGNING_KEY, VERIFY_KEY) if (directory / p).exists()]
    if existing:
        raise KeyFileError(
            f"{directory} already holds {', '.join(existing)}; refusing to overwrite keys "
            f"(use --rotate for a new data key, or choose an empty directory)"
        )
    data = os.urandom(KEY_BYTES)
    private = Ed25519PrivateKey.generate()
    signer = Signer(private)
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    for name, raw, mode in (
        (DATA_KEY, data, 0o600),
        (SIGNING_KEY, seed, 0o600),
        (VERIFY_KEY, signer.public_bytes, 0o644),
    ):
        _write_new(directory / name, _b64line(raw), mode)
        created.append(directory / name)
    fsync_dir(directory)
    return Generated(directory, created, key_id(data), signer.fingerprint)


class _Seeded(Protocol):
    @property
    def seed(self) -> str: ...


_S = TypeVar("_S", bound=_Seeded)


def read_seed_file(path: Path, what: str, kind: type[_S]) -> tuple[_S, Signer]:
    """A private key file of ``kind`` (JSON with a base64 Ed25519 ``seed``) and its signer.
    Refused when group or others may read it; errors name the file and ``what`` it should
    be, never the key."""
    try:
        st = path.stat()
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc.strerror}") from None
    _owner_only(path, st, what)
    try:
        kf = msgspec.json.decode(data, type=kind)
        seed = base64.b64decode(kf.seed, validate=True)
        if len(seed) != KEY_BYTES:
            raise ValueError
    except (msgspec.DecodeError, msgspec.ValidationError, binascii.Error, ValueError):
        raise KeyFileError(f"{path} is not a bide {what} file") from None
    return kf, Signer(Ed25519PrivateKey.from_private_bytes(seed))
