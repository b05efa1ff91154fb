"""What `bide verify` tells its reader: a progress line on a terminal (and nothing on stderr
otherwise), and with --witness a `witness` object in --json whether the check passed or not,
the verdict being the witness's finding when there is one. Real logs, the real command, a
real pseudo-terminal."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from daemon.verify_progress import ProgressLine, progress_line, progress_text
from eventlog.heads import encode_head, head_of
from tests.eventlog._logtools import (
    BIDE,
    KeySet,
    build_log,
    make_keys,
    read_lines,
    verify_cli,
    write_lines,
)
from tests.eventlog.conftest import BaseLogs


def _witness_file(log_dir: Path, path: Path) -> Path:
    """A file witness that saw every signed checkpoint of ``log_dir`` (as the daemon's file
    publisher writes them: one head per line)."""
    lines = [ln.data for ln in read_lines(log_dir) if ln.kind == "Checkpoint"]
    path.write_bytes(b"".join(encode_head(head_of(line)) + b"\n" for line in lines))
    return path


# -- the witness object ---------------------------------------------------------------------


def test_a_passing_witness_check_is_reported(
    base_logs: BaseLogs, log: Path, tmp_path: Path
) -> None:
    witness = _witness_file(log, tmp_path / "heads.jsonl")
    result = verify_cli(log, base_logs.keys.verify_pub, "--witness", str(witness))
    assert result.status == 0, result.stdout + result.stderr
    assert result.report["verdict"] == "intact"
    w = result.report["witness"]
    assert isinstance(w, dict), result.stdout
    assert w["checked"] is True
    assert w["finding"] == "consistent"
    assert w["kind"] is None
    last_cp = [ln for ln in read_lines(log) if ln.kind == "Checkpoint"][-1]
    assert w["newest_head"]["seq"] == last_cp.seq
    assert w["newest_head"]["hash"] == last_cp.hash
    [asked] = w["witnesses"]
    assert asked["witness"] == str(witness)
    assert asked["heads"] == len([ln for ln in read_lines(log) if ln.kind == "Checkpoint"])
    assert asked["lied"] == 0
    assert "log" in str(w["what"])

    key = str(base_logs.keys.verify_pub)
    text = subprocess.run(
        [*BIDE, "verify", str(log), "--verify-key", key, "--witness", str(witness)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert "WITNESS consistent" in text.stdout
    assert f"{last_cp.seq}:{last_cp.hash}" in text.stdout


def test_a_rollback_the_witness_found_is_the_verdict(
    base_logs: BaseLogs, log: Path, tmp_path: Path
) -> None:
    witness = _witness_file(log, tmp_path / "heads.jsonl")
    lines = read_lines(log)
    checkpoints = [i for i, ln in enumerate(lines) if ln.kind == "Checkpoint"]
    write_lines(log, lines[: checkpoints[len(checkpoints) // 2] + 1])  # an older signed state
    result = verify_cli(log, base_logs.keys.verify_pub, "--witness", str(witness))
    assert result.status == 4, result.stdout + result.stderr
    assert result.report["verdict"] == "rolled_back"
    w = result.report["witness"]
    assert isinstance(w, dict), result.stdout
    assert w["checked"] is True
    assert w["finding"] == "rolled_back"
    assert w["kind"] == "rolled_back"  # as before: what the log fails
    assert w["head"] == w["newest_head"]  # the newest head is the one it lacks
    assert "rolled back" in str(w["detail"])


def test_a_damaged_log_is_not_judged_by_the_witness(
    base_logs: BaseLogs, log: Path, tmp_path: Path
) -> None:
    witness = _witness_file(log, tmp_path / "heads.jsonl")
    lines = read_lines(log)
    del lines[len(lines) // 2]
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub, "--witness", str(witness))
    assert result.status == 1
    assert result.report["verdict"] == "damaged"
    w = result.report["witness"]
    assert isinstance(w, dict), result.stdout
    assert w["checked"] is False
    assert w["finding"] == "not_checked"
    assert w["witnesses"] == []


def test_without_witness_there_is_no_witness_object(base_logs: BaseLogs, log: Path) -> None:
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 0
    assert result.report["witness"] is None


# -- progress ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def large_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KeySet]:
    """A log of several fast-path work units (4 MiB each), so progress has steps to show."""
    root = tmp_path_factory.mktemp("large")
    ks = make_keys(root / "keys")
    build_log(
        root / "log",
        ks,
        24_000,
        segment_bytes=64 * 1024 * 1024,
        checkpoint_every=1000,
        batch=2000,
        payload=lambda i: i.to_bytes(4, "big") * 64,
    )
    size = sum(p.stat().st_size for p in (root / "log").iterdir() if p.name.startswith("seg-"))
    assert size > 3 * 4 * 1024 * 1024, size
    return root / "log", ks


def _on_a_terminal(cmd: list[str]) -> tuple[int, bytes, bytes]:
    """Run ``cmd`` with stderr on a pseudo-terminal; (status, stdout, what the terminal got)."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave)
    finally:
        os.close(slave)
    got = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    return proc.wait(60), out, bytes(got)


def test_progress_is_drawn_on_a_terminal(large_log: tuple[Path, KeySet]) -> None:
    log_dir, ks = large_log
    status, out, tty = _on_a_terminal(
        [*BIDE, "verify", str(log_dir), "--verify-key", str(ks.verify_pub), "--jobs", "1"]
    )
    assert status == 0, out + tty
    text = tty.decode()
    assert "records/s" in text, text
    assert "left" in text, text
    assert "\r" in text, text
    assert "\n" not in text, text  # one line, redrawn in place
    assert text.endswith("\r\x1b[K")  # erased before the report
    assert b"verdict=intact" in out


def test_no_terminal_no_progress(large_log: tuple[Path, KeySet]) -> None:
    log_dir, ks = large_log
    result = verify_cli(log_dir, ks.verify_pub, "--jobs", "1")
    assert result.status == 0
    assert result.stderr == ""


def test_progress_is_redrawn_at_most_four_times_a_second() -> None:
    now = [0.0]
    out = io.StringIO()
    line = ProgressLine(out, clock=lambda: now[0])
    for step in range(1, 100):  # 99 units done 0.01 s apart: about 1 s
        now[0] = step * 0.01
        line(step * 1000, step, 100)
    draws = out.getvalue().count("\r\x1b[K")
    assert 3 <= draws <= 5, out.getvalue()
    line.close()
    assert out.getvalue().endswith("\r\x1b[K")
    assert progress_line(io.StringIO()) is None  # not a terminal: quiet


def test_progress_text_gives_rate_and_time_left() -> None:
    text = progress_text(500_000, 250_000_000, 1_000_000_000, 2.0)
    assert "500,000 records" in text
    assert "250.0 MB of 1.0 GB (25%)" in text
    assert "250,000 records/s" in text
    assert "about 6 s left" in text
    assert "about 2 min 00 s left" in progress_text(1, 1, 5, 30.0)
    assert "under 1 s left" in progress_text(99, 99, 100, 0.3)
