"""Crash suite: a writer in a child process, appending from many tasks, killed with SIGKILL.

After every kill the log is reopened by a new writer in this process (which recovers a torn
tail), and every append the child had acknowledged (printed after ``append`` returned) must be
there with the same hash and payload, the chain must verify, and a cut tail must be in
quarantine and named by a recovery record. A kill between two writes of one batch (a segment
rotation) also leaves complete records no seal covers: never acknowledged, they are cut too.
Some iterations also tear the tail by hand (cut the
last, unacknowledged record short, or leave junk/zeros at the end) the way a crash mid-write
does, so recovery runs often. 60 kills, seeded; about 30 s.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from eventlog.envelope import EventRecord, Recovery
from eventlog.reader import LogReader
from eventlog.segments import list_segments
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from tests.eventlog._logtools import KeySet

CHILD = Path(__file__).with_name("_crash_child.py")
KILLS = 60
KILLS_PER_LOG = 12
SEED = 77


@dataclass(frozen=True)
class Ack:
    seq: int
    hash: str
    payload: bytes


def run_child_until_killed(
    log: Path, ks: KeySet, rng: random.Random, tag: str, out_path: Path
) -> list[Ack]:
    with out_path.open("wb") as out, (out_path.with_suffix(".err")).open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                str(log),
                str(ks.directory),
                str(rng.choice([1, 8, 50])),
                tag,
            ],
            stdout=out,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )
        try:
            deadline = time.monotonic() + 60
            while not out_path.read_bytes().startswith(b"ready\n"):
                assert proc.poll() is None, out_path.with_suffix(".err").read_text()
                assert time.monotonic() < deadline, "child never became ready"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.12))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, out_path.with_suffix(".err").read_text()
    acks = []
    for line in out_path.read_bytes().split(b"\n")[1:-1]:  # complete lines after "ready"
        seq, h, payload = line.split(b":", 2)
        acks.append(Ack(int(seq), h.decode(), payload))
    return acks


def tear_tail(log: Path, acked_up_to: int, rng: random.Random) -> None:
    """Leave the tail a crash mid-write can leave, never touching an acknowledged record."""
    path = list_segments(log)[-1][1]
    data = path.read_bytes()
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    last = data[start:-1]
    last_seq = int(last.split(b'"seq":', 1)[1].split(b",", 1)[0]) if b'"seq":' in last else -1
    choice = rng.random()
    # A seal ends a write that was durable before any of its records was acknowledged (it
    # may cover acknowledged records of another batch of the same write): a crash never
    # tears it.
    sealed = last.startswith((b'{"kind":"seal"', b'{"kind":"checkpoint"'))
    if (
        data.endswith(b"\n")
        and last_seq > acked_up_to
        and len(last) > 2
        and choice < 0.5
        and not sealed
    ):
        path.write_bytes(data[: start + rng.randrange(1, len(last))])  # cut mid-record
    elif choice < 0.75:
        with path.open("ab") as f:
            f.write(b"\x00" * rng.randrange(1, 4096))  # blocks allocated, never written
    else:
        with path.open("ab") as f:
            f.write(b'{"kind":"event","seq":' + str(last_seq + 1).encode())  # half a write


async def reopen(log: Path, ks: KeySet) -> list[Recovery]:
    async with LogWriter(
        log, ks.keyring(), ks.signer(), segment_bytes=4096, checkpoint_every=8
    ) as writer:
        return writer.recoveries


def check_after_kill(log: Path, ks: KeySet, acks: list[Ack], rng: random.Random) -> bool:
    """Reopen and check; returns whether a torn tail was recovered."""
    if acks and rng.random() < 0.4:
        tear_tail(log, max(a.seq for a in acks), rng)
    before = verify_log(log, ks.verify_key())
    assert before.damage is None, before.damage  # a crash leaves at most a torn tail
    torn_bytes = b""
    if before.torn is not None:
        with before.torn.segment.open("rb") as f:
            f.seek(before.torn.offset)
            torn_bytes = f.read()

    recovered = anyio.run(reopen, log, ks)

    after = verify_log(log, ks.verify_key())
    assert after.verdict == "intact", (after.damage, after.torn)
    assert after.clean_close
    if before.torn is None and before.head_sealed:
        assert recovered == []
    if before.torn is not None:
        # The torn bytes are the end of one quarantined cut (a cut of records no seal
        # covers may start earlier in the same file).
        assert any(
            r.segment == before.torn.segment.name
            and r.offset <= before.torn.offset
            and (log / r.quarantine).read_bytes().endswith(torn_bytes)
            and r.cut_len >= len(torn_bytes) == before.torn.length
            for r in recovered
        )
    for r in recovered:
        assert r.reason in ("torn", "unsealed")
        quarantined = (log / r.quarantine).read_bytes()
        assert len(quarantined) == r.cut_len
        assert hashlib.sha256(quarantined).hexdigest() == r.cut_sha256
        assert ((log / r.quarantine).stat().st_mode & 0o777) == 0o600

    reader = LogReader(log, ks.keyring())
    stored = {s.seq: s for s in reader.poll()}
    for r in recovered:
        assert stored[r.seq].record == r
    for ack in acks:
        s = stored.get(ack.seq)
        assert s is not None, f"acknowledged record {ack.seq} is gone"
        assert s.hash == ack.hash
        assert isinstance(s.record, EventRecord)
        assert reader.decrypt(s) == ack.payload
    return bool(recovered)


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_append(tmp_path: Path, ks: KeySet) -> None:
    rng = random.Random(SEED)
    acked = recoveries = 0
    for kill in range(KILLS):
        log = tmp_path / f"log{kill // KILLS_PER_LOG}"
        acks = run_child_until_killed(log, ks, rng, f"k{kill}", tmp_path / f"out{kill}.txt")
        acked += len(acks)
        recoveries += check_after_kill(log, ks, acks, rng)
    assert acked > KILLS * 10  # the kills landed while appends were flowing
    assert recoveries >= KILLS // 5  # and torn tails were recovered along the way
