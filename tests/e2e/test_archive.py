"""Log archival with the real daemon and the real CLI: ``bide log archive`` moves old sealed
segments out of a live log (the daemon running or not), the live log verifies from its
boundary checkpoint, an archive plus the live log verify as one chain, a changed or missing
archived segment is caught, a SIGKILLed archive run loses nothing and a rerun finishes it, and
the daemon restarts on the archived log (and says clearly when it cannot)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon.config import load_config
from eventlog.archive import MANIFEST, load_manifest
from eventlog.segments import BOUNDARY_FILE, list_segments
from tests.e2e.harness import BIDE, Daemon, Workspace, drop_registration, until, workspace

FAST = (
    'state_pointer = "/status"\nbackoff_base_seconds = 0.1\nbackoff_cap_seconds = 0.2\n'
    "rate_limited_delay_seconds = 1\ndefault_max_status_requests = 1000\n"
)
SMALL_SEGMENTS = "segment_bytes = 4096\nsnapshot_every = 20\n"
JOBS: dict[str, str | list[object]] = {f"job-{n}": "running" for n in range(3)}


def _grow(ws: Workspace, segments: int) -> Daemon:
    """A running daemon polling three jobs until the log has ``segments`` segment files."""
    ws.write_profile(contract=FAST)
    daemon = ws.start_daemon()
    for n in range(3):
        drop_registration(ws, f"op-{n}", f"job-{n}")
    log_dir = load_config(str(ws.config)).log_dir

    until(lambda: _grown(log_dir, segments), 90, f"{segments} segments and 3 checkpoints")
    return daemon


def _grown(log_dir: Path, segments: int) -> bool:
    """The live log holds ``segments`` segments and 3 checkpoints (one about every 90
    records here), so whole segments end before a checkpoint and hold one."""
    found = list_segments(log_dir)
    checkpoints = sum(p.read_bytes().count(b'"kind":"checkpoint"') for _, p in found)
    return len(found) >= segments and checkpoints >= 3


def _head(ws: Workspace) -> int:
    out = ws.bide("log", "head", "--json")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["seq"])


def _verify(ws: Workspace, *args: str) -> tuple[int, dict[str, Any]]:
    out = ws.bide("verify", "--json", *args)
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


def _archive(ws: Workspace, dest: Path, before: str, *flags: str) -> dict[str, Any]:
    out = ws.bide("log", "archive", "--before", before, str(dest), "--json", *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    return dict(json.loads(out.stdout))


def _rewrite_member(dest: Path, index: int, change: bytes, to: bytes, *, manifest: bool) -> None:
    """Change bytes inside one archived segment and recompress it; with ``manifest`` also
    fix its checksums there, so only the chain can tell."""
    m = load_manifest(dest)
    entry = m.segments[index]
    data = gzip.decompress((dest / entry.file).read_bytes())
    assert change in data
    data = data.replace(change, to, 1)
    gz = gzip.compress(data, mtime=0)
    (dest / entry.file).write_bytes(gz)
    if manifest:
        import hashlib

        fixed = msgspec.structs.replace(
            entry,
            sha256=hashlib.sha256(data).hexdigest(),
            gz_sha256=hashlib.sha256(gz).hexdigest(),
        )
        segs = list(m.segments)
        segs[index] = fixed
        (dest / MANIFEST).write_bytes(
            msgspec.json.encode(msgspec.structs.replace(m, segments=segs))
        )


def test_archive_with_the_daemon_running_then_verify_and_restart(tmp_path: Path) -> None:
    with workspace(tmp_path, JOBS, config_extra=SMALL_SEGMENTS) as ws:
        daemon = _grow(ws, 14)
        log_dir = load_config(str(ws.config)).log_dir
        dest = tmp_path / "archive-1"

        dry = ws.bide("log", "archive", "--before", str(_head(ws)), str(dest), "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would archive segments 1.." in dry.stdout
        assert not dest.exists()
        assert (log_dir / "seg-00000001.jsonl").exists()

        done = _archive(ws, dest, str(_head(ws)))
        first, last = done["segments"]
        assert first == 1
        assert last >= 5
        assert done["removed_segments"] == last
        assert done["compressed_bytes"] < done["bytes"]
        assert not (log_dir / "seg-00000001.jsonl").exists()
        assert (log_dir / BOUNDARY_FILE).exists()
        manifest = load_manifest(dest)
        assert manifest.first_seq == 0
        assert manifest.removed_from_source
        assert manifest.boundary.checkpoint_seq <= manifest.last_seq

        # The daemon goes on appending, to a log that now starts at the boundary.
        before = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(before + 20, kind="status", timeout=30)

        rc, live = _verify(ws)
        assert rc == 0, live
        assert any("archived" in str(n) for n in live["notes"])
        rc, whole = _verify(ws, "--archive", str(dest))
        assert rc == 0, whole
        assert whole["records"] == whole["head"]["seq"] + 1

        # A second archive continues the first; both with the live log are one chain.
        until(lambda: _grown(log_dir, 8), 90, "more segments and checkpoints")
        dest2 = tmp_path / "archive-2"
        second = _archive(ws, dest2, str(_head(ws)))
        assert second["segments"][0] == last + 1
        rc, whole = _verify(ws, "--archive", str(dest2), "--archive", str(dest))
        assert rc == 0, whole
        rc, partial = _verify(ws, "--archive", str(dest2))  # the later archive alone
        assert rc == 0, partial

        # Restart: the daemon resumes from its snapshot, on the archived log.
        assert daemon.stop() == 0
        again = ws.start_daemon()
        before = len(ws.sim.requests(kind="status"))
        ws.sim.wait_for_requests(before + 10, kind="status", timeout=30)
        told = ws.bide("story", "op-0")  # the daemon's API: the story begins in the archive
        assert told.returncode != 0
        assert str(dest) in told.stderr
        assert "--offline --archive" in told.stderr
        assert again.stop() == 0
        rc, whole = _verify(ws, "--archive", str(dest), "--archive", str(dest2))
        assert rc == 0, whole
        assert whole["clean_close"] is True

        # An archived op's story offline: a clear message, or read with --archive.
        out = ws.bide("story", "op-0", "--offline")
        assert out.returncode != 0
        assert str(dest) in out.stderr
        assert "--archive" in out.stderr
        out = ws.bide("story", "op-0", "--offline", "--archive", str(dest), "--archive", str(dest2))
        assert out.returncode == 0, out.stderr
        assert "registered" in out.stdout.lower()


def test_a_changed_or_missing_archived_segment_is_caught(tmp_path: Path) -> None:
    with workspace(tmp_path, JOBS, config_extra=SMALL_SEGMENTS) as ws:
        daemon = _grow(ws, 16)
        assert daemon.stop() == 0
        dest = tmp_path / "archive"
        _archive(ws, dest, str(_head(ws)))

        changed = tmp_path / "changed"
        shutil.copytree(dest, changed)
        _rewrite_member(changed, 2, b'"seq":', b'"seq": ', manifest=True)
        rc, report = _verify(ws, "--archive", str(changed))
        assert rc == 1
        damage = report["damage"]
        assert isinstance(damage, dict)
        assert str(changed) in damage["detail"]

        recompressed = tmp_path / "recompressed"
        shutil.copytree(dest, recompressed)
        _rewrite_member(recompressed, 1, b'"ct":"', b'"ct":"A', manifest=False)
        rc, report = _verify(ws, "--archive", str(recompressed))
        assert rc == 1
        assert report["damage"]

        missing = tmp_path / "missing"
        shutil.copytree(dest, missing)
        (missing / load_manifest(missing).segments[1].file).unlink()
        rc, report = _verify(ws, "--archive", str(missing))
        assert rc == 1
        assert report["damage"]["kind"] == "segment_link"

        rc, report = _verify(ws, "--archive", str(dest))  # the original is still whole
        assert rc == 0, report


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("stage", ["segments", "manifest", "boundary", "removing"])
def test_a_killed_archive_run_leaves_everything_verifiable(tmp_path: Path, stage: str) -> None:
    with workspace(tmp_path, JOBS, config_extra=SMALL_SEGMENTS) as ws:
        daemon = _grow(ws, 16)
        assert daemon.stop() == 0
        dest = tmp_path / "archive"
        head = str(_head(ws))
        proc = subprocess.Popen(
            [*BIDE, "log", "archive", "--before", head, str(dest), "--config", str(ws.config)],
            env={**os.environ, "BIDE_FAULT_INJECT": f"archive:{stage}:stop"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            until(lambda: proc.poll() is None and _stopped(proc.pid), 30, "the run to stop")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=10)

        rc, live = _verify(ws)  # the live log, as the kill left it
        assert rc == 0, live
        if stage in ("manifest", "boundary", "removing"):
            rc, whole = _verify(ws, "--archive", str(dest))
            assert rc == 0, whole

        again = _archive(ws, dest, head)  # the rerun finishes (or redoes) it
        assert again["resumed"] is (stage != "segments")
        log_dir = load_config(str(ws.config)).log_dir
        assert not (log_dir / "seg-00000001.jsonl").exists()
        rc, whole = _verify(ws, "--archive", str(dest))
        assert rc == 0, whole
        restarted = ws.start_daemon()
        assert restarted.stop() == 0


def test_refusals_are_clear(tmp_path: Path) -> None:
    with workspace(tmp_path, JOBS, config_extra=SMALL_SEGMENTS) as ws:
        daemon = _grow(ws, 16)
        assert daemon.stop() == 0
        full = tmp_path / "full"
        full.mkdir()
        (full / "something").write_text("x")
        out = ws.bide("log", "archive", "--before", str(_head(ws)), str(full))
        assert out.returncode == 2
        assert "not empty" in out.stderr
        out = ws.bide("log", "archive", "--before", "2001-01-01", str(tmp_path / "a"))
        assert out.returncode == 2
        assert "no signed checkpoint at or before" in out.stderr
        out = ws.bide("log", "archive", "--before", "yesterday", str(tmp_path / "a"))
        assert out.returncode == 2
        assert "ISO 8601" in out.stderr

        # A restart whose snapshot is gone cannot replay archived records: it says so.
        _archive(ws, tmp_path / "archive", str(_head(ws)))
        load_config(str(ws.config)).snapshot_path.unlink()
        out = ws.bide("log", "archive", "--before", str(_head(ws)), str(tmp_path / "b"))
        assert out.returncode == 2
        assert "no state snapshot" in out.stderr
        broken = ws.start_daemon(ready=False)
        assert broken.proc.wait(30) != 0
        assert "archived" in broken.output()
        assert str(tmp_path / "archive") in broken.output()


def test_postgres_exports_an_archive_that_verifies_with_the_database(tmp_path: Path) -> None:
    with workspace(tmp_path, JOBS, config_extra=SMALL_SEGMENTS, store="postgres") as ws:
        assert ws.dsn is not None
        daemon = _grow(ws, 16)
        ws.wait_writer(daemon)
        time.sleep(0)  # the copy in the state dir leads the database by at most one round
        key = str(tmp_path / "keys" / "verify.pub")
        dest = tmp_path / "pg-archive"
        out = subprocess.run(
            [
                *BIDE,
                "log",
                "archive",
                "--dsn",
                ws.dsn,
                "--verify-key",
                key,
                "--json",
                "--before",
                str(_head(ws)),
                str(dest),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        done = json.loads(out.stdout)
        assert done["removed_from_source"] is False
        assert done["removed_segments"] == 0
        assert "stay in the database" in " ".join(done["notes"])
        assert daemon.stop() == 0
        verified = subprocess.run(
            [*BIDE, "verify", "--dsn", ws.dsn, "--verify-key", key, "--archive", str(dest)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "verified as one chain" in verified.stdout
