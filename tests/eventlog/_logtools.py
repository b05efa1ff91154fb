"""Helpers for the event-log tests: build real logs, edit them like an attacker, run verify.

Nothing here holds a secret beyond the test's own key directory.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec

from eventlog import keys
from eventlog.envelope import (
    EventRecord,
    Record,
    associated_data,
    decode_record,
    encode_record,
    record_hash,
)
from eventlog.epochs import EpochPolicy, EpochSigning
from eventlog.seal import Sealer
from eventlog.segments import list_segments, segment_name
from eventlog.verify import Report, verify_log
from eventlog.writer import Appended, LogWriter

BIDE = [sys.executable, "-m", "daemon.cli"]


@dataclass(frozen=True)
class KeySet:
    directory: Path

    @property
    def verify_pub(self) -> Path:
        return self.directory / keys.VERIFY_KEY

    def keyring(self) -> keys.KeyRing:
        return keys.load_keyring(self.directory)

    def signer(self) -> keys.Signer:
        return keys.load_signer(self.directory)

    def verify_key(self) -> keys.VerifyKey:
        return keys.load_verify_key(self.verify_pub)

    def epoch_signing(
        self, key_dir: Path, policy: EpochPolicy | None = None, *, root: bool = True
    ) -> EpochSigning:
        """Forward-secure signing (format 3), epoch keys in ``key_dir``; with ``root`` False,
        as a daemon whose root key went offline (it can continue a log, not create one)."""
        return EpochSigning(
            self.verify_key(), key_dir, policy=policy, root=self.signer() if root else None
        )


#: Epochs for test logs: a new key every 3 checkpoints.
EVERY_3 = EpochPolicy(every_checkpoints=3, every_seconds=0)


def epoch_dir(log_dir: Path) -> Path:
    """Where :func:`build_log` keeps the epoch keys of ``log_dir`` (beside it, never in it)."""
    return log_dir.parent / f"{log_dir.name}.epochs"


def make_keys(directory: Path) -> KeySet:
    keys.generate(directory)
    return KeySet(directory)


def payload_for(i: int) -> bytes:
    return f"payload-{i:06d}-".encode() + bytes([i % 251]) * (i % 37)


def build_log(
    log_dir: Path,
    ks: KeySet,
    events: int,
    *,
    segment_bytes: int = 2048,
    checkpoint_every: int = 5,
    batch: int = 3,
    payload: Callable[[int], bytes] = payload_for,
    epochs: EpochPolicy | None = None,
) -> list[Appended]:
    """Write ``events`` payloads with the real writer (batches of ``batch``) and close cleanly.

    With ``epochs``, in format 3 (forward-secure epoch keys, kept in :func:`epoch_dir`)."""
    signer: keys.Signer | EpochSigning = (
        ks.signer() if epochs is None else ks.epoch_signing(epoch_dir(log_dir), epochs)
    )

    async def run() -> list[Appended]:
        out: list[Appended] = []
        async with LogWriter(
            log_dir,
            ks.keyring(),
            signer,
            segment_bytes=segment_bytes,
            checkpoint_every=checkpoint_every,
            checkpoint_interval=3600,
        ) as w:
            for start in range(0, events, batch):
                out += await w.append_many(
                    [payload(i) for i in range(start, min(events, start + batch))]
                )
        return out

    return anyio.run(run)


@dataclass
class StoredLine:
    """One record line of a log as stored, with the file it came from."""

    segment: int  # segment index from the file name
    data: bytes

    @property
    def record(self) -> Record:
        return decode_record(self.data)

    @property
    def seq(self) -> int:
        return self.record.seq

    @property
    def kind(self) -> str:
        return type(self.record).__name__

    @property
    def hash(self) -> str:
        return record_hash(self.data)


def read_lines(log_dir: Path) -> list[StoredLine]:
    out = []
    for index, path in list_segments(log_dir):
        data = path.read_bytes()
        assert data.endswith(b"\n"), f"{path} does not end with a newline"
        out += [StoredLine(index, line) for line in data[:-1].split(b"\n")]
    return out


def write_lines(log_dir: Path, lines: list[StoredLine]) -> None:
    """Rewrite the segment files from ``lines`` (a file per distinct segment index)."""
    for _, path in list_segments(log_dir):
        path.unlink()
    by_segment: dict[int, list[bytes]] = {}
    for line in lines:
        by_segment.setdefault(line.segment, []).append(line.data)
    for index, datas in by_segment.items():
        (log_dir / segment_name(index)).write_bytes(b"".join(d + b"\n" for d in datas))


def rechain(lines: list[StoredLine], start: int) -> list[StoredLine]:
    """Renumber and relink every record from ``lines[start]`` on, as a keyless attacker can.

    Checkpoints keep their old signatures: the attacker has no signing key.
    """
    out = list(lines[:start])
    prev_hash = out[-1].hash
    for line in lines[start:]:
        rec = msgspec.structs.replace(line.record, seq=out[-1].seq + 1, prev=prev_hash)
        data = encode_record(rec)
        out.append(StoredLine(line.segment, data))
        prev_hash = record_hash(data)
    return out


def offsets(log_dir: Path) -> dict[int, tuple[str, int]]:
    """seq -> (segment file name, byte offset of the record's line)."""
    out: dict[int, tuple[str, int]] = {}
    for _, path in list_segments(log_dir):
        pos = 0
        for line in path.read_bytes().split(b"\n")[:-1]:
            out[decode_record(line).seq] = (path.name, pos)
            pos += len(line) + 1
    return out


def verify(log_dir: Path, ks: KeySet, anchor: tuple[int, str] | None = None) -> Report:
    return verify_log(log_dir, ks.verify_key(), anchor=anchor)


@dataclass(frozen=True)
class CliResult:
    status: int
    report: dict[str, object]
    stdout: str
    stderr: str

    @property
    def damage(self) -> dict[str, object]:
        damage = self.report["damage"]
        assert isinstance(damage, dict), self.stdout
        return damage


def bide(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*BIDE, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=120,
        check=False,
    )


def verify_cli(log_dir: Path, verify_pub: Path, *extra: str, cwd: Path | None = None) -> CliResult:
    proc = bide("verify", log_dir, "--verify-key", verify_pub, "--json", *extra, cwd=cwd)
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return CliResult(proc.returncode, report, proc.stdout, proc.stderr)


def forge_event(log_dir: Path, keyring: keys.KeyRing, payload: bytes) -> int:
    """Append ``payload`` as the next event record the way a holder of the data key alone can:
    correctly numbered, chained to the head and encrypted under the active data key, but
    not sealed (no signing key). Returns its sequence number."""
    path = list_segments(log_dir)[-1][1]
    data = path.read_bytes()
    assert data.endswith(b"\n")
    last = data[:-1].rsplit(b"\n", 1)[-1]
    head = decode_record(last)
    seq, prev, kid = head.seq + 1, record_hash(last), keyring.active
    nonce, ct = Sealer(keyring.get(kid)).seal(payload, associated_data(head.log, seq, prev, kid))
    with path.open("ab") as f:
        f.write(encode_record(EventRecord(seq, prev, head.log, kid, nonce, ct)) + b"\n")
    return seq


def reseal_with_data_key(
    path: Path, keyring: keys.KeyRing, change: Callable[[bytes], bytes]
) -> None:
    """What a holder of the data key alone can do: decrypt the body, change it, encrypt it
    again under the same header, and keep whatever follows the ciphertext (format 2's tag)."""
    data = path.read_bytes()
    head, _, rest = data.partition(b"\n")
    header = msgspec.json.decode(head)
    trailer = 32 if header["format"] >= 2 else 0
    ct, tail = rest[: len(rest) - trailer], rest[len(rest) - trailer :]
    sealer = Sealer(keyring.get(header["kid"]))
    nonce = base64.b64decode(header["nonce"])
    body = sealer.open_raw(nonce, ct, b"bide.snapshot.v1\n" + head, where="test")
    forged = sealer.seal_with(nonce, change(body), b"bide.snapshot.v1\n" + head)
    path.write_bytes(head + b"\n" + forged + tail)
