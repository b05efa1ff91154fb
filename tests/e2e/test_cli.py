"""The command line's contract: reloads, drains, exit statuses, and errors that name the fix."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from replay.events import RequestOutcomeUnknown
from tests.e2e.harness import BIDE, DEFAULT_CONTRACT, until, workspace


def test_profile_change_reloads_and_an_invalid_one_keeps_the_last_good(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a": "running", "b": "running"}) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("a", "a").returncode == 0
        digest_a = ws.log().ops["a"].contract_digest
        ws.write_profile(
            contract=DEFAULT_CONTRACT.replace(
                "backoff_cap_seconds = 0.4", "backoff_cap_seconds = 0.5"
            )
        )
        until(
            lambda: daemon.output().count('msg="profile loaded"') >= 2,
            what="the changed profile to load",
        )
        assert ws.watch("b", "b").returncode == 0
        log = ws.log()
        assert log.ops["b"].contract_digest != digest_a  # new operations get the new profile
        assert log.ops["a"].contract_digest == digest_a  # ... existing ones keep theirs
        profile = tmp_path / "profiles" / "sim.toml"
        profile.write_text(
            profile.read_text().replace('state_pointer = "/status"', "state_pointer = 7")
        )
        daemon.proc.send_signal(signal.SIGHUP)
        until(
            lambda: "keeping the last good version" in daemon.output(),
            what="the invalid profile to be refused",
        )
        assert ws.watch("a", "c").returncode == 0  # still served by the last good profile


def test_check_profile_names_file_line_and_key(tmp_path: Path) -> None:
    """S19: a status call with an unsafe method (POST) is refused, naming file, line, key."""
    bad = tmp_path / "acme.toml"
    bad.write_text(
        '[status]\nurl = "https://x.example/{job_id}"\nmethod = "POST"\n\n'
        '[contract]\nstate_pointer = "/status"\n[contract.states]\n'
        'success = ["done"]\n'
    )
    out = subprocess.run(
        [*BIDE, "check-profile", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1
    assert f"{bad}:3: status.method" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_sigterm_drains_and_records_the_rest_as_unknown(tmp_path: Path) -> None:
    jobs = {"slow": [{"delay": 5.0, "state": "running"}]}
    extra = "\n[daemon]\ndrain_seconds = 0.5\n"
    with workspace(tmp_path, jobs, config_extra=extra) as ws:
        daemon = ws.start_daemon()
        assert ws.watch("slow", "s").returncode == 0
        ws.sim.wait_for_requests(1, kind="status", job_id="slow", timeout=10)
        assert daemon.stop(timeout=15) == 0
        events = [e for _, e in ws.log().events]
        [unknown] = [e for e in events if isinstance(e, RequestOutcomeUnknown)]
        assert unknown.request_number == 1
        assert "verdict=intact" in ws.bide("verify").stdout  # final checkpoint, clean close
        assert ws.bide("verify", "--json").stdout.count('"clean_close": true') == 1


def test_wait_times_out_with_124(tmp_path: Path) -> None:
    with workspace(tmp_path, {"r": "running"}) as ws:
        ws.start_daemon()
        assert ws.watch("r", "r").returncode == 0
        assert ws.bide("wait", "r", "--timeout", "1s").returncode == 124
        unknown = ws.bide("wait", "nope", "--timeout", "1s")
        assert unknown.returncode == 2
        assert "no operation 'nope'" in unknown.stderr


def test_missing_config_and_keys_name_the_path_and_the_fix(tmp_path: Path) -> None:
    missing = subprocess.run(
        [*BIDE, "status", "--config", str(tmp_path / "none.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 2
    assert "none.toml does not exist" in missing.stderr
    assert "--config" in missing.stderr
    cfg = tmp_path / "bide.toml"
    cfg.write_text('[paths]\nstate_dir = "state"\nkeys_dir = "keys"\n')
    (tmp_path / "state" / "log").mkdir(parents=True)
    nokeys = subprocess.run(
        [*BIDE, "status", "--offline", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert nokeys.returncode == 2
    assert "data.key does not exist" in nokeys.stderr
    assert "bide keygen" in nokeys.stderr
    typo = tmp_path / "typo.toml"
    typo.write_text('[paths]\nstate_dir = "s"\nstate_dri = "x"\n')
    bad = subprocess.run(
        [*BIDE, "status", "--config", str(typo)], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2
    assert "state_dri" in bad.stderr
    for out in (missing, nokeys, bad):
        assert "Traceback" not in out.stderr


def test_every_command_has_help_with_an_example() -> None:
    from daemon.cli import COMMANDS

    for name in COMMANDS:
        out = subprocess.run(
            [sys.executable, "-m", "daemon.cli", name, "--help"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, name
        assert "bide " + name in out.stdout, name
        assert "example" in out.stdout.lower(), name
