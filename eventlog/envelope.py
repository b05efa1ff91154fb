"""Low-level record framing. Only :mod:`eventlog.writer` builds records; this module picks nothing.

A log is a sequence of records, one JSON object per line. Every record carries its sequence
number and the hash of the record before it; a record's own hash is a domain-separated SHA-256
over its exact stored bytes (the line without its newline), so any change to any byte of a record
breaks the link stored in its successor.

Record kinds:
    genesis     seq 0, first line of the first segment: format version, log id, signer fingerprint
    segment     first line of every later segment: its index; ``prev`` is the last hash of the
                previous segment, so deleting or reordering a whole segment breaks the chain
    event       an encrypted payload: log id, key id, nonce, AEAD ciphertext
    checkpoint  clear text, Ed25519-signed (log id, seq, head hash, time, previous checkpoint hash)
    recovery    written on open after records were cut (a torn tail, records no caller was told
                are durable, records no seal authenticates): the cut bytes' length, hash, where
                they were quarantined, and why
    seal        ends every write of the writer that does not end with a checkpoint: an
                HMAC-SHA256 (key derived from the signing key) over (log id, seq, head hash), so
                records after the last checkpoint are authentic only up to the last seal that
                verifies. Holding the data key is not enough to append records the writer
                adopts. Verifiers without the MAC key accept it as a chained record.

A record's line is at most :data:`MAX_LINE_BYTES`; a longer one is not a record (damage).
"""

from __future__ import annotations

import hashlib
import operator
import struct
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Literal

import msgspec

FORMAT_VERSION = 3  # 3: forward-secure checkpoints (epoch keys certified from the root)
FORMAT_SINGLE_KEY = 2  # 2: the genesis record is signed and declares the checkpoint spacing;
#: every checkpoint is signed by the one signing key (still read and written: existing logs)
READABLE_FORMATS = (FORMAT_SINGLE_KEY, FORMAT_VERSION)
ZERO_HASH = "0" * 64
_RECORD_DOMAIN = b"bide.record.v1\n"
_AAD_DOMAIN = b"bide.aad.v1\n"
_CHECKPOINT_DOMAIN = b"bide.checkpoint.v1\n"
_GENESIS_DOMAIN = b"bide.genesis.v2\n"
_GENESIS_V3_DOMAIN = b"bide.genesis.v3\n"
_CHECKPOINT_V2_DOMAIN = b"bide.checkpoint.v2\n"
_TAKEOVER_DOMAIN = b"bide.takeover.v1\n"
_SEAL_DOMAIN = b"bide.seal.v1\n"
_NODE_CERT_DOMAIN = b"bide.node-cert.v1\n"
_NODE_LINK_DOMAIN = b"bide.node-link.v1\n"
#: The longest record line a writer produces (the largest payload, a profile's 16 MiB
#: ``max_body_bytes``, grows by a third in base64): anything longer is damage, never read whole.
MAX_LINE_BYTES = 64 * 1024 * 1024
_RECORD_HASHER = hashlib.sha256(_RECORD_DOMAIN)


class NodeCert(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A node's enrolment (``bide node enroll``): the root key (``root``, its fingerprint)
    vouches that ``key`` (base64 of a raw Ed25519 public key) is node ``node``'s first node
    key, from ``not_before_us`` on, for any log of this root."""

    node: str
    root: str
    key: str
    not_before_us: int
    sig: str


class NodeLink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One step of a node's key chain: the node key of index ``index - 1`` certifies
    ``key`` as the node's key ``index`` (from ``t_us`` on), and is then destroyed."""

    index: int
    key: str
    t_us: int
    sig: str


class Genesis(
    msgspec.Struct,
    frozen=True,
    tag="genesis",
    tag_field="kind",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """The first record. Signed, so the checkpoint spacing it promises cannot be rewritten:
    a log stripped of its checkpoints then fails verification instead of passing unsigned.

    Format 3: signed by the root key, it certifies ``epoch_key`` (base64 of the raw Ed25519
    public key) as the key of epoch 1, which signs the checkpoints that follow."""

    seq: int
    prev: str
    format: int
    log: str
    signer: str
    t_us: int
    checkpoint_every: int = 0
    sig: str = ""
    epoch_key: str = ""  # format 3 only
    #: Format 3, a log made by an enrolled node (the log in PostgreSQL): the signature is by
    #: that node's current key, reached from ``cert`` through ``links`` (not by the root).
    cert: NodeCert | None = None
    links: tuple[NodeLink, ...] = ()


class Segment(
    msgspec.Struct, frozen=True, tag="segment", tag_field="kind", forbid_unknown_fields=True
):
    seq: int
    prev: str
    log: str
    index: int


class EventRecord(
    msgspec.Struct, frozen=True, tag="event", tag_field="kind", forbid_unknown_fields=True
):
    seq: int
    prev: str
    log: str
    kid: str
    nonce: str
    ct: str


class SealedEvent(msgspec.Struct, frozen=True, tag="event", tag_field="kind"):
    """An :class:`EventRecord` as the writer builds it: the nonce and ciphertext as raw bytes,
    which msgspec writes as exactly the padded standard base64 an ``EventRecord`` holds, so
    the stored line is byte for byte the same. One pass in C instead of two ``b64encode`` and
    two ``decode`` calls per record. Only ever encoded: readers decode ``EventRecord``."""

    seq: int
    prev: str
    log: str
    kid: str
    nonce: bytes
    ct: bytes


class Checkpoint(
    msgspec.Struct,
    frozen=True,
    tag="checkpoint",
    tag_field="kind",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """Format 3 adds ``epoch`` (whose key signs it) and, at an epoch boundary, ``next_key``:
    the public key of epoch ``epoch + 1``, certified by this signature. Both are omitted in
    format 2, so its records keep their bytes.

    ``lease_epoch`` and ``holder`` mark a takeover (the log in PostgreSQL): the first record a
    node writes after taking the lease names the node and the epoch it took, under the
    signature. Omitted in every other checkpoint."""

    seq: int
    prev: str
    log: str
    t_us: int
    prev_cp: str
    final: bool
    sig: str
    epoch: int = 0
    next_key: str = ""
    lease_epoch: int = 0
    holder: str = ""
    #: A checkpoint signed by a node key rather than by the epoch's key (format 3, a node
    #: taking the log: see eventlog.nodekeys): the node's certificate and its key chain from
    #: the enrolled key to the one that signs. It always certifies ``next_key``.
    cert: NodeCert | None = None
    links: tuple[NodeLink, ...] = ()


class Takeover(msgspec.Struct, frozen=True):
    """Who took the log (the lease's holder) and the lease epoch it took."""

    lease_epoch: int
    holder: str


class Recovery(
    msgspec.Struct, frozen=True, tag="recovery", tag_field="kind", forbid_unknown_fields=True
):
    seq: int
    prev: str
    log: str
    t_us: int
    segment: str
    offset: int
    cut_len: int
    cut_sha256: str
    quarantine: str
    reason: str = ""  # "torn", "unacknowledged", "unsealed"; empty in records before seals


class Seal(msgspec.Struct, frozen=True, tag="seal", tag_field="kind", forbid_unknown_fields=True):
    """Authenticates every record before it (through ``prev``) to holders of the MAC key."""

    seq: int
    prev: str
    log: str
    mac: str


Record = Genesis | Segment | EventRecord | Checkpoint | Recovery | Seal
RecordKind = Literal["genesis", "segment", "event", "checkpoint", "recovery", "seal"]

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Record] = msgspec.json.Decoder(Record)


def encode_record(record: Record | SealedEvent) -> bytes:
    """The stored bytes of ``record``, without the trailing newline."""
    return _encoder.encode(record)


def decode_record(line: bytes) -> Record:
    """Parse one stored line (without newline). Raises ``msgspec.DecodeError`` if malformed."""
    return _decoder.decode(line)


#: The decoder itself, for loops that map it over many lines.
RECORD_DECODER = _decoder


def record_hash(line: bytes) -> str:
    """Domain-separated SHA-256 of a record's exact stored bytes, as lowercase hex."""
    h = _RECORD_HASHER.copy()
    h.update(line)
    return h.hexdigest()


def record_digest(line: bytes) -> bytes:
    """:func:`record_hash` as raw bytes (the writer needs both forms of every hash)."""
    h = _RECORD_HASHER.copy()
    h.update(line)
    return h.digest()


def record_hashes(lines: Sequence[bytes]) -> list[str]:
    """``record_hash`` of every line, looping in C (the verifier's fast path)."""
    hashers = list(map(_COPY, repeat(_RECORD_HASHER, len(lines))))
    deque(map(_UPDATE, hashers, lines), maxlen=0)
    return list(map(_HEXDIGEST, hashers))


_COPY = operator.methodcaller("copy")
_UPDATE = type(_RECORD_HASHER).update
_HEXDIGEST = operator.methodcaller("hexdigest")


def associated_data(log_id: str, seq: int, prev: str, kid: str) -> bytes:
    """AEAD associated data: binds a ciphertext to its header as stored."""
    return associated_data_from(aad_prefix(log_id), seq, bytes.fromhex(prev), kid.encode("ascii"))


def aad_prefix(log_id: str) -> bytes:
    """The part of every record's associated data that only the log decides."""
    return _AAD_DOMAIN + bytes.fromhex(log_id)


def associated_data_from(prefix: bytes, seq: int, prev: bytes, kid: bytes) -> bytes:
    """:func:`associated_data` from parts already in bytes: the writer's loop over a round
    converts the log id and each hash once, not once per record."""
    return b"".join((prefix, _SEQ.pack(seq), prev, kid))


_SEQ = struct.Struct(">Q")


def genesis_message(log_id: str, fmt: int, signer: str, t_us: int, checkpoint_every: int) -> bytes:
    """The bytes a genesis signature covers."""
    return b"".join(
        (
            _GENESIS_DOMAIN,
            bytes.fromhex(log_id),
            struct.pack(">Iqq", fmt, t_us, checkpoint_every),
            bytes.fromhex(signer),
        )
    )


def genesis_message_v3(
    log_id: str, signer: str, t_us: int, checkpoint_every: int, epoch_key: bytes
) -> bytes:
    """The bytes a format-3 genesis signature covers: also the certified epoch-1 key."""
    return b"".join(
        (
            _GENESIS_V3_DOMAIN,
            bytes.fromhex(log_id),
            struct.pack(">Iqq", FORMAT_VERSION, t_us, checkpoint_every),
            bytes.fromhex(signer),
            struct.pack(">B", len(epoch_key)),
            epoch_key,
        )
    )


def seal_message(log_id: str, seq: int, head: str) -> bytes:
    """The bytes a seal's MAC covers. ``head`` is the hash of record ``seq - 1``."""
    return b"".join(
        (_SEAL_DOMAIN, bytes.fromhex(log_id), struct.pack(">Q", seq), bytes.fromhex(head))
    )


def checkpoint_message(
    log_id: str,
    seq: int,
    head: str,
    t_us: int,
    prev_cp: str,
    final: bool,
    takeover: Takeover | None = None,
) -> bytes:
    """The bytes a checkpoint signature covers. ``head`` is the hash of record ``seq - 1``."""
    return b"".join(
        (
            _CHECKPOINT_DOMAIN,
            bytes.fromhex(log_id),
            struct.pack(">Qq", seq, t_us),
            bytes.fromhex(head),
            bytes.fromhex(prev_cp),
            b"\x01" if final else b"\x00",
            _takeover_bytes(takeover),
        )
    )


def checkpoint_message_v2(
    log_id: str,
    seq: int,
    head: str,
    t_us: int,
    prev_cp: str,
    final: bool,
    epoch: int,
    next_key: bytes,
    takeover: Takeover | None = None,
) -> bytes:
    """The bytes a format-3 checkpoint signature covers: also its epoch and the next epoch's
    public key, when it certifies one (empty otherwise)."""
    return b"".join(
        (
            _CHECKPOINT_V2_DOMAIN,
            bytes.fromhex(log_id),
            struct.pack(">QqQ", seq, t_us, epoch),
            bytes.fromhex(head),
            bytes.fromhex(prev_cp),
            b"\x01" if final else b"\x00",
            struct.pack(">B", len(next_key)),
            next_key,
            _takeover_bytes(takeover),
        )
    )


def checkpoint_takeover(cp: Checkpoint) -> Takeover | None:
    """The takeover a checkpoint records, if it records one."""
    if cp.lease_epoch == 0 and not cp.holder:
        return None
    return Takeover(cp.lease_epoch, cp.holder)


def node_cert_message(node: str, root: str, key: bytes, not_before_us: int) -> bytes:
    """The bytes the root key signs to enrol a node."""
    name = node.encode()
    return b"".join(
        (
            _NODE_CERT_DOMAIN,
            bytes.fromhex(root),
            struct.pack(">H", len(name)),
            name,
            struct.pack(">B", len(key)),
            key,
            struct.pack(">q", not_before_us),
        )
    )


def node_link_message(node: str, index: int, key: bytes, t_us: int) -> bytes:
    """The bytes a node key signs to certify the node's next key."""
    name = node.encode()
    return b"".join(
        (
            _NODE_LINK_DOMAIN,
            struct.pack(">H", len(name)),
            name,
            struct.pack(">QB", index, len(key)),
            key,
            struct.pack(">q", t_us),
        )
    )


def takeover_fields(takeover: Takeover | None) -> dict[str, Any]:
    """The :class:`Checkpoint` keyword arguments that record ``takeover`` (none for None)."""
    return (
        {} if takeover is None else {"lease_epoch": takeover.lease_epoch, "holder": takeover.holder}
    )


def _takeover_bytes(takeover: Takeover | None) -> bytes:
    """Nothing for an ordinary checkpoint, so earlier signatures keep verifying."""
    if takeover is None:
        return b""
    holder = takeover.holder.encode()
    return b"".join(
        (_TAKEOVER_DOMAIN, struct.pack(">QH", takeover.lease_epoch, len(holder)), holder)
    )
