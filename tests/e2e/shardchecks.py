"""What the provider saw, checked against every shard's log in PostgreSQL (issue 39).

A run of several nodes on a sharded log leaves two records of what happened: the simulator's
request log (every request, when it arrived, for which job) and the shards' chains (every
intent, committed under its shard's lease epoch; each term opened by a takeover record naming
its holder). The checks here join the two, and hold for one shard (today's unsharded HA log)
as for many:

    attribute       each request to its intent: the latest intent of the job's operation
                    written at or before the request arrived; so to the intent's record, its
                    epoch, and the node that held the shard under that epoch (the takeover
                    record's holder). No test-only marker is sent to the provider: who sent a
                    request is read from the log, as an auditor would.
    quota           every sliding window of ``length`` seconds at the provider holds at most
                    ``burst - 1 + ceil(rate * length)`` requests (deploy/profiles/REFERENCE.md:
                    GCRA at ``requests_per_second``, ``burst`` at once after a quiet spell),
                    across every node together.
    intents         every request is under its own durable intent, within the budgets in
                    force (``assert_provider_invariants``, per operation, in its shard).
    fencing         no request made under a shard's epoch ``e`` arrives after epoch ``e + 1``
                    began (its takeover record committed): an operation is never polled by two
                    nodes at once; and per operation the epochs of its requests never go back.
    ended           every acknowledged operation is in the log of the shard its id hashes to,
                    and has ended.
    verified        ``bide verify --dsn`` (the chain, with ``verify.pub`` alone) and ``bide
                    replay --check`` (every decision re-derived) clean for every shard.
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from daemon.readers import LoadedLog, load_log
from daemon.simulator import RequestRecord
from eventlog import keys, pgstore
from eventlog.pgstore import PgSettings
from eventlog.shards import Layout, layout_of
from eventlog.store import write_segments
from replay.events import OperationRegistered, StatusRequestIntended
from replay.retention import ENDED_PHASES
from tests.e2e.harness import BIDE, assert_provider_invariants, config_text, verify_dsn
from tests.e2e.pgnodes import epoch_starts, epochs_of


@dataclass
class ShardLog:
    """One shard's log as the database holds it, and who held it when."""

    shard: int
    dsn: str
    log: LoadedLog
    epochs: dict[int, int]  # seq -> the epoch its record was committed under
    starts: dict[int, float]  # epoch -> its first record's commit time (the database's clock)
    holders: dict[int, str]  # epoch -> the node that took it (the takeover record's holder)
    export: Path
    jobs: dict[str, str] = field(default_factory=dict)  # provider job id -> operation id
    intents: dict[str, list[tuple[float, int, StatusRequestIntended]]] = field(
        default_factory=dict
    )  # operation -> (at, seq, intent), in log order


@dataclass(frozen=True)
class Attributed:
    """One request the provider received, and the intent, epoch and node it came from."""

    record: RequestRecord
    shard: int
    operation: str
    seq: int
    epoch: int
    node: str


def shard_dsns(dsn: str) -> tuple[Layout, list[str]]:
    """The layout of the log at ``dsn`` and each shard's DSN (the DSN itself for one shard)."""
    settings = PgSettings(dsn)
    layout = layout_of(settings)
    return layout, [layout.settings(settings, k).dsn for k in range(layout.count)]


def verify_shard(root: Path, dsn: str) -> dict[int, str]:
    """``bide verify --dsn`` on one shard with ``verify.pub`` alone (it must pass); the holder
    of each epoch, from the chain's takeover records."""
    out = verify_dsn(root, dsn, "--json")
    assert out.returncode == 0, f"bide verify --dsn {dsn}:\n{out.stdout}{out.stderr}"
    takeovers = json.loads(out.stdout)["takeovers"]
    return {int(t["lease_epoch"]): str(t["holder"]).split("/")[0] for t in takeovers}


def read_shards(root: Path, dsn: str, name: str, workers: int = 4) -> list[ShardLog]:
    """Every shard's log: exported from the database (``root/export-NAME-NNN``), verified,
    decrypted with the workspace's keys, with its epochs and holders. The shards' ``bide
    verify`` runs ``workers`` at a time (a process each)."""
    keyring = keys.load_keyring(root / "keys")
    _, dsns = shard_dsns(dsn)
    with ThreadPoolExecutor(workers) as pool:
        verified = list(pool.map(lambda d: verify_shard(root, d), dsns))
    shards: list[ShardLog] = []
    for k, (shard_dsn, holders) in enumerate(zip(dsns, verified, strict=True)):
        export = _export(root, shard_dsn, f"{name}-{k:03d}")
        log = load_log(export, keyring)
        assert not log.unreadable, f"shard {k}: unreadable records {log.unreadable[:3]}"
        shard = ShardLog(
            k, shard_dsn, log, epochs_of(shard_dsn), epoch_starts(shard_dsn), holders, export
        )
        for seq, ev in log.events:
            if isinstance(ev, OperationRegistered):
                shard.jobs[ev.provider_job_id] = ev.operation_id
            elif isinstance(ev, StatusRequestIntended):
                shard.intents.setdefault(ev.operation_id, []).append((ev.at, seq, ev))
        shards.append(shard)
    return shards


def _export(root: Path, dsn: str, name: str) -> Path:
    """The shard's records written as segment files (as ``bide log export`` does)."""
    out = root / f"export-{name}"
    with pgstore.connect(PgSettings(dsn), read_only=True) as conn:
        write_segments(pgstore.iter_all(conn), out)
    return out


def by_job(requests: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """The status requests, per job id, in arrival order."""
    grouped: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if r.kind == "status" and r.job_id is not None:
            grouped[r.job_id].append(r)
    return grouped


def attribute(shards: Sequence[ShardLog], requests: Iterable[RequestRecord]) -> list[Attributed]:
    """Each status request joined to the latest intent of its operation written at or before
    it arrived. A request for a job no shard registered, or before any intent, fails here."""
    owner = {job: shard for shard in shards for job in shard.jobs}
    out: list[Attributed] = []
    for job, received in by_job(requests).items():
        shard = owner.get(job)
        assert shard is not None, f"{len(received)} request(s) for job {job}: no shard has it"
        op = shard.jobs[job]
        intents = shard.intents.get(op, [])
        ats = [at for at, _, _ in intents]
        for record in received:
            k = bisect.bisect_right(ats, record.wall) - 1
            assert k >= 0, f"{op}: a request at {record.wall:.3f} before any intent"
            seq = intents[k][1]
            epoch = shard.epochs[seq]
            node = shard.holders.get(epoch, "?")
            out.append(Attributed(record, shard.shard, op, seq, epoch, node))
    return out


def busiest_window(arrivals: Sequence[float], length: float) -> tuple[int, float]:
    """The most arrivals in any half-open window ``[t, t + length)`` that starts at one, and
    that window's start (0.0 without arrivals)."""
    ordered = sorted(arrivals)
    most, at, end = 0, 0.0, 0
    for start, t in enumerate(ordered):
        end = max(end, start)
        while end < len(ordered) and ordered[end] < t + length:
            end += 1
        if end - start > most:
            most, at = end - start, t
    return most, at


def most_in_window(arrivals: Sequence[float], length: float) -> int:
    """The most arrivals in any half-open window ``[t, t + length)`` that starts at one."""
    return busiest_window(arrivals, length)[0]


def check_quota(
    arrivals: Sequence[float],
    rate: float,
    burst: int,
    lengths: Sequence[float] = (1.0,),
    senders: Sequence[str] = (),
) -> dict[float, int]:
    """The quota across every node, at the provider; the most seen in a window per length.
    ``senders`` (one per arrival, if given) name who sent what in a window over the quota."""
    seen: dict[float, int] = {}
    for length in lengths:
        allowed = burst - 1 + math.ceil(rate * length)
        seen[length], at = busiest_window(arrivals, length)
        if seen[length] <= allowed:
            continue
        named = senders or ["?"] * len(arrivals)
        inside = collections.Counter(
            who for t, who in zip(arrivals, named, strict=True) if at <= t < at + length
        )
        raise AssertionError(
            f"{seen[length]} requests at the provider within {length:g} s "
            f"(quota {rate:g}/s, burst {burst}: at most {allowed}), from {at:.3f}; by sender: "
            + (", ".join(f"{k} {v}" for k, v in sorted(inside.items())) or "not known")
        )
    return seen


def check_intents(
    shards: Sequence[ShardLog], requests: Iterable[RequestRecord], *, strict: bool = False
) -> int:
    """Every request under its own durable intent and within budget, operation by operation
    (``assert_provider_invariants`` on each operation's own events); how many operations."""
    received = by_job(requests)
    checked = 0
    for shard in shards:
        events: dict[str, list[tuple[int, object]]] = defaultdict(list)
        for seq, ev in shard.log.events:
            events[ev.operation_id].append((seq, ev))
        for job, op in shard.jobs.items():
            own = LoadedLog(events[op], {}, shard.log.head_seq)  # type: ignore[arg-type]
            assert_provider_invariants(own, received.get(job, []), op, strict=strict)
            checked += 1
    return checked


def check_fencing(shards: Sequence[ShardLog], polled: Sequence[Attributed]) -> dict[str, int]:
    """No request under a shard's epoch arrives after the shard's next epoch began; per
    operation the epochs of its requests never go back. Returns requests per node."""
    starts = {s.shard: s.starts for s in shards}
    per_node: dict[str, int] = defaultdict(int)
    last: dict[str, tuple[float, int]] = {}
    for a in sorted(polled, key=lambda a: a.record.wall):
        per_node[a.node] += 1
        later = [t for e, t in starts[a.shard].items() if e > a.epoch]
        nxt = min(later) if later else None
        assert nxt is None or a.record.wall < nxt, (
            f"{a.operation} (shard {a.shard}): a request made by node {a.node} under epoch "
            f"{a.epoch} arrived {a.record.wall - nxt:.3f} s after a later epoch began\n"
            + _context(shards[a.shard] if shards[a.shard].shard == a.shard else None, a, polled)
        )
        before = last.get(a.operation)
        assert before is None or before[1] <= a.epoch, (
            f"{a.operation}: a request under epoch {a.epoch} arrived after one under "
            f"{before[1]}: polled by two holders at once"
        )
        last[a.operation] = (a.record.wall, a.epoch)
    return dict(per_node)


def _context(shard: ShardLog | None, a: Attributed, polled: Sequence[Attributed]) -> str:
    """What an auditor needs beside a fencing failure: the shard's terms, the operation's
    intents and requests around it."""
    if shard is None:
        return ""
    t0 = a.record.wall
    terms = ", ".join(
        f"epoch {e} by {shard.holders.get(e, '?')} from {t - t0:+.3f}s"
        for e, t in sorted(shard.starts.items())
    )
    intents = "; ".join(
        f"intent {i.request_number} seq {seq} epoch {shard.epochs[seq]} at {at - t0:+.3f}s"
        for at, seq, i in shard.intents.get(a.operation, [])
        if abs(at - t0) < 30
    )
    requests = "; ".join(
        f"{p.record.wall - t0:+.3f}s by {p.node} (seq {p.seq}, epoch {p.epoch})"
        for p in polled
        if p.operation == a.operation and abs(p.record.wall - t0) < 30
    )
    return f"  terms: {terms}\n  intents: {intents}\n  requests: {requests}"


def check_ended(shards: Sequence[ShardLog], acknowledged: Iterable[str]) -> None:
    """Every acknowledged operation is in its own shard's log, and ended."""
    count = len(shards)
    layout = Layout("x", count)
    for op in acknowledged:
        shard = shards[layout.shard_of(op)]
        state = shard.log.ops.get(op)
        assert state is not None, f"{op}: acknowledged but not in shard {shard.shard}'s log"
        assert state.phase in ENDED_PHASES, f"{op}: still {state.phase} in shard {shard.shard}"


def replay_checks(root: Path, shards: Sequence[ShardLog], workers: int = 4) -> None:
    """:func:`replay_check` for every shard, ``workers`` at a time."""
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda s: replay_check(root, s), shards))


def replay_check(root: Path, shard: ShardLog) -> None:
    """``bide replay --check`` over the shard's exported log: every decision re-derived."""
    state = root / f"replay-{shard.export.name}"
    state.mkdir()
    (state / "log").symlink_to(shard.export)
    config = root / f"replay-{shard.export.name}.toml"
    config.write_text(config_text(state_dir=state.name))
    out = subprocess.run(
        [*BIDE, "replay", "--check", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=root,
    )
    assert out.returncode == 0, f"replay --check, shard {shard.shard}:\n{out.stdout}{out.stderr}"


def check_silent_after(
    shards: Sequence[ShardLog], polled: Sequence[Attributed], node: str, since: float
) -> int:
    """Node ``node`` sent nothing from ``since`` (its SIGCONT) under a term it held before:
    every request of its that arrived later is under an epoch it took after ``since``.
    Returns how many it sent under new terms."""
    starts = {s.shard: s.starts for s in shards}
    fresh = 0
    for a in polled:
        if a.node != node or a.record.wall < since:
            continue
        began = starts[a.shard][a.epoch]
        assert began >= since, (
            f"{a.operation} (shard {a.shard}): node {node} sent a request at "
            f"{a.record.wall - since:.3f} s after resuming, under epoch {a.epoch} it took "
            f"{since - began:.3f} s before it was paused and resumed"
        )
        fresh += 1
    return fresh


def epoch_spans(dsn: str) -> dict[int, tuple[float, float]]:
    """epoch -> (its first record's, its last record's) commit time (the database's clock)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT epoch, EXTRACT(EPOCH FROM min(committed_at))::float8, "
            "EXTRACT(EPOCH FROM max(committed_at))::float8 FROM bide_records GROUP BY epoch"
        ).fetchall()
    return {int(e): (float(a), float(b)) for e, a, b in rows}
