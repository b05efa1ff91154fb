"""Archiving a log's oldest segments, and verifying archives and the live log as one chain.

Theory of operation:
    * **What moves.** ``bide log archive --before SEQ|TIME DEST`` finds the newest signed
      checkpoint at or before the boundary asked for, and moves the whole *sealed* segments
      (never the one the writer appends to, nor, with a writer running, the one before it)
      whose records all precede it. The *boundary checkpoint* is the last checkpoint in the
      moved segments: the live log keeps it, with the genesis record and the key-certifying
      checkpoints before it, in ``archived.json`` (:mod:`eventlog.boundary`), and verifies
      from it alone.
    * **What an archive is.** A directory: each segment gzip-compressed
      (``seg-NNNNNNNN.jsonl.gz``, byte-identical when decompressed) and ``manifest.json``
      (:class:`Manifest`): the segments, their sequence ranges, the sha256 of each compressed
      and original file, the boundary it starts from (after an earlier archive) and the one it
      ends at, when it was made and by which bide. The manifest is not signed and needs not be:
      the records are, and verifying an archive re-checks its chain; the checksums name a
      damaged file before anything is decompressed.
    * **Crash safety.** The order is: segments written and fsynced, the manifest written
      (temporary file, fsync, rename), the archive directory and its parent fsynced; then the
      live log's boundary file replaced atomically; only then are segments removed from the
      live log, each compared with its archived copy first. A crash before the boundary file
      leaves the live log exactly as it was (an unfinished archive is marked
      :data:`PARTIAL` and is overwritten by the rerun); a crash after it leaves segments the
      boundary already covers, which verification and reading skip and the rerun removes.
    * **With the daemon running.** The archiver never takes the writer lock and never writes
      a segment; it reads sealed segments, which the writer no longer touches, and replaces
      one file the writer reads only when it opens the log (:mod:`eventlog.writer` verifies
      from the boundary then). Segments after the state snapshot's position are kept, so a
      restart resumes from the snapshot without the archived records.
    * **PostgreSQL.** The records are exported to an archive the same way; they stay in the
      database (see :func:`export_only_reason`).
    * **Verifying.** :func:`verify_chain` checks archives (each from the genesis record, or
      from its starting boundary's signed checkpoint) and then the live log, as one chain,
      one segment at a time: the disk it needs is one decompressed segment.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from eventlog.boundary import (
    ArchiveRef,
    Boundary,
    BoundaryError,
    boundary_note,
    read_boundary,
    start_from,
    verify_live,
    write_boundary,
)
from eventlog.envelope import RECORD_DECODER, Checkpoint, record_hash
from eventlog.errors import EventLogError
from eventlog.fsync import fsync_dir, write_new_file
from eventlog.headchain import is_cert
from eventlog.keys import VerifyKey
from eventlog.segments import list_segments
from eventlog.verify import ChainStart, Damage, Report, verify_log

MANIFEST = "manifest.json"
PARTIAL = ".bide-archive-partial"  # present while an archive directory is being written
MANIFEST_VERSION = 1

#: Where an archive run may be stopped by a test (``at(stage)``): after the segments are
#: written, after the manifest, after the boundary file, after the first segment removed.
STAGES = ("segments", "manifest", "boundary", "removing")


class ArchiveError(EventLogError):
    """An archive cannot be made or read as asked; the message says why and what to do."""


class ArchivedSegment(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    name: str  # the segment file's name in the log
    file: str  # the compressed file's name in the archive
    first_seq: int
    last_seq: int
    records: int
    bytes: int
    sha256: str  # of the original segment file
    gz_bytes: int
    gz_sha256: str  # of the compressed file


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """An archive directory's description (``manifest.json``)."""

    version: int = MANIFEST_VERSION
    bide_version: str
    created_at: str  # UTC, ISO 8601
    source: str  # "files" or "postgresql"
    log_id: str
    first_segment: int
    last_segment: int
    first_seq: int
    last_seq: int
    last_hash: str
    boundary_checkpoint: int  # the boundary checkpoint's sequence number
    start: Boundary | None  # where the archive starts (None: at the genesis record)
    boundary: Boundary  # where the live log starts after it (its archived.json)
    segments: list[ArchivedSegment]
    removed_from_source: bool
    note: str = ""


_MANIFEST_DECODER = msgspec.json.Decoder(Manifest)


def load_manifest(dest: Path) -> Manifest:
    path = dest / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        more = (
            " (an archive run was interrupted there: rerun `bide log archive` with the same "
            "DEST to finish it)"
            if (dest / PARTIAL).exists()
            else ""
        )
        raise ArchiveError(f"{dest} holds no {MANIFEST}: not a bide archive{more}") from None
    try:
        return _MANIFEST_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ArchiveError(f"{path} does not parse ({exc}): the archive was altered") from None


# -- the boundary asked for ----------------------------------------------------------------------


@dataclass(frozen=True)
class Before:
    """``--before``: a sequence number, or a time (microseconds since the epoch)."""

    seq: int | None = None
    t_us: int | None = None

    def admits(self, cp: Checkpoint) -> bool:
        if self.seq is not None:
            return cp.seq <= self.seq
        assert self.t_us is not None
        return cp.t_us <= self.t_us

    def __str__(self) -> str:
        if self.seq is not None:
            return f"record {self.seq}"
        assert self.t_us is not None
        return datetime.fromtimestamp(self.t_us / 1e6, UTC).isoformat(timespec="seconds")


def parse_before(text: str) -> Before:
    """A sequence number (digits) or an ISO 8601 date or time (UTC unless it names a zone)."""
    text = text.strip()
    if text.isdigit():
        return Before(seq=int(text))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ArchiveError(
            f"--before {text!r} is neither a sequence number nor an ISO 8601 time "
            f"(e.g. 120000, 2026-01-01, 2026-01-01T00:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Before(t_us=int(when.timestamp() * 1_000_000))


# -- planning --------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What an archive run will move, decided before anything is written."""

    log_dir: Path
    log_id: str
    target: int  # the newest signed checkpoint at or before the boundary asked for
    segments: list[tuple[int, Path]]
    start: Boundary | None  # the live log's boundary now
    boundary: Boundary  # its boundary once the segments are archived
    first_seq: int
    last_seq: int
    bytes: int
    kept_for_snapshot: bool = False  # segments kept because the state snapshot is older
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _SegmentScan:
    index: int
    path: Path
    first_seq: int
    last_seq: int
    last_hash: str
    checkpoints: list[tuple[Checkpoint, bytes]]  # (record, line)


def _scan(index: int, path: Path) -> _SegmentScan:
    """A segment's sequence range and checkpoints; only complete lines (a segment being
    written may end in part of one, or hold none yet)."""
    lines = path.read_bytes().split(b"\n")
    lines.pop()  # after the last newline: nothing, or a line still being written
    if not lines:
        return _SegmentScan(index, path, -1, -1, "", [])
    try:
        recs = list(map(RECORD_DECODER.decode, lines))
    except (msgspec.DecodeError, ValueError):
        raise ArchiveError(
            f"{path} holds a line that is not a record; nothing archived. Run `bide verify`"
        ) from None
    cps = [(r, ln) for r, ln in zip(recs, lines, strict=True) if isinstance(r, Checkpoint)]
    return _SegmentScan(index, path, recs[0].seq, recs[-1].seq, record_hash(lines[-1]), cps)


def plan_archive(
    log_dir: Path,
    verify_key: VerifyKey,
    before: Before,
    *,
    snapshot_seq: int | None = None,
    writer_live: bool | None = None,
    keep_newest: int | None = None,
) -> Plan:
    """Verify the live log and decide what to archive; nothing is written.

    ``snapshot_seq``: the state snapshot's position; segments after it stay (a restart reads
    from it). ``keep_newest``: sealed segments to keep besides the one being written (default:
    one more while a writer holds the log, whose failed write may reach back into it).
    """
    report = verify_live(log_dir, verify_key, writer_live=writer_live)
    if report.damage is not None:
        d = report.damage
        raise ArchiveError(
            f"log {log_dir} is damaged at record {d.seq} ({d.kind}: {d.detail}); nothing "
            f"archived. Inspect it with `bide verify {log_dir}`"
        )
    old = read_boundary(log_dir)
    base = 0 if old is None else old.segments
    live = [s for s in list_segments(log_dir) if s[0] > base]
    keep = (2 if report.writer_live else 1) if keep_newest is None else keep_newest + 1
    sealed = live[: max(len(live) - keep, 0)]
    scans = [_scan(i, p) for i, p in sealed]
    # The newest checkpoint admitted may lie after the sealed segments: then all of them go.
    admitted = [cp.seq for s in scans for cp, _ in s.checkpoints if before.admits(cp)]
    admitted += _later_admitted(live[len(sealed) :], before)
    if not admitted:
        raise ArchiveError(
            f"no signed checkpoint at or before {before} in the live log {log_dir}"
            + (f" (it starts after record {old.seq}, archived already)" if old else "")
            + ": nothing can be archived; give a later --before"
        )
    target = max(admitted)
    chosen: list[_SegmentScan] = []
    kept_for_snapshot = False
    for s in scans:
        if s.last_seq > target:
            break
        if snapshot_seq is not None and s.last_seq > snapshot_seq:
            kept_for_snapshot = True
            break
        chosen.append(s)
    if not any(s.checkpoints for s in chosen):
        chosen = []  # the boundary must be a signed checkpoint among the archived records
    if not chosen:
        why = (
            f"the state snapshot is at record {snapshot_seq}, before them"
            if kept_for_snapshot
            else "none ends before it, or none holds a signed checkpoint"
        )
        raise ArchiveError(
            f"nothing to archive before checkpoint {target} (the newest signed checkpoint at or "
            f"before {before}): of {len(sealed)} sealed segment(s), {why}; the segment being "
            f"written{' and the one before it' if keep == 2 else ''} always stay"
        )
    boundary, exact = _boundary_of(log_dir, verify_key, old, chosen)
    if start_from(boundary, verify_key) != exact:  # pragma: no cover - a bug, not a user error
        raise ArchiveError("the boundary computed does not reproduce the chain's state; a bug")
    plan = Plan(
        log_dir=log_dir,
        log_id=report.log_id,
        target=target,
        segments=[(s.index, s.path) for s in chosen],
        start=old,
        boundary=boundary,
        first_seq=chosen[0].first_seq,
        last_seq=chosen[-1].last_seq,
        bytes=sum(s.path.stat().st_size for s in chosen),
        kept_for_snapshot=kept_for_snapshot,
    )
    if kept_for_snapshot:
        plan.notes.append(
            f"segments after record {snapshot_seq} stay: the state snapshot is there, and a "
            f"restart reads the log from it"
        )
    return plan


def _later_admitted(segments: list[tuple[int, Path]], before: Before) -> list[int]:
    """The checkpoints ``before`` admits in the segments that stay (verified already)."""
    return [cp.seq for i, p in segments for cp, _ in _scan(i, p).checkpoints if before.admits(cp)]


def _boundary_of(
    log_dir: Path, verify_key: VerifyKey, old: Boundary | None, chosen: list[_SegmentScan]
) -> tuple[Boundary, ChainStart]:
    """The boundary after ``chosen``, from a verification of exactly those segments (through
    links to them in a private directory) from the current boundary."""
    with tempfile.TemporaryDirectory(prefix="bide-archive-") as tmp:
        for s in chosen:
            os.symlink(s.path.resolve(), Path(tmp) / s.path.name)
        start = None if old is None else start_from(old, verify_key)
        report = verify_log(Path(tmp), verify_key, writer_live=False, start=start)
    if report.damage is not None or report.torn is not None or report.last_checkpoint_seq is None:
        raise ArchiveError(
            f"segments {chosen[0].index}..{chosen[-1].index} of {log_dir} do not verify on "
            f"their own ({report.summary()}); nothing archived"
        )
    exact = report.chain_start()
    cp_seq = report.last_checkpoint_seq
    cp_line = next(ln for s in chosen for cp, ln in s.checkpoints if cp.seq == cp_seq)
    genesis = old.genesis if old is not None else _first_line(chosen[0].path)
    certs = list(old.certs) if old is not None else []
    certs += [
        ln.decode("utf-8")
        for s in chosen
        for cp, ln in s.checkpoints
        if cp.seq < cp_seq and is_cert(ln.decode("utf-8"))
    ]
    boundary = Boundary(
        log_id=report.log_id,
        segments=chosen[-1].index,
        seq=report.head_seq,
        hash=report.head_hash,
        checkpoint=cp_line.decode("utf-8"),
        genesis=genesis,
        certs=certs,
        unsigned_run=report.unsigned_run,
        epoch_t_us=report.epoch_t_us,
        epoch_checkpoints=report.epoch_checkpoints,
        archives=list(old.archives) if old is not None else [],
    )
    return boundary, exact


def _first_line(path: Path) -> str:
    with path.open("rb") as f:
        return f.readline().rstrip(b"\n").decode("utf-8")


# -- writing -----------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare_dest(dest: Path, log_id: str) -> Manifest | None:
    """Make ``dest`` ready for a new archive; return its manifest when it holds a finished
    archive of this log (a rerun after an interruption finishes that one instead)."""
    if dest.exists() and not dest.is_dir():
        raise ArchiveError(f"DEST {dest} is a file; give a new or empty directory")
    if (dest / MANIFEST).exists():
        manifest = load_manifest(dest)
        if manifest.log_id != log_id:
            raise ArchiveError(
                f"DEST {dest} holds an archive of log {manifest.log_id}, not of this log "
                f"({log_id}); give a new or empty directory"
            )
        return manifest
    if dest.is_dir():
        names = {p.name for p in dest.iterdir()}
        if names and PARTIAL not in names:
            raise ArchiveError(
                f"DEST {dest} is not empty ({len(names)} entries) and holds no bide archive; "
                f"give a new or empty directory"
            )
        if PARTIAL in names:  # an interrupted run: its files are written again
            if (dest / PARTIAL).read_text().strip() != log_id:
                raise ArchiveError(
                    f"DEST {dest} holds an unfinished archive of another log; give a new or "
                    f"empty directory"
                )
            for name in names - {PARTIAL}:
                (dest / name).unlink()
    return None


def write_archive(
    plan: Plan,
    dest: Path,
    *,
    bide_version: str,
    source: str = "files",
    removed: bool = True,
    note: str = "",
    at: Callable[[str], None] = lambda _stage: None,
    progress: Callable[[int, int, int], None] = lambda _i, _n, _bytes: None,
) -> Manifest:
    """Write the planned segments and the manifest to ``dest`` and make them durable."""
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    fsync_dir(dest.parent)
    marker = dest / PARTIAL
    if not marker.exists():
        write_new_file(marker, plan.log_id.encode("ascii") + b"\n")
        fsync_dir(dest)
    entries: list[ArchivedSegment] = []
    done = 0
    for i, (index, path) in enumerate(plan.segments, start=1):
        data = path.read_bytes()
        gz = gzip.compress(data, compresslevel=6, mtime=0)
        name = f"{path.name}.gz"
        write_new_file(dest / name, gz)
        first = RECORD_DECODER.decode(data[: data.index(b"\n")]).seq
        last = RECORD_DECODER.decode(data[data.rstrip(b"\n").rfind(b"\n") + 1 :].rstrip()).seq
        entries.append(
            ArchivedSegment(
                index=index,
                name=path.name,
                file=name,
                first_seq=first,
                last_seq=last,
                records=last - first + 1,
                bytes=len(data),
                sha256=_sha256(data),
                gz_bytes=len(gz),
                gz_sha256=_sha256(gz),
            )
        )
        done += len(data)
        progress(i, len(plan.segments), done)
    fsync_dir(dest)
    at("segments")
    created = datetime.now(UTC).isoformat(timespec="seconds")
    ref = ArchiveRef(
        dest=str(dest),
        first_segment=plan.segments[0][0],
        last_segment=plan.segments[-1][0],
        first_seq=plan.first_seq,
        last_seq=plan.last_seq,
        created_at=created,
    )
    boundary = msgspec.structs.replace(plan.boundary, archives=[*plan.boundary.archives, ref])
    manifest = Manifest(
        bide_version=bide_version,
        created_at=created,
        source=source,
        log_id=plan.log_id,
        first_segment=ref.first_segment,
        last_segment=ref.last_segment,
        first_seq=plan.first_seq,
        last_seq=plan.last_seq,
        last_hash=boundary.hash,
        boundary_checkpoint=boundary.checkpoint_seq,
        start=plan.start,
        boundary=boundary,
        segments=entries,
        removed_from_source=removed,
        note=note,
    )
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.unlink(missing_ok=True)
    write_new_file(tmp, msgspec.json.format(msgspec.json.encode(manifest)) + b"\n")
    os.replace(tmp, dest / MANIFEST)
    marker.unlink()
    fsync_dir(dest)
    at("manifest")
    return manifest


def commit_archive(
    log_dir: Path, manifest: Manifest, *, at: Callable[[str], None] = lambda _stage: None
) -> int:
    """Point the live log past a finished archive, then remove the archived segments from it
    (each compared with its archived copy first). Idempotent: a rerun finishes an interrupted
    one. Returns how many segment files were removed."""
    now = read_boundary(log_dir)
    if now is None or now.segments < manifest.last_segment:
        if (now.segments if now else 0) != manifest.first_segment - 1:
            raise ArchiveError(
                f"the archive holds segments {manifest.first_segment}..{manifest.last_segment}, "
                f"but the live log {log_dir} starts after segment "
                f"{now.segments if now else 0}: it does not continue this log's archives"
            )
        present = dict(list_segments(log_dir))
        for entry in manifest.segments:
            path = present.get(entry.index)
            if path is None or _sha256(path.read_bytes()) != entry.sha256:
                raise ArchiveError(
                    f"segment {entry.name} of the live log is "
                    f"{'missing' if path is None else 'not the one archived'}; nothing removed"
                )
        write_boundary(log_dir, manifest.boundary)
    at("boundary")
    by_index = {e.index: e for e in manifest.segments}
    removed = 0
    for index, path in list_segments(log_dir):
        archived = by_index.get(index)
        if archived is None:
            continue
        if _sha256(path.read_bytes()) != archived.sha256:
            raise ArchiveError(
                f"segment {path.name} differs from its archived copy; it stays (inspect it "
                f"with `bide verify --archive`)"
            )
        path.unlink()
        removed += 1
        if removed == 1:
            at("removing")
    fsync_dir(log_dir)
    return removed


def export_only_reason() -> str:
    return (
        "the records stay in the database: every reader of the log in PostgreSQL (a node "
        "taking the lease, the local copies, `bide log export`, `bide verify --dsn`) rebuilds "
        "segment files from record 0, and the daemons' role holds no DELETE (it appends "
        "only through the functions that check the chain); deleting rows would need a schema "
        "in which the table starts at a boundary, which this version does not have"
    )


# -- verifying archives and the live log as one chain -----------------------------------------


@dataclass
class _Progress:
    records: int = 0
    checkpoints: int = 0
    segments: int = 0


def verify_chain(
    archives: list[Path],
    log_dir: Path,
    verify_key: VerifyKey,
    *,
    anchor: tuple[int, str] | None = None,
    jobs: int = 1,
    writer_live: bool | None = None,
) -> Report:
    """Verify ``archives`` (in any order) and then the live log at ``log_dir`` as one chain.
    Never raises on damage: the report names it (in an archive: its directory, the segment
    and the record)."""
    manifests = sorted(((load_manifest(d), d) for d in archives), key=lambda m: m[0].first_segment)
    seen = _Progress()
    state: ChainStart | None = None
    notes: list[str] = []
    first, first_dest = manifests[0]
    if first.first_segment != 1:
        if first.start is None:
            return _damaged(first_dest, Damage("segment_link", 0, MANIFEST, 0, "no start"))
        try:
            state = start_from(first.start, verify_key)
        except BoundaryError as exc:
            return _damaged(
                first_dest, Damage("bad_signature", first.start.seq, MANIFEST, 0, str(exc))
            )
        notes.append(
            f"archive {first_dest} starts after record {first.start.seq}: "
            + boundary_note(first.start)
        )
    expected = first.first_segment
    log_id = first.log_id
    for manifest, dest in manifests:
        if manifest.log_id != log_id:
            return _damaged(
                dest,
                Damage(
                    "spliced", manifest.first_seq, MANIFEST, 0, f"archive of log {manifest.log_id}"
                ),
            )
        if manifest.first_segment != expected:
            return _damaged(
                dest,
                Damage(
                    "missing",
                    state.seq + 1 if state else 0,
                    MANIFEST,
                    0,
                    f"segments {expected}..{manifest.first_segment - 1} are in no archive given "
                    f"(give every archive, or none before this one)",
                ),
            )
        result = _verify_archive(manifest, dest, verify_key, state, anchor, seen)
        if isinstance(result, Report):
            return result
        state = result
        expected = manifest.last_segment + 1
    assert state is not None
    boundary = read_boundary(log_dir)
    live_base = boundary.segments if boundary else 0
    if live_base > state.segments:
        report = Report(log_dir=log_dir)
        report.damage = Damage(
            "missing",
            state.seq + 1,
            "archived.json",
            0,
            f"the live log starts after segment {live_base}, the archives given end at "
            f"segment {state.segments}: segments {state.segments + 1}..{live_base} are archived "
            f"elsewhere ({_dests(boundary)}); give that archive too",
        )
        return report
    archived = {e.index: e for m, _ in manifests for e in m.segments}
    for index, path in list_segments(log_dir):
        leftover = archived.get(index)
        if index <= state.segments and leftover is not None:
            if _sha256(path.read_bytes()) != leftover.sha256:
                report = Report(log_dir=log_dir)
                report.damage = Damage(
                    "modified",
                    leftover.first_seq,
                    path.name,
                    0,
                    f"the live log still holds segment {path.name} (an interrupted archive), "
                    f"and it differs from its archived copy",
                )
                return report
            notes.append(
                f"the live log still holds archived segment {path.name} (an interrupted "
                f"archive: rerun `bide log archive` to remove it); it matches its archived copy"
            )
    report = verify_log(
        log_dir, verify_key, anchor=anchor, jobs=jobs, writer_live=writer_live, start=state
    )
    report.records += seen.records
    report.checkpoints += seen.checkpoints
    report.segments += seen.segments
    report.notes[:0] = [
        *notes,
        f"verified as one chain: {len(manifests)} archive(s) ("
        + ", ".join(f"{d}: records {m.first_seq}..{m.last_seq}" for m, d in manifests)
        + "), then the live log",
    ]
    return report


def _dests(boundary: Boundary | None) -> str:
    return ", ".join(r.dest for r in boundary.archives) if boundary else "unknown"


def _damaged(where: Path, damage: Damage) -> Report:
    report = Report(log_dir=where)
    report.damage = Damage(
        damage.kind, damage.seq, damage.segment, damage.offset, f"archive {where}: {damage.detail}"
    )
    return report


def _verify_archive(
    manifest: Manifest,
    dest: Path,
    verify_key: VerifyKey,
    state: ChainStart | None,
    anchor: tuple[int, str] | None,
    seen: _Progress,
) -> ChainStart | Report:
    """Each archived segment decompressed alone into a private directory and verified from
    the state the one before it left; the state after the last, or the damage found."""
    with tempfile.TemporaryDirectory(prefix="bide-verify-archive-") as tmp:
        for entry in manifest.segments:
            first_seq = state.seq + 1 if state else 0
            gz_path = dest / entry.file
            try:
                gz = gz_path.read_bytes()
            except FileNotFoundError:
                return _damaged(
                    dest,
                    Damage(
                        "segment_link",
                        first_seq,
                        entry.file,
                        0,
                        f"archived segment {entry.file} (records {entry.first_seq}.."
                        f"{entry.last_seq}) is missing",
                    ),
                )
            try:
                data = gzip.decompress(gz)
            except (OSError, EOFError, ValueError) as exc:
                return _damaged(
                    dest,
                    Damage("modified", first_seq, entry.file, 0, f"does not decompress ({exc})"),
                )
            seg = Path(tmp) / entry.name
            seg.write_bytes(data)
            a = anchor if anchor and entry.first_seq <= anchor[0] <= entry.last_seq else None
            report = verify_log(Path(tmp), verify_key, writer_live=False, start=state, anchor=a)
            seg.unlink()
            if report.damage is None and report.torn is not None:
                report.damage = Damage(
                    "modified",
                    report.torn.seq,
                    entry.name,
                    report.torn.offset,
                    "the archived segment ends in an incomplete record",
                )
            if report.damage is None and (
                _sha256(gz) != entry.gz_sha256 or _sha256(data) != entry.sha256
            ):
                report.damage = Damage(
                    "modified",
                    first_seq,
                    entry.file,
                    0,
                    "its records verify, but its sha256 is not the manifest's: the manifest "
                    "or the file was changed after archiving",
                )
            if report.damage is not None:
                d = report.damage
                return _damaged(dest, Damage(d.kind, d.seq, entry.file, d.offset, d.detail))
            seen.records += report.records
            seen.checkpoints += report.checkpoints
            seen.segments += 1
            state = report.chain_start()
    assert state is not None
    if (state.seq, state.hash) != (manifest.last_seq, manifest.last_hash):
        return _damaged(
            dest,
            Damage(
                "modified",
                state.seq,
                MANIFEST,
                0,
                f"the archive ends at record {state.seq}, its manifest says {manifest.last_seq}",
            ),
        )
    return state


def materialize(archives: list[Path], log_dir: Path, into: Path) -> Path:
    """A whole log in ``into`` for the offline readers: the archives' segments decompressed,
    and links to the live log's segments after them. The chain is checked as it is read."""
    into.mkdir(mode=0o700, parents=True, exist_ok=True)
    last = 0
    for manifest, dest in sorted(
        ((load_manifest(d), d) for d in archives), key=lambda m: m[0].first_segment
    ):
        for entry in manifest.segments:
            try:
                data = gzip.decompress((dest / entry.file).read_bytes())
            except (OSError, EOFError) as exc:
                raise ArchiveError(
                    f"archive {dest}: {entry.file} cannot be read ({exc}); check it with "
                    f"`bide verify --archive {dest}`"
                ) from None
            write_new_file(into / entry.name, data)
        last = max(last, manifest.last_segment)
    for index, path in list_segments(log_dir):
        if index > last:
            os.symlink(path.resolve(), into / path.name)
    return into
