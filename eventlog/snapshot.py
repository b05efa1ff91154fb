"""A state snapshot: an encrypted blob tied to the log position it was taken at.

The log stays the truth; a snapshot only saves re-reading it. Its file holds one clear JSON
header line (format, the :class:`~eventlog.position.LogPosition`, the data key id, the nonce),
then the AES-256-GCM-SIV ciphertext of the body, with the header as associated data, and last
a 32-byte HMAC-SHA256 tag over both under a seal MAC key (:mod:`eventlog.mac`): the one of
the epoch key in force at the snapshot's position on a forward-secure log, so a snapshot
verifies only while that epoch's key exists (see :mod:`eventlog.epochs`), or the one signing
key's on a format-2 log. A changed position, a swapped body or a snapshot of another log fails
authentication, and a position that no longer names its record in the log is refused by
whoever resumes from it. The tag is what makes the snapshot the writer's own: the data key
alone can decrypt and re-encrypt a body, but not tag it, so a body rewritten by a holder of
the data key is refused like a damaged one (format 1 snapshots, untagged, are refused too).
Written atomically (temporary file, fsync, rename, fsync of the directory), mode 0600.
"""

from __future__ import annotations

import contextlib
import hmac
import os
from pathlib import Path

import msgspec

from eventlog.errors import DecryptError, EventLogError, UnknownKeyError
from eventlog.fsync import fsync_dir, write_new_file
from eventlog.keys import KeyRing
from eventlog.mac import TAG_BYTES, tag
from eventlog.position import LogPosition
from eventlog.seal import NONCE_BYTES, Sealer

SNAPSHOT_FORMAT = 2  # 2: tagged with the seal MAC key
_AAD_DOMAIN = b"bide.snapshot.v1\n"
_TAG_DOMAIN = b"bide.snapshot-tag.v1\n"
_MAX_HEADER = 4096


class SnapshotError(EventLogError):
    """A snapshot cannot be used; the caller reads the whole log instead."""


class _Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    position: LogPosition
    kid: str
    nonce: bytes  # base64 in the JSON line


_header_decoder = msgspec.json.Decoder(_Header)


def seal_snapshot(keyring: KeyRing, mac_key: bytes, position: LogPosition, body: bytes) -> bytes:
    """A snapshot's bytes: ``body`` sealed under the active data key, bound to ``position``,
    tagged with ``mac_key`` (:attr:`eventlog.keys.Signer.mac_key`)."""
    kid = keyring.active
    nonce = os.urandom(NONCE_BYTES)
    header = msgspec.json.encode(_Header(SNAPSHOT_FORMAT, position, kid, nonce))
    ct = Sealer(keyring.get(kid)).seal_with(nonce, body, _AAD_DOMAIN + header)
    return b"".join((header, b"\n", ct, _tag(mac_key, header, ct)))


def write_snapshot(
    path: Path, keyring: KeyRing, mac_key: bytes, position: LogPosition, body: bytes
) -> int:
    """:func:`seal_snapshot` written to ``path``; returns bytes written."""
    data = seal_snapshot(keyring, mac_key, position, body)
    write_atomically(path, data)
    return len(data)


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all (temporary file, fsync, rename, fsync of the
    directory), mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    write_new_file(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def snapshot_position(data: bytes) -> LogPosition | None:
    """The log position a snapshot claims, read from its header without authenticating it
    (to choose which of two snapshots to open first, and which key to check its tag with);
    None when unreadable."""
    end = data.find(b"\n", 0, _MAX_HEADER)
    try:
        return _header_decoder.decode(data[:end]).position if end > 0 else None
    except (msgspec.DecodeError, ValueError):
        return None


def snapshot_seq(data: bytes) -> int | None:
    """The sequence number of :func:`snapshot_position`; None when unreadable."""
    position = snapshot_position(data)
    return None if position is None else position.seq


def _tag(mac_key: bytes, header: bytes, ct: bytes) -> bytes:
    return tag(mac_key, b"".join((_TAG_DOMAIN, len(header).to_bytes(8, "big"), header, ct)))


def read_snapshot(path: Path, keyring: KeyRing, mac_key: bytes) -> tuple[LogPosition, bytes]:
    """The position and plaintext body of the snapshot at ``path``.

    Raises :class:`SnapshotError` naming what is wrong (missing, malformed, another format,
    unknown key, failed authentication); :class:`FileNotFoundError` when there is none.
    """
    return open_snapshot(path.read_bytes(), keyring, mac_key, where=str(path))


def open_snapshot(
    data: bytes, keyring: KeyRing, mac_key: bytes, where: str
) -> tuple[LogPosition, bytes]:
    """:func:`read_snapshot` of bytes held elsewhere (``where`` names them in errors)."""
    path = where
    end = data.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        raise SnapshotError(f"snapshot {path} has no header line; it will be rebuilt")
    raw = data[:end]
    try:
        header = _header_decoder.decode(raw)
    except (msgspec.DecodeError, ValueError) as exc:
        raise SnapshotError(f"snapshot {path} has a malformed header ({exc})") from None
    if header.format != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"snapshot {path} is format {header.format}, this bide writes {SNAPSHOT_FORMAT}"
        )
    ct, mac = data[end + 1 : -TAG_BYTES], data[-TAG_BYTES:]
    if len(data) < end + 1 + TAG_BYTES or not hmac.compare_digest(mac, _tag(mac_key, raw, ct)):
        raise SnapshotError(
            f"snapshot {path} failed authentication: it was not tagged with "
            f"the key of the epoch it names (written elsewhere, or forged with "
            f"an old key), or it was altered; it will be rebuilt"
        )
    try:
        key = keyring.get(header.kid)
    except UnknownKeyError:
        raise SnapshotError(
            f"snapshot {path} is sealed with data key {header.kid}, which the keyring does not hold"
        ) from None
    try:
        body = Sealer(key).open_raw(header.nonce, ct, _AAD_DOMAIN + raw, where=f"snapshot {path}")
    except DecryptError as exc:
        raise SnapshotError(str(exc)) from None
    return header.position, body
