"""The ``[credential]`` table: a token file or a credential command, exactly one; the command an
absolute program path; its bounds within range; every error names the file, line and key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from daemon.errors import ConfigError
from daemon.profile import load_profile
from tests.e2e.harness import BIDE

HEAD = """\
[status]
url = "https://api.example.com/v1/runs/{job_id}"

"""

TAIL = """
[contract]
state_pointer = "/status"
job_id_pointer = "/id"

[contract.states]
pending = ["running"]
success = ["done"]
"""


def write(tmp_path: Path, credential: str) -> Path:
    path = tmp_path / "prov.toml"
    path.write_text(HEAD + credential + TAIL)
    return path


def refused(tmp_path: Path, credential: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_profile(write(tmp_path, credential))
    return str(info.value)


def test_a_command_credential_loads_with_its_bounds_and_keeps_the_digest(tmp_path: Path) -> None:
    profile = load_profile(
        write(
            tmp_path,
            '[credential]\ncommand = ["/usr/local/bin/get-token", "--audience", "api"]\n'
            'timeout_seconds = 5\nexpiry_skew_seconds = 30\nenv = { AWS_PROFILE = "ci" }\n',
        )
    )
    ref = profile.credential
    assert ref is not None
    assert ref.command == ["/usr/local/bin/get-token", "--audience", "api"]
    assert (ref.file, ref.timeout_seconds, ref.expiry_skew_seconds) == (None, 5, 30)
    assert (ref.cache_seconds, ref.env) == (300, {"AWS_PROFILE": "ci"})
    # The credential is the daemon's half: the contract, and so the digest, is the file one's.
    (tmp_path / "f").mkdir()
    with_file = load_profile(write(tmp_path / "f", '[credential]\nfile = "prov.token"\n'))
    assert with_file.digest == profile.digest


def test_file_and_command_together_are_refused_at_the_file_key(tmp_path: Path) -> None:
    message = refused(tmp_path, '[credential]\nfile = "a.token"\ncommand = ["/bin/tok"]\n')
    assert message.startswith(f"{tmp_path / 'prov.toml'}:5: credential: ")
    assert "exactly one of file" in message
    assert "both are set" in message


def test_neither_file_nor_command_is_refused_at_the_table(tmp_path: Path) -> None:
    message = refused(tmp_path, '[credential]\nheader = "X-Api-Key"\n')
    assert message.startswith(f"{tmp_path / 'prov.toml'}:4: credential: ")
    assert "neither is set" in message


@pytest.mark.parametrize("command", ['["get-token"]', '["./get-token"]', "[]"])
def test_a_program_that_is_not_an_absolute_path_is_refused(tmp_path: Path, command: str) -> None:
    message = refused(tmp_path, f"[credential]\ncommand = {command}\n")
    assert f"{tmp_path / 'prov.toml'}:5: credential.command: " in message
    assert "absolute path" in message


def test_bounds_out_of_range_name_the_key_and_line(tmp_path: Path) -> None:
    message = refused(tmp_path, '[credential]\ncommand = ["/bin/tok"]\ntimeout_seconds = 0\n')
    assert f"{tmp_path / 'prov.toml'}:6: credential.timeout_seconds: " in message
    message = refused(tmp_path, '[credential]\ncommand = ["/bin/tok"]\nenv = { "1X" = "y" }\n')
    assert f"{tmp_path / 'prov.toml'}:6: credential.env" in message


def test_check_profile_reports_the_credential_error(tmp_path: Path) -> None:
    path = write(tmp_path, '[credential]\ncommand = ["get-token"]\n')
    out = subprocess.run(
        [*BIDE, "check-profile", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0
    assert f"{path}:5: credential.command: " in out.stdout + out.stderr
