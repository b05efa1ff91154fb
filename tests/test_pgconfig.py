"""The config names the log's database: ``[log] store`` or a ``[postgres]`` table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.config import load_config
from daemon.errors import ConfigError
from daemon.pgconfig import config_settings


def _cfg(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bide.toml"
    path.write_text('[paths]\nstate_dir = "state"\n' + text)
    return path


def test_files_by_default(tmp_path: Path) -> None:
    cfg = load_config(str(_cfg(tmp_path, "")))
    assert cfg.postgres is None
    assert config_settings(cfg) is None


def test_store_in_the_log_table(tmp_path: Path) -> None:
    cfg = load_config(str(_cfg(tmp_path, '[log]\nstore = "postgresql://bide@db/bide"\n')))
    assert cfg.postgres is not None
    assert (cfg.postgres.dsn, cfg.postgres.lease_seconds, cfg.postgres.renew_seconds) == (
        "postgresql://bide@db/bide",
        10.0,
        3.0,
    )


def test_postgres_table_with_a_password_file(tmp_path: Path) -> None:
    cfg = load_config(
        str(
            _cfg(
                tmp_path,
                '[postgres]\ndsn = "host=db dbname=bide"\n'
                'password_file = "db.pw"\nlease_seconds = 2\n'
                'renew_seconds = 0.5\nnode = "a"\n',
            )
        )
    )
    settings = config_settings(cfg)
    assert settings is not None
    assert settings.password_file == tmp_path / "db.pw"
    assert cfg.postgres is not None
    assert cfg.postgres.node == "a"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[log]\nstore = "mysql://x"\n', "neither"),
        ("[postgres]\nlease_seconds = 5\n", "without a dsn"),
        ('[postgres]\ndsn = "host=a"\nlease_seconds = 2\nrenew_seconds = 2\n', "shorter"),
        ('[log]\nstore = "postgresql://a/b"\n[postgres]\ndsn = "postgresql://c/d"\n', "two"),
    ],
)
def test_refusals(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(str(_cfg(tmp_path, text)))


def test_run_refuses_a_profile_whose_requests_could_never_fit_in_the_lease(tmp_path: Path) -> None:
    """Defaults: a 10 s lease renewed every 3 s with a 1 s margin leaves 6 s for a request;
    a profile with the default 10 s status timeout would never be sent. Refused before any
    connection is tried (the database here does not exist)."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "slow.toml").write_text(
        '[status]\nurl = "http://127.0.0.1:9/jobs/{job_id}"\n\n[contract]\n'
        'state_pointer = "/status"\n[contract.states]\npending = ["running"]\n'
        'success = ["done"]\n'
    )
    path = _cfg(
        tmp_path,
        'profiles_dir = "profiles"\n[log]\nforward_secure = false\n'
        '[postgres]\ndsn = "postgresql://bide@127.0.0.1:9/nowhere"\n',
    )
    out = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "slow.toml" in out.stderr
    assert "timeout_seconds = 10 does not fit in the log's lease" in out.stderr
    assert "lower timeout_seconds to 6 or less" in out.stderr
    assert "Traceback" not in out.stderr
