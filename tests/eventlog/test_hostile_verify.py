"""``bide verify`` on hostile files: bounded memory, and a verdict nobody's lock can change."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from eventlog.lock import LOCK_FILE
from eventlog.segments import list_segments
from tests.eventlog._logtools import BIDE, KeySet, build_log, verify, verify_cli

GIB = 1024 * 1024 * 1024
_MEASURE = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"status": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _verify_measured(log: Path, ks: KeySet, *extra: str) -> dict[str, object]:
    """Run ``bide verify`` in a child and return its exit status, output and the largest
    resident size of the child or any of its workers (``RUSAGE_CHILDREN``)."""
    import json

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEASURE,
            *BIDE,
            "verify",
            str(log),
            "--verify-key",
            str(ks.verify_pub),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path.cwd()))},
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_two_gib_of_trailing_zeros_are_damage_found_in_bounded_memory(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    last = list_segments(log)[-1][1]
    os.truncate(last, last.stat().st_size + 2 * GIB)  # sparse: no GBs written
    for jobs in ("1", "2"):
        result = _verify_measured(log, ks, "--jobs", jobs)
        assert result["status"] == 1, result
        assert '"kind": "modified"' in str(result["stdout"])
        assert "longest record" in str(result["stdout"])
        maxrss = result["maxrss_kib"]
        assert isinstance(maxrss, int)
        assert maxrss < 300 * 1024, f"verify used {maxrss // 1024} MiB"


def test_a_few_trailing_zeros_are_still_a_torn_tail(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    last = list_segments(log)[-1][1]
    os.truncate(last, last.stat().st_size + 4096)
    assert verify(log, ks).verdict == "torn_tail"


def _hold_lock(log: Path) -> int:
    fd = os.open(log / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_foreign_lock_does_not_turn_a_torn_tail_into_intact(tmp_path: Path, ks: KeySet) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    last = list_segments(log)[-1][1]
    with last.open("ab") as f:
        f.write(b'{"kind":"event","seq":')  # a torn write
    assert verify_cli(log, ks.verify_pub).report["verdict"] == "torn_tail"
    fd = _hold_lock(log)  # anyone who can open LOCK: no writer behind it
    try:
        held = verify_cli(log, ks.verify_pub)
    finally:
        os.close(fd)
    assert held.status == 3, held.stdout
    assert held.report["verdict"] == "torn_tail"
    notes = held.report["notes"]
    assert isinstance(notes, list)
    assert any("lock is held" in n for n in notes)


def test_a_line_a_live_writer_completes_meanwhile_is_work_in_progress(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 20)
    last = list_segments(log)[-1][1]
    full = last.read_bytes()
    head = full[:-1].rsplit(b"\n", 1)[-1]
    last.write_bytes(full[: -len(head) // 2 - 1])  # the head record half written
    fd = _hold_lock(log)

    def finish() -> None:
        time.sleep(0.15)
        last.write_bytes(full)

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        report = verify(log, ks)
    finally:
        writer.join()
        os.close(fd)
    assert report.verdict == "intact", report.notes
    assert any("writer is appending" in n for n in report.notes)
