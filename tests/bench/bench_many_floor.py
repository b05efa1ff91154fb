"""Where 1,000 appenders' floor is: the CPU a record costs before any disk, in one run.

With many appenders the log's rate is bound by CPU, not by ``fdatasync``: a round's one
``fdatasync`` is shared by hundreds of records. SQLite's one-transaction-per-record rate is
bound by ``fdatasync`` alone. So the ratio of the two moves with the disk: on a day when this
machine's ``fdatasync`` is three times faster, SQLite's rate triples and the log's barely
moves. These rows measure the two pieces of a record's CPU that every round must pay, each
alone, with no file at all:

    framing     what the writer does per record (``LogWriter._frame``): the associated data,
                the AES-256-GCM-SIV seal of a payload of the same size, the JSON line, the
                SHA-256 link. In Python around C calls that do not release the GIL.
    wake-ups    what the event loop does per record: an appender task awaits a future, a
                round resolves a thousand of them with one callback, each task wakes and
                queues its next record. No framing, no I/O.

They take turns on one GIL, so together they allow at most ``1 / (1/framing + 1/wake-ups)``
records/s on any number of cores: the floor the 1,000-appender row is compared with.
"""

from __future__ import annotations

import asyncio
import os
import time

from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from eventlog.envelope import (
    SealedEvent,
    aad_prefix,
    associated_data_from,
    encode_record,
    record_digest,
)

APPENDERS = 1000
ROUND = 1000  # records a round resolves at once: every appender's next one


def framing_rate(payload_bytes: int, seconds: float) -> float:
    """Records/s framed as the writer frames them, one thread, nothing else running."""
    aead = AESGCMSIV(AESGCMSIV.generate_key(256))
    payload = os.urandom(payload_bytes)
    log_id, kid = os.urandom(16).hex(), "k1"
    prefix, kid_raw = aad_prefix(log_id), kid.encode("ascii")
    nonces = os.urandom(12 * ROUND)
    prev_raw = bytes(32)
    seq = count = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for at in range(0, 12 * ROUND, 12):
            nonce = nonces[at : at + 12]
            aad = associated_data_from(prefix, seq + 1, prev_raw, kid_raw)
            ct = aead.encrypt(nonce, payload, aad)
            line = encode_record(SealedEvent(seq + 1, prev_raw.hex(), log_id, kid, nonce, ct))
            prev_raw = record_digest(line)
            seq += 1
        count += ROUND
    return count / (time.perf_counter() - started)


def wakeup_rate(seconds: float) -> float:
    """Records/s of :data:`APPENDERS` tasks that each await a future per record, a round's
    futures resolved together by one callback: the event loop's share, with no log."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[None]] = []
        count = 0
        deadline = time.perf_counter() + seconds

        def resolve() -> None:
            batch = waiting[:]
            waiting.clear()
            for fut in batch:
                fut.set_result(None)

        async def appender() -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                fut = loop.create_future()
                waiting.append(fut)
                if len(waiting) == 1:
                    loop.call_soon(resolve)
                await fut
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(APPENDERS)))
        return count / (time.perf_counter() - started)

    return asyncio.run(main())


def run(payload_bytes: int, seconds: float) -> dict[str, float]:
    framing = framing_rate(payload_bytes, seconds)
    wakeups = wakeup_rate(seconds)
    return {
        "framing_records_per_s": round(framing),
        "framing_us": round(1e6 / framing, 2),
        "wakeup_records_per_s": round(wakeups),
        "wakeup_us": round(1e6 / wakeups, 2),
        "records_per_s": round(1 / (1 / framing + 1 / wakeups)),
    }
