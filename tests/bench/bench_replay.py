"""Restart at scale: replaying a log of 1,000,000 events (decrypt, decode, fold).

The log is made once with the real ``LogWriter`` from events the real model produced:
``register`` and ``decide`` drive 111,111 operations through a registration and two poll
cycles each (intent, response, classification, next poll), so the fold sees what a daemon
writes. It is cached under ``bench-out/``. Replay is measured in stages over the same files,
each a full pass, in this process, best of ``runs``:

    chain     read the segments, parse each envelope, check sequence and hash links
    decrypt   + AES-GCM-SIV open of every payload
    decode    + msgspec decode of every event
    replay    + the fold (``daemon.snapshots.replay_log`` without a snapshot)

and then as ``bide run`` starts, from opening the log to the state being ready (the writer's
verification on open, the snapshot if any, the fold of the events after it):

    start, no snapshot              full verification, full fold
    start, snapshot at the head     a clean stop's snapshot: nothing after it
    start, snapshot N behind        a SIGKILL with the last periodic snapshot N events back
                                    (N = the default ``snapshot_every``, the worst case)

The goal is 300,000 events/s replayed: events in the log over the time to a ready state.

``floor`` (:func:`c_floor`) times, over the same log, each call a replay cannot skip, each
alone and looped in C (``map``) so that almost no Python runs around it: reading and
splitting the segments, decoding the envelopes, hashing the lines (the chain), decoding the
base64 nonce and ciphertext, the AES-GCM-SIV open, decoding the event. Their sum per event
bounds what any reader of this format can reach on one core, before the fold and before
handing events between processes. Beside them it times the fold alone (``Ledger.apply`` over
the decoded events), which gives two ceilings: this format on every core (the C calls and
the fold, shared perfectly between the cores, no hand-off), and the part of a replay that
stays in one process, in order, whatever the record framing (decoding each event and folding
it). A what-if (:func:`grouped_framing`) seals the same events :data:`GROUP` to a record, as a
format with several events per record would, and times its framing, chain and open per event.
"""

from __future__ import annotations

import binascii
import gc
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from daemon.config import LogConfig
from daemon.readers import load_log, load_operation
from daemon.readers import op_events as events_of
from daemon.snapshots import SnapshotKeys, load_snapshot, replay_log, save_snapshot
from eventlog import keys
from eventlog.envelope import (
    RECORD_DECODER,
    ZERO_HASH,
    Checkpoint,
    EventRecord,
    Genesis,
    Recovery,
    aad_prefix,
    associated_data_from,
    decode_record,
    encode_record,
    record_hash,
    record_hashes,
)
from eventlog.keys import KeyRing
from eventlog.position import LogPosition
from eventlog.reader import LogReader, StoredRecord
from eventlog.segments import list_segments
from eventlog.verify import verify_log
from eventlog.writer import LogWriter
from replay.contract import Contract, StateTable
from replay.decide import decide, register
from replay.events import (
    LogEvent,
    ResponseHeaders,
    StatusRequestIntended,
    StatusResponseReceived,
    decode_log_event,
    encode_event,
)
from replay.ledger import Ledger
from replay.observations import Registration, WakeUp
from replay.state import evolve
from tests.bench import cache

EVENTS_PER_OP = 9  # registration + 2 x (intent, response, classified, scheduled)
BATCH = 20_000


def bench_contract() -> Contract:
    return Contract(
        provider="sim",
        states=StateTable(pending=("queued", "running"), success=("succeeded",)),
        state_pointer="/status",
        job_id_pointer="/id",
        backoff_base_seconds=30.0,
        backoff_cap_seconds=60.0,
        rate_limited_delay_seconds=120.0,
        default_max_status_requests=1000,
        default_deadline_seconds=86400.0,
    )


def op_events(i: int, contract: Contract, t0: float, rng: random.Random) -> list[bytes]:
    """The events one operation writes: registered, then two poll cycles, as decided."""
    reg = Registration(
        operation_id=f"op-{i:07d}",
        provider="sim",
        provider_job_id=f"job-{i:07d}",
        deadline_at=t0 + 86400.0,
        first_poll_after_seconds=rng.uniform(0, 60),
    )
    events = list(register(reg, contract, t0))
    op = evolve(None, events[0])
    now = op.next_poll_at
    for _ in range(2):
        [intent] = decide(op, WakeUp(), now, rng.random())
        assert isinstance(intent, StatusRequestIntended)
        op = evolve(op, intent)
        fact = StatusResponseReceived(
            operation_id=op.operation_id,
            at=now + 0.05,
            request_number=intent.request_number,
            status_code=200,
            headers=ResponseHeaders(
                request_id=f"req-{i}-{intent.request_number}", content_type="application/json"
            ),
            body=b'{"id": "job-%07d", "status": "running", "progress": 0.42}' % i,
        )
        op = evolve(op, fact)
        decided = decide(op, fact, now + 0.05, rng.random())
        for ev in decided:
            op = evolve(op, ev)
        events += [intent, fact, *decided]
        now = op.next_poll_at
    assert len(events) == EVENTS_PER_OP, events
    return [encode_event(e) for e in events]


async def _generate(log_dir: Path, key_dir: Path, records: int) -> None:
    contract = bench_contract()
    rng = random.Random(8)
    t0 = time.time()
    pending: list[bytes] = []
    async with LogWriter(
        log_dir, keys.load_keyring(key_dir), keys.load_signer(key_dir), checkpoint_every=1000
    ) as log:
        for i in range(records // EVENTS_PER_OP):
            pending += op_events(i, contract, t0, rng)
            if len(pending) >= BATCH:
                await log.append_many(pending)
                pending = []
        if pending:
            await log.append_many(pending)


def cached_log(work: Path, records: int) -> tuple[Path, Path]:
    """(log dir, keys dir) of a closed log of about ``records`` events, made once and kept."""
    root = cache.cached_log(work, "replay-log", records, _generate)
    return root / "log", root / "keys"


def _best(fn: Callable[[], int], runs: int) -> tuple[int, float]:
    best = float("inf")
    count = 0
    for _ in range(runs):
        started = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - started)
    return count, best


def run(work: Path, records: int, runs: int = 3) -> dict[str, object]:
    log_dir, key_dir = cached_log(work, records)
    keyring = keys.load_keyring(key_dir)

    def chain() -> int:
        return sum(1 for s in LogReader(log_dir).poll() if isinstance(s.record, EventRecord))

    def decrypt() -> int:
        return sum(1 for _ in LogReader(log_dir, keyring).payloads())

    def decode() -> int:
        n = 0
        for _, payload in LogReader(log_dir, keyring).payloads():
            decode_log_event(payload)
            n += 1
        return n

    def replay(jobs: int | None) -> Callable[[], int]:
        return lambda: replay_log(log_dir, keyring, jobs=jobs).events

    replayed = replay_log(log_dir, keyring)
    behind = min(LogConfig().snapshot_every, records // 2)  # a --quick log is smaller
    verify_key = keys.load_verify_key(key_dir / keys.VERIFY_KEY)
    head = verify_log(log_dir, verify_key, writer_live=False).position()
    snapshots = {"head": work / "snapshot-head", "behind": work / "snapshot-behind"}
    signer = keys.load_signer(key_dir)
    save_snapshot(snapshots["head"], keyring, signer.mac_key, head, replayed)
    older, ledger = _state_at(log_dir, keyring, replayed.events - behind)
    save_snapshot(snapshots["behind"], keyring, signer.mac_key, older, ledger)

    def start(snapshot: Path | None) -> Callable[[], int]:
        def run() -> int:
            snap = load_snapshot(snapshot, keyring, SnapshotKeys(root=signer)) if snapshot else None
            report = verify_log(
                log_dir, verify_key, writer_live=False, resume=snap.position if snap else None
            )
            assert report.damage is None
            assert snap is None or report.resumed_at == snap.position.seq
            return replay_log(log_dir, keyring, snap, jobs=1).events  # the daemon: threaded

        return run

    # What the offline readers load (`replay --check`, `story --offline`: every event, or one
    # operation's in the middle of the log), in one process and on every core.
    story_op = f"op-{len(replayed.ops) // 2:07d}"

    def story(only: str | None, jobs: int | None) -> Callable[[], int]:
        def run() -> int:
            log = (
                load_log(log_dir, keyring, jobs=jobs)
                if only is None
                else load_operation(log_dir, keyring, only, jobs=jobs)
            )
            assert len(events_of(log, story_op)) == EVENTS_PER_OP
            return replayed.events

        return run

    stages: dict[str, object] = {}
    for name, fn in (
        ("chain", chain),
        ("decrypt", decrypt),
        ("decode", decode),
        ("replay, 1 process (the daemon)", replay(1)),
        ("replay, every core (offline readers)", replay(None)),
        ("load_log, 1 process", story(None, 1)),
        ("load_log, every core", story(None, None)),
        ("story --offline, 1 process", story(story_op, 1)),
        ("story --offline, every core", story(story_op, None)),
        ("start, no snapshot", start(None)),
        ("start, snapshot at the head", start(snapshots["head"])),
        (f"start, snapshot {behind} behind", start(snapshots["behind"])),
    ):
        n, seconds = _best(fn, runs)
        stages[name] = {
            "events": n,
            "seconds": round(seconds, 3),
            "events_per_s": round(n / seconds),
        }
    floor = c_floor(log_dir, keyring, runs)
    live = sum(op.phase == "live" for op in replayed.ops.values())
    return {
        "events": replayed.events,
        "operations": len(replayed.ops),
        "live": live,
        "log_bytes": sum(p.stat().st_size for p in log_dir.glob("seg-*.jsonl")),
        "snapshot_bytes": snapshots["head"].stat().st_size,
        "goal_events_per_s": 300_000,
        "stages": stages,
        "floor": floor,
    }


def c_floor(log_dir: Path, keyring: KeyRing, runs: int = 3) -> dict[str, object]:
    """Microseconds per event of each call a replay of this format cannot skip, each timed
    alone over the whole log (best of ``runs``, at least 3: a floor is a best case), and the
    events/s their sum allows on one
    core and on every core, with nothing else running: no fold, no hand-off between
    processes, no Python around the calls."""
    paths = [p for _, p in list_segments(log_dir)]

    def read_split() -> list[bytes]:
        lines: list[bytes] = []
        for path in paths:
            lines += path.read_bytes().split(b"\n")[:-1]
        return lines

    lines = read_split()
    recs = list(map(RECORD_DECODER.decode, lines))
    events = [r for r in recs if isinstance(r, EventRecord)]
    nonces = [r.nonce for r in events]
    cts = [r.ct for r in events]
    raw_nonces = [binascii.a2b_base64(n, strict_mode=True) for n in nonces]
    raw_cts = [binascii.a2b_base64(c, strict_mode=True) for c in cts]
    prefix, kid = aad_prefix(events[0].log), events[0].kid
    aads = [
        associated_data_from(prefix, r.seq, bytes.fromhex(r.prev), kid.encode("ascii"))
        for r in events
    ]
    aead = AESGCMSIV(keyring.get(kid))  # what Sealer.open calls, without its wrapper
    plaintexts = list(map(aead.decrypt, raw_nonces, raw_cts, aads))
    a2b = binascii.a2b_base64

    calls: dict[str, Callable[[], object]] = {
        "read + split the segments": read_split,
        "decode the envelopes (msgspec)": lambda: list(map(RECORD_DECODER.decode, lines)),
        "SHA-256 of every line (the chain)": lambda: record_hashes(lines),
        "base64 of nonce and ciphertext": lambda: (list(map(a2b, nonces)), list(map(a2b, cts))),
        "AES-GCM-SIV open": lambda: list(map(aead.decrypt, raw_nonces, raw_cts, aads)),
        "decode the events (msgspec)": lambda: list(map(decode_log_event, plaintexts)),
    }
    per_event: dict[str, float] = {}
    gc.disable()  # as the readers run: a million short-lived objects, no cycles
    try:
        for name, call in calls.items():
            per_event[name] = round(_best_us(call, runs, len(events)), 3)
        decoded = list(map(decode_log_event, plaintexts))
        fold_us = _best_us(lambda: _fold(decoded), runs, len(events))
        grouped_us = grouped_framing(plaintexts, runs)
    finally:
        gc.enable()
    total = sum(per_event.values())
    cores = os.cpu_count() or 1
    in_order = per_event["decode the events (msgspec)"] + fold_us
    return {
        "events": len(events),
        "us_per_event": per_event,
        "total_us": round(total, 3),
        "cap_one_core": round(1e6 / total),
        "cores": cores,
        "cap_every_core": round(cores * 1e6 / total),
        "fold_us": round(fold_us, 3),
        "cap_every_core_with_fold": round(cores * 1e6 / (total + fold_us)),
        "in_order_us": round(in_order, 3),
        "cap_in_order": round(1e6 / in_order),
        "group": GROUP,
        "grouped_framing_us": round(grouped_us, 3),
        "cap_grouped_every_core": round(cores * 1e6 / (grouped_us + in_order)),
    }


#: Events per sealed record in :func:`grouped_framing`'s what-if: what a group commit of a
#: busy daemon would put in one record.
GROUP = 16


def _best_us(call: Callable[[], object], runs: int, events: int) -> float:
    best = float("inf")
    for _ in range(max(runs, 3)):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best / events * 1e6


def _fold(decoded: list[LogEvent]) -> None:
    apply = Ledger().apply
    for ev in decoded:
        apply(ev)


def grouped_framing(plaintexts: list[bytes], runs: int) -> float:
    """Microseconds per event to split, decode, hash and open records that each seal
    :data:`GROUP` of these payloads as one JSON array, and split the array again: what is
    left of the framing when events share a record. The per-byte work (base64, SHA-256,
    AES-GCM-SIV) does not shrink with the number of records."""
    aead = AESGCMSIV(AESGCMSIV.generate_key(256))
    aad = b"what-if"
    lines = []
    for at in range(0, len(plaintexts), GROUP):
        nonce = os.urandom(12)
        body = b"[" + b",".join(plaintexts[at : at + GROUP]) + b"]"
        lines.append(
            encode_record(
                EventRecord(
                    seq=at,
                    prev=ZERO_HASH,
                    log="0" * 32,
                    kid="what-if",
                    nonce=binascii.b2a_base64(nonce, newline=False).decode("ascii"),
                    ct=binascii.b2a_base64(aead.encrypt(nonce, body, aad), newline=False).decode(),
                )
            )
        )
    data = b"\n".join(lines) + b"\n"
    a2b, split = binascii.a2b_base64, msgspec.json.Decoder(list[msgspec.Raw]).decode

    def read() -> None:
        recs = list(map(RECORD_DECODER.decode, data.split(b"\n")[:-1]))
        record_hashes(lines)
        for rec in recs:
            assert isinstance(rec, EventRecord)
            split(
                aead.decrypt(a2b(rec.nonce, strict_mode=True), a2b(rec.ct, strict_mode=True), aad)
            )

    return _best_us(read, runs, len(plaintexts))


def _state_at(log_dir: Path, keyring: KeyRing, events: int) -> tuple[LogPosition, Ledger]:
    """The ledger after the first ``events`` events and the position of the last of them, as
    a daemon's periodic snapshot would have recorded them (a scan of the log, for the bench)."""
    ledger = Ledger()
    reader = LogReader(log_dir, keyring)
    last_cp: tuple[int | None, str] = (None, ZERO_HASH)
    run = every = 0
    for index, path in list_segments(log_dir):
        offset = 0
        for line in path.read_bytes().split(b"\n")[:-1]:
            rec = decode_record(line)
            start, offset = offset, offset + len(line) + 1
            if isinstance(rec, Genesis):
                every = rec.checkpoint_every
            elif isinstance(rec, Checkpoint):
                last_cp, run = (rec.seq, record_hash(line)), 0
            elif isinstance(rec, EventRecord | Recovery):
                run += 1
            if isinstance(rec, EventRecord):
                stored = StoredRecord(rec.seq, record_hash(line), rec)
                ledger.apply(decode_log_event(reader.decrypt(stored)))
                if ledger.events == events:
                    return LogPosition(
                        log_id=rec.log,
                        seq=rec.seq,
                        hash=stored.hash,
                        segment=index,
                        line_start=start,
                        end=offset,
                        last_cp_seq=last_cp[0],
                        last_cp_hash=last_cp[1],
                        checkpoint_every=every,
                        unsigned_run=run,
                    ), ledger
    raise ValueError(f"the log holds fewer than {events} events")
