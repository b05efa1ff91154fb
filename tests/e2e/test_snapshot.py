"""State snapshots with the real daemon: a restart folds only the events after the snapshot,
ends in exactly the state a full replay gives, and any snapshot that does not match the log
is set aside for a full replay."""

from __future__ import annotations

import base64
import json
import re
import shutil
import stat
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from daemon.config import load_config
from daemon.snapshots import MODEL, replay_log
from eventlog import keys
from eventlog.epochs import read_epoch_key
from eventlog.keys import Signer
from eventlog.position import LogPosition
from eventlog.snapshot import seal_snapshot
from tests.e2e.harness import (
    Daemon,
    Workspace,
    assert_snapshot_is_the_full_fold,
    drop_registration,
    until,
    workspace,
)

FAST = (
    'state_pointer = "/status"\nbackoff_base_seconds = 0.1\nbackoff_cap_seconds = 0.2\n'
    "rate_limited_delay_seconds = 1\ndefault_max_status_requests = 1000\n"
)


def _replayed(daemon: Daemon) -> tuple[int, int]:
    """(events, of which from the snapshot) from the daemon's start-up line."""
    m = re.search(r"msg=replayed events=(\d+) .*from_snapshot=(\d+)", daemon.output())
    assert m, daemon.output()
    return int(m.group(1)), int(m.group(2))


def _start_polling(ws: Workspace, n: int) -> None:
    ws.write_profile(contract=FAST)
    for i in range(n):
        drop_registration(ws, f"op-{i}", f"job-{i}")


def _run_until(ws: Workspace, n: int, requests: int) -> Daemon:
    """Start a daemon, register ``n`` operations, wait for ``requests`` polls, stop cleanly."""
    daemon = ws.start_daemon()
    _start_polling(ws, n)
    ws.sim.wait_for_requests(requests, kind="status", timeout=15)
    assert daemon.stop() == 0
    return daemon


def _more_polls(ws: Workspace, count: int) -> None:
    """Wait until the provider has seen ``count`` more status requests (polling goes on)."""
    seen = len(ws.sim.requests(kind="status"))
    ws.sim.wait_for_requests(seen + count, kind="status", timeout=15)


def test_clean_stop_writes_a_snapshot_and_the_restart_folds_nothing_twice(tmp_path: Path) -> None:
    with workspace(tmp_path, {f"job-{i}": "running" for i in range(3)}) as ws:
        first = _run_until(ws, 3, 9)
        snapshot = tmp_path / "state" / "snapshot"
        assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
        assert 'msg="state snapshot written"' in first.output()
        events = assert_snapshot_is_the_full_fold(ws)

        second = ws.start_daemon()
        assert _replayed(second) == (events, events)  # everything came from the snapshot
        _more_polls(ws, 3)  # and polling goes on
        assert second.stop() == 0
        assert_snapshot_is_the_full_fold(ws)
        assert ws.bide("replay", "--check").returncode == 0


def test_an_older_snapshot_still_matches_and_the_tail_is_folded(tmp_path: Path) -> None:
    with workspace(tmp_path, {f"job-{i}": "running" for i in range(2)}) as ws:
        _run_until(ws, 2, 4)
        snapshot = tmp_path / "state" / "snapshot"
        old = tmp_path / "old-snapshot"
        shutil.copy2(snapshot, old)
        old_events = assert_snapshot_is_the_full_fold(ws)

        second = ws.start_daemon()
        _more_polls(ws, 4)
        assert second.stop() == 0
        shutil.copy2(old, snapshot)  # put the older one back

        third = ws.start_daemon()
        events, from_snapshot = _replayed(third)
        assert from_snapshot == old_events < events
        assert third.stop() == 0
        assert_snapshot_is_the_full_fold(ws)


def test_a_damaged_snapshot_is_set_aside_for_a_full_replay(tmp_path: Path) -> None:
    with workspace(tmp_path, {"job-0": "running"}) as ws:
        _run_until(ws, 1, 3)
        snapshot = tmp_path / "state" / "snapshot"
        data = bytearray(snapshot.read_bytes())
        data[-1] ^= 0x01
        snapshot.write_bytes(bytes(data))

        second = ws.start_daemon()
        assert "state snapshot not used" in second.output()
        assert "no state snapshot usable; replaying the whole log" in second.output()
        events, from_snapshot = _replayed(second)
        assert from_snapshot == 0 < events
        _more_polls(ws, 1)
        assert second.stop() == 0
        assert_snapshot_is_the_full_fold(ws)  # and a good one replaced it


def test_a_snapshot_of_a_replaced_log_is_not_used(tmp_path: Path) -> None:
    with workspace(tmp_path, {"job-0": "running"}) as ws:
        _run_until(ws, 1, 2)
        shutil.rmtree(tmp_path / "state" / "log")  # an operator starts a new log
        # ... and says so: without this the daemon refuses a log behind its published heads
        (tmp_path / "state" / "heads.jsonl").rename(tmp_path / "heads.jsonl.old")

        second = ws.start_daemon()
        assert "state snapshot does not match the log" in second.output()
        assert _replayed(second) == (0, 0)
        assert second.stop() == 0
        assert ws.log().ops == {}


def test_periodic_snapshots_then_sigkill_restart_from_snapshot_plus_tail(tmp_path: Path) -> None:
    with workspace(
        tmp_path, {f"job-{i}": "running" for i in range(4)}, config_extra="snapshot_every = 40\n"
    ) as ws:
        first = ws.start_daemon()
        _start_polling(ws, 4)
        until(
            lambda: first.output().count("state snapshot written") >= 2,
            timeout=30,
            what="two periodic snapshots",
        )
        _more_polls(ws, 4)
        first.kill()  # SIGKILL: the snapshot on disk is behind the log

        second = ws.start_daemon()
        events, from_snapshot = _replayed(second)
        assert 0 < from_snapshot < events
        _more_polls(ws, 4)
        assert second.stop() == 0
        assert_snapshot_is_the_full_fold(ws)
        checked = ws.bide("replay", "--check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert ws.bide("verify").returncode == 0


def test_offline_status_and_escalations_start_from_the_snapshot_not_from_record_0(
    tmp_path: Path,
) -> None:
    jobs = {"a": "running, succeeded with result", "b": "running", "c": "queued, manual_review"}
    with workspace(tmp_path, jobs) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("a", "op-a").returncode == 0
        assert ws.watch("b", "op-b", "--max-requests", "1000").returncode == 0
        assert ws.watch("c", "op-c").returncode == 0
        assert ws.bide("wait", "op-a", "--timeout", "20s").returncode == 0
        assert ws.bide("wait", "op-c", "--timeout", "20s").returncode == 3  # escalated
        assert daemon.stop() == 0  # a clean stop writes the snapshot at the head
        readers = (("status", "--offline", "--json"), ("escalations", "--offline", "--json"))
        full = [ws.bide(*r) for r in readers]
        assert all(r.returncode == 0 for r in full)
        [escalation] = json.loads(full[1].stdout)
        assert (escalation["operation_id"], escalation["reason"]) == ("op-c", "unknown_state")
        # The same answers from the whole log, with the snapshot moved aside.
        snapshot = tmp_path / "state" / "snapshot"
        snapshot.rename(tmp_path / "snapshot.aside")
        assert [ws.bide(*r).stdout for r in readers] == [r.stdout for r in full]
        (tmp_path / "snapshot.aside").rename(snapshot)
        # Damage a record before the snapshot's position: a reader from record 0 stops
        # there; one that starts from the snapshot never reads it, and answers the same.
        segment = sorted((tmp_path / "state" / "log").glob("seg-*.jsonl"))[0]
        lines = segment.read_bytes().split(b"\n")
        first_event = next(i for i, line in enumerate(lines) if b'"kind":"event"' in line)
        at = lines[first_event].index(b'"ct":"') + 6  # one ciphertext byte, same length
        line = bytearray(lines[first_event])
        line[at] = ord("A") if line[at] != ord("A") else ord("B")
        lines[first_event] = bytes(line)
        segment.write_bytes(b"\n".join(lines))
        again = [ws.bide(*r) for r in readers]
        assert [r.stdout for r in again] == [r.stdout for r in full], again[1].stderr
        broken = ws.bide("story", "op-a", "--offline")
        assert broken.returncode != 0
        assert "run `bide verify`" in broken.stderr


def _tag_key_from(backup: Path) -> bytes:
    """The snapshot tag key an old backup of the state directory yields: ``state.key`` where
    there was one, else the newest epoch key it holds."""
    state_key = backup / "state.key"
    if state_key.exists():
        seed = base64.b64decode(state_key.read_bytes().strip())
        return Signer(Ed25519PrivateKey.from_private_bytes(seed)).mac_key
    newest = max((backup / "epochs").glob("*-epoch-*.key"))
    return read_epoch_key(newest)[2].mac_key


def _forge_snapshot(ws: Workspace, backup: Path, drop: str) -> None:
    """What the holder of ``data.key`` and an old backup can write: today's head position
    (the snapshot's header is clear text) with a state in which operation ``drop`` never
    was, sealed with the data key and tagged with the backup's key."""
    cfg = load_config(str(ws.config))
    keyring = keys.load_keyring(keys.keys_directory(cfg.keys_dir))
    genuine = cfg.snapshot_path.read_bytes()
    header = json.loads(genuine[: genuine.index(b"\n")])
    position = msgspec.convert(header["position"], LogPosition)
    ledger = replay_log(cfg.log_dir, keyring)
    del ledger.ops[drop]
    forged = seal_snapshot(keyring, _tag_key_from(backup), position, ledger.dump(MODEL))
    cfg.snapshot_path.write_bytes(forged)


def test_a_snapshot_forged_with_the_data_key_and_an_old_backup_is_not_used(tmp_path: Path) -> None:
    with workspace(
        tmp_path, {f"job-{i}": "running" for i in range(2)}, config_extra="epoch_checkpoints = 1\n"
    ) as ws:
        _run_until(ws, 2, 4)
        state = tmp_path / "state"
        backup = tmp_path / "backup"
        shutil.copytree(state, backup, ignore=shutil.ignore_patterns("log", "spool", "*.sock"))
        old_epoch = json.loads(state.joinpath("snapshot").read_bytes().split(b"\n")[0])
        second = ws.start_daemon()
        _more_polls(ws, 8)
        assert second.stop() == 0
        now = json.loads(state.joinpath("snapshot").read_bytes().split(b"\n")[0])
        assert now["position"]["epoch"] > old_epoch["position"]["epoch"]  # keys moved on

        # The backup's own snapshot, genuine but of an epoch whose key is destroyed.
        shutil.copy2(backup / "snapshot", state / "snapshot")
        restored = ws.start_daemon()
        assert re.search(
            r'msg="state snapshot not used" snapshot=\S*state/snapshot '
            r'error=".*names epoch \d+ .*whose key this host does not hold',
            restored.output(),
        ), restored.output()
        assert _replayed(restored)[1] == 0
        assert restored.stop() == 0

        _forge_snapshot(ws, backup, drop="op-1")
        third = ws.start_daemon()
        out = third.output()
        assert re.search(r'msg="state snapshot not used" snapshot=\S*state/snapshot', out), out
        events, from_snapshot = _replayed(third)
        assert from_snapshot == 0 < events  # the whole log, not the forged state
        assert ws.bide("status", "op-1").returncode == 0  # the daemon knows op-1
        assert third.stop() == 0
        assert "op-1" in ws.log().ops
        assert_snapshot_is_the_full_fold(ws)
