"""``bide simulate`` as a real subprocess: prints its address, serves, stops on a signal."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from daemon.simulator import Simulator, is_loopback, read_request_log

from .conftest import SCRIPT, TOKEN

BIDE = [sys.executable, "-m", "daemon.cli"]


def _readline(proc: subprocess.Popen[str], timeout: float = 15.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"no line on stdout within {timeout} s")
    return proc.stdout.readline()


@contextmanager
def _simulate(*args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [*BIDE, "simulate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_prints_its_address_and_stops_on_a_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    log_file = tmp_path / "requests.jsonl"
    with _simulate(
        "--script", str(script), "--token-file", str(token_file), "--request-log", str(log_file)
    ) as proc:
        first = _readline(proc)
        assert first.startswith("listening on http://127.0.0.1:")
        base = first.split()[-1]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{base}/jobs/seq", headers=auth).json()["status"] == "queued"
        assert httpx.get(f"{base}/jobs/seq").status_code == 401
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()  # the process has exited: no block
    printed = first + out + err
    assert f"job seq: GET {base}/jobs/seq" in printed
    assert "Traceback" not in printed
    assert TOKEN not in printed
    assert TOKEN not in log_file.read_text()
    assert [(r.target, r.status) for r in read_request_log(log_file)] == [
        ("/jobs/seq", 200),
        ("/jobs/seq", 401),
    ]


def test_a_malformed_script_exits_2_naming_the_key(tmp_path: Path) -> None:
    script = tmp_path / "bad.toml"
    script.write_text('[jobs.a]\nsteps = [{ state = "queued", tims = 2 }]\n')
    result = subprocess.run(
        [*BIDE, "simulate", "--script", str(script)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert str(script) in result.stderr
    assert "`tims`" in result.stderr
    assert "jobs.a.steps[0]" in result.stderr
    assert "did you mean `times`" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--script", "{tmp}/missing.toml"], "cannot read the script"),
        (["--script", "{tmp}/ok.toml", "--token-file", "{tmp}/nope"], "cannot read the token"),
        (["--script", "{tmp}/ok.toml", "--request-log", "{tmp}/no/dir/x"], "does not exist"),
        (["--script", "{tmp}/ok.toml", "--port", "70000"], "--port"),
    ],
)
def test_bad_arguments_exit_2_without_a_traceback(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    (tmp_path / "ok.toml").write_text('[jobs.a]\nsteps = "queued"\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = subprocess.run([*BIDE, "simulate", *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_a_busy_port_exits_2(tmp_path: Path) -> None:
    (tmp_path / "ok.toml").write_text('[jobs.a]\nsteps = "queued"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*BIDE, "simulate", "--script", str(tmp_path / "ok.toml"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 2
    assert "cannot listen" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_explains_the_script_format() -> None:
    result = subprocess.run(
        [*BIDE, "simulate", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    for needle in ("Full example", "retry_after_date", "queued x2", "--token-file"):
        assert needle in result.stdout


def test_refuses_a_non_loopback_host_unless_asked() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "127.1.2.3"))
    assert not is_loopback("0.0.0.0")
    with pytest.raises(ValueError, match="loopback"):
        Simulator(host="0.0.0.0")
    Simulator(host="0.0.0.0", allow_remote=True)  # what an explicit --host does
