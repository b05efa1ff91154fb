"""Checking a signed head on its own: its checkpoint's signature, through the certified chain
of epoch keys, back to a root key (``verify.pub``), and a witness's countersignature.

A head (:class:`eventlog.heads.Head`) carries its checkpoint record. In a forward-secure log
(format 3) that checkpoint is signed by the key of its epoch, which the root key certified in
the genesis record (epoch 1) or an earlier checkpoint certified with ``next_key`` (see
:mod:`eventlog.epochs`); in a single-key log (format 2) the root key signs it directly. So
whoever holds ``verify.pub``, the genesis record and the key-certifying checkpoints before a
head (a :class:`Proof`) can tell a head the log's keys signed from a forged one, without the
rest of the log. The witness does that before it accepts a head, and keeps a
:class:`KeyState` per log so each next head verifies against the key now in force; the daemon
and ``bide verify`` do it before they believe a head a witness returns.

Takeover checkpoints (the log in PostgreSQL) are carried with the certificates: lease epochs
only grow, which the checks here hold too.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from eventlog.envelope import Checkpoint, Genesis, decode_record, record_hash
from eventlog.heads import Head
from eventlog.keys import fingerprint
from eventlog.segments import archived_start, genesis_bytes, list_segments
from eventlog.verify import (
    Report,
    adopt_genesis,
    advance_epoch,
    checkpoint_problem,
    genesis_verifies,
)

_COUNTERSIGN_DOMAIN = b"bide.witness.v1\n"


class ChainError(Exception):
    """A record does not verify in the chain of certified keys; the message says which."""


class KeyState(msgspec.Struct, frozen=True):
    """What checking the next checkpoint of one log needs: the key in force after ``seq``."""

    log: str
    root: str  # the root key's fingerprint (the genesis record's signer)
    format: int
    epoch: int
    epoch_key: str  # base64 of the epoch's public key ("" in format 2)
    cert_seq: int  # the record that certified it (0: the genesis record)
    lease_epoch: int
    seq: int  # the last record verified: the genesis record (0) or a checkpoint


class Proof(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The genesis record and the checkpoints that certify keys (or record takeovers) before
    the first head sent: enough to follow the chain from the root key to that head."""

    genesis: str = ""  # empty in the second and later parts of a proof sent in parts
    certs: list[str] = msgspec.field(default_factory=list)


def _report(state: KeyState, root: bytes) -> Report:
    report = Report(log_dir=Path())
    report.log_id, report.format, report.root_key = state.log, state.format, root
    report.epoch, report.epoch_key, report.epoch_cert_seq = (
        state.epoch,
        state.epoch_key,
        state.cert_seq,
    )
    report.lease_epoch = state.lease_epoch
    return report


def _state(report: Report, seq: int, root: str) -> KeyState:
    return KeyState(
        report.log_id,
        root,
        report.format,
        report.epoch,
        report.epoch_key,
        report.epoch_cert_seq,
        report.lease_epoch,
        seq,
    )


def from_genesis(root: bytes, genesis_line: str) -> KeyState:
    """The key state a genesis record signed by ``root`` (raw public key) starts."""
    try:
        rec = decode_record(genesis_line.encode("utf-8"))
    except (msgspec.DecodeError, ValueError):
        raise ChainError("the genesis record does not parse") from None
    if not isinstance(rec, Genesis) or rec.seq != 0:
        raise ChainError("the first record sent is not a genesis record")
    if rec.signer != fingerprint(root):
        raise ChainError(
            f"log {rec.log} is signed by root key {rec.signer[:16]}…, not by the "
            f"trusted key {fingerprint(root)[:16]}…"
        )
    if not genesis_verifies(root, rec):
        raise ChainError(f"the genesis record of log {rec.log} does not verify under its root key")
    report = Report(log_dir=Path())
    adopt_genesis(report, rec)
    return _state(report, 0, rec.signer)


def advance(state: KeyState, root: bytes, cp_line: str) -> KeyState:
    """The key state after checkpoint ``cp_line``, which must verify under ``state``."""
    try:
        rec = decode_record(cp_line.encode("utf-8"))
    except (msgspec.DecodeError, ValueError):
        raise ChainError("a checkpoint record does not parse") from None
    if not isinstance(rec, Checkpoint):
        raise ChainError(f"record {rec.seq} is not a checkpoint")
    if rec.log != state.log:
        raise ChainError(f"checkpoint {rec.seq} is of log {rec.log}, not {state.log}")
    if rec.seq <= state.seq:
        raise ChainError(f"checkpoint {rec.seq} comes after record {state.seq} it should follow")
    report = _report(state, root)
    problem = checkpoint_problem(report, rec)
    if problem is not None:
        raise ChainError(problem)
    advance_epoch(report, rec)
    return _state(report, rec.seq, state.root)


def is_cert(cp_line: str) -> bool:
    """Whether a checkpoint certifies the next epoch's key or records a takeover."""
    try:
        rec = decode_record(cp_line.encode("utf-8"))
    except (msgspec.DecodeError, ValueError):
        return False
    return isinstance(rec, Checkpoint) and bool(rec.next_key or rec.holder or rec.lease_epoch)


def through(root: bytes, proof: Proof, before: int) -> KeyState:
    """The key state in force just before record ``before``: the genesis record, then each
    certificate before ``before``, in order, each verified under the key before it."""
    state = from_genesis(root, proof.genesis)
    for line in proof.certs:
        try:
            seq = decode_record(line.encode("utf-8")).seq
        except (msgspec.DecodeError, ValueError):
            raise ChainError("a certificate does not parse") from None
        if seq < before:
            state = advance(state, root, line)
    return state


def chain_proof(
    lines: Iterable[bytes], before: int, *, first_seq: int = 0, after: Proof | None = None
) -> Proof:
    """The proof for a head at ``before`` from a log's lines (record ``first_seq`` first; 0,
    or just after an archive boundary whose proof is ``after``): its genesis record and the
    checkpoints before ``before`` that certify keys or record takeovers. Reads up to
    ``before``; only lines that mention such fields are decoded."""
    genesis = after.genesis if after is not None else ""
    certs = list(after.certs) if after is not None else []
    for seq, line in enumerate(lines, start=first_seq):
        if seq >= before:
            break
        if seq == 0:
            genesis = line.decode("utf-8")
        elif (b'"next_key"' in line or b'"holder"' in line) and b'"checkpoint"' in line:
            text = line.decode("utf-8")
            if is_cert(text):
                certs.append(text)
    return Proof(genesis, certs)


def log_proof(log_dir: Path, before: int) -> Proof:
    """:func:`chain_proof` of a segment-file log, archived or not: after an archive, the
    boundary's genesis record and certificates, then the live log's."""
    archived = archived_start(log_dir)
    if archived is None:
        return chain_proof(log_lines(log_dir), before)
    certs = list(archived.certs)
    if archived.checkpoint and is_cert(archived.checkpoint):
        certs.append(archived.checkpoint)
    return chain_proof(
        log_lines(log_dir),
        before,
        first_seq=archived.seq + 1,
        after=Proof(archived.genesis, certs),
    )


def log_lines(log_dir: Path) -> Iterable[bytes]:
    """A segment-file log's complete lines, in order (no newline); after an archive, from
    the first segment after the boundary."""
    if not log_dir.is_dir():
        return
    archived = archived_start(log_dir)
    base = 0 if archived is None else archived.segments
    for index, path in list_segments(log_dir):
        if index <= base:
            continue
        with path.open("rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    return
                yield line[:-1]


def genesis_line(log_dir: Path) -> str | None:
    """The genesis record's line of a segment-file log (kept in its archive boundary once its
    first segments are archived), or None when it has none."""
    line = genesis_bytes(log_dir)
    return None if line is None else line.decode("utf-8", errors="replace")


def countersign_message(head: Head) -> bytes:
    """The bytes a witness signs for a head it accepted."""
    return b"".join(
        (
            _COUNTERSIGN_DOMAIN,
            bytes.fromhex(head.log),
            head.seq.to_bytes(8, "big"),
            bytes.fromhex(head.hash),
        )
    )


def countersig_ok(head: Head, witness_keys: dict[str, bytes]) -> bool:
    """Whether ``head`` is countersigned by one of ``witness_keys`` (fingerprint -> raw)."""
    raw = witness_keys.get(head.witness)
    if raw is None or fingerprint(raw) != head.witness:
        return False
    try:
        sig = base64.b64decode(head.countersig, validate=True)
        Ed25519PublicKey.from_public_bytes(raw).verify(sig, countersign_message(head))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def head_matches(head: Head) -> str | None:
    """Why ``head``'s fields are not those of the checkpoint record it carries, or None."""
    try:
        rec = decode_record(head.cp.encode("utf-8"))
    except (msgspec.DecodeError, ValueError):
        return f"head {head.seq} carries no checkpoint record"
    if (
        not isinstance(rec, Checkpoint)
        or rec.seq != head.seq
        or rec.log != head.log
        or rec.epoch != head.epoch
        or rec.sig != head.sig
        or rec.t_us != head.t_us
        or record_hash(head.cp.encode("utf-8")) != head.hash
    ):
        return f"head {head.seq} does not match the checkpoint record it carries"
    return None


def head_problem(
    head: Head,
    root: bytes,
    genesis: str,
    certs: list[str],
    witness_keys: dict[str, bytes] | None = None,
) -> str | None:
    """Why a head a witness returned is not to be believed; None when it is (see
    :func:`head_problems`)."""
    return head_problems([head], root, genesis, certs, witness_keys)[0]


def head_problems(
    heads: list[Head],
    root: bytes,
    genesis: str,
    certs: list[str],
    witness_keys: dict[str, bytes] | None = None,
) -> list[str | None]:
    """For each head a witness returned, why it is not to be believed (None: it is).

    ``root`` and ``genesis`` come from the verifier's own ``verify.pub`` and log; ``certs``
    are the key certificates the witness (or a heads file) gave, which must chain from the
    genesis record. With ``witness_keys`` (pinned: fingerprint -> raw public key), a head
    must also carry a countersignature by one of them. One pass in sequence order: each
    certificate is verified once, however many heads there are."""
    out: list[str | None] = [None] * len(heads)
    try:
        state: KeyState | None = from_genesis(root, genesis)
        broken = ""
    except ChainError as exc:
        state, broken = None, str(exc)
    ordered: list[tuple[int, str]] = []
    for line in certs:
        try:
            ordered.append((decode_record(line.encode("utf-8")).seq, line))
        except (msgspec.DecodeError, ValueError):
            continue  # not a record: it certifies nothing
    ordered = sorted(set(ordered))
    next_cert = 0
    for i in sorted(range(len(heads)), key=lambda i: heads[i].seq):
        head = heads[i]
        if witness_keys is not None and not countersig_ok(head, witness_keys):
            shown = head.witness[:16] + "…" if head.witness else "none"
            out[i] = (
                f"head {head.seq} is not countersigned by a pinned witness key (it "
                f"names witness key {shown})"
            )
            continue
        mismatch = head_matches(head)
        if mismatch is not None:
            out[i] = mismatch
            continue
        while state is not None and next_cert < len(ordered) and ordered[next_cert][0] < head.seq:
            seq, line = ordered[next_cert]
            next_cert += 1
            if seq <= state.seq:
                continue  # the same certificate again, or a competing one (a fork's)
            try:
                state = advance(state, root, line)
            except ChainError as exc:  # certifies nothing; a head that needs it fails
                broken = f"a key certificate it gave does not verify ({exc})"
        if state is None:
            out[i] = f"head {head.seq}'s checkpoint does not verify from verify.pub: {broken}"
            continue
        try:
            advance(state, root, head.cp)
        except ChainError as exc:
            why = f"{exc}; {broken}" if broken else str(exc)
            out[i] = f"head {head.seq}'s checkpoint does not verify from verify.pub: {why}"
    return out
