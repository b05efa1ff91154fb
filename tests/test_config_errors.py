"""Mistakes in bide.toml, through `bide run` as an operator meets them: each names the file,
the line of the key itself and, for an unknown key or value, the nearest valid one; several
mistakes are named together, not one per restart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import BIDE

PATHS = '[paths]\nstate_dir = "state"\nkeys_dir = "keys"\nprofiles_dir = "profiles"\n'


def run(tmp_path: Path, text: str) -> tuple[Path, str]:
    """`bide run` on a config of ``text``: it must refuse (exit 2) before it starts anything."""
    config = tmp_path / "bide.toml"
    config.write_text(text)
    out = subprocess.run(
        [*BIDE, "run", "--config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "state").exists()
    return config, out.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            PATHS + "\n[log]\ncheckpoint_every = 10\ncheckpoint_intervall_seconds = 5\n",
            "{config}:8: log.checkpoint_intervall_seconds: unknown key; did you mean "
            "'checkpoint_interval_seconds'?",
        ),
        (
            PATHS + "\n[witnes]\nsyslog = true\n",
            "{config}:6: witnes: unknown section; did you mean 'witness'?",
        ),
        (
            PATHS + "\n[fetch]\nburst = 0\n",
            "{config}:7: fetch.burst: must be a whole number >= 1, got 0; or remove it for the "
            "default, 10",
        ),
        (
            PATHS + '\n[daemon]\ndrain_seconds = "5"\n',
            "{config}:7: daemon.drain_seconds: must be a number, got a string in quotes",
        ),
        (
            PATHS + '\n[metrics]\nlisten = "9464"\n',
            '{config}:7: metrics.listen: must be HOST:PORT, e.g. "127.0.0.1:9464" (or "" for '
            'off), got "9464"',
        ),
        (
            PATHS + "\n[api]\nsocket_mode = 660\n",
            "{config}:7: api.socket_mode: must be a string in quotes, got a whole number",
        ),
        (
            PATHS + '\n[witness]\nurls = ["https://w.example/v1/heads", 8443]\n',
            "{config}:7: witness.urls[2]: must be a string in quotes, got a whole number",
        ),
        (
            '[paths]\nkeys_dir = "keys"\n',
            "{config}:1: paths.state_dir: missing: this key is required; add it under [paths]",
        ),
        (
            '[log]\nstore = "files"\n',
            "{config}: paths: missing: this section is required; add a [paths] table",
        ),
        (
            PATHS + "\n[log\nstore = 1\n",
            "{config}:6: not valid TOML: ",
        ),
        (
            PATHS + '\n[log]\nsegment_bytes = 65536\nstore = "sqlite:///x"\n',
            '{config}:8: log.store: "sqlite:..." is neither "files" nor a postgresql:// DSN',
        ),
        (
            PATHS + '\n[postgres]\ndsn = "host=db"\nlease_seconds = 5\nrenew_seconds = 5\n',
            "{config}:9: postgres.renew_seconds: 5 must be shorter than lease_seconds (5)",
        ),
    ],
)
def test_each_mistake_on_its_key_line(tmp_path: Path, text: str, expected: str) -> None:
    config, err = run(tmp_path, text)
    assert f"bide run: {expected.format(config=config)}" in err


def test_every_mistake_is_named_at_once_in_file_order(tmp_path: Path) -> None:
    config, err = run(
        tmp_path,
        PATHS + "\n[api]\nmax_wait_second = 30\nenabled = 1\n\n[log]\nsnapshot_every = -1\n",
    )
    assert err.splitlines() == [
        "bide run: 3 problems in the config:",
        f"  {config}:7: api.max_wait_second: unknown key; did you mean 'max_wait_seconds'?",
        f"  {config}:8: api.enabled: must be true or false, got a whole number; or remove it "
        f"for the default, true",
        f"  {config}:11: log.snapshot_every: must be a whole number >= 0, got -1; or remove it "
        f"for the default, 100000",
    ]


def test_a_word_far_from_every_key_lists_the_keys(tmp_path: Path) -> None:
    config, err = run(tmp_path, PATHS + "\n[daemon]\nxyzzy = 1\n")
    assert f"{config}:7: daemon.xyzzy: unknown key; one of drain_seconds" in err
