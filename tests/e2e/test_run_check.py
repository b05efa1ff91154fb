"""``bide run --check`` as an operator runs it, on real files: the demo's kept config passes;
a config with several mistakes names every one of them with its file and line and exits 78;
an unreachable database is a problem, a down witness a warning; ``--json`` carries the same;
and nothing is ever created or changed."""

from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import BIDE, init_log

EX_CONFIG = 78


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory `bide demo --keep` wrote: config, keys, a profile, a log, a snapshot."""
    keep = tmp_path_factory.mktemp("check") / "demo"
    out = subprocess.run(
        [*BIDE, "demo", "--keep", str(keep)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return keep


def check(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*BIDE, "run", "--check", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under ``root`` with its mode, size and mtime."""
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def copy_of(demo: Path, tmp_path: Path) -> Path:
    """The demo's keys, profiles and credentials (not its state) in a directory of our own."""
    for name in ("keys", "profiles", "creds"):
        shutil.copytree(demo / name, tmp_path / name)
    return tmp_path


CONFIG = """\
[paths]
state_dir = "state"
keys_dir = "keys"
profiles_dir = "profiles"
credentials_dir = "creds"
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_demo_config_passes_and_nothing_changes(demo: Path) -> None:
    before = tree(demo)
    out = check(demo / "bide.toml")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"config     {demo / 'bide.toml'}" in lines
    assert f"state dir  {demo / 'state'}" in lines
    assert f"profiles   1 valid in {demo / 'profiles'}: demo" in lines
    assert any(line.startswith(f"keys       {demo / 'keys'}: 1 data key(s)") for line in lines)
    assert any(
        line.startswith(f"store      files in {demo / 'state' / 'log'} (log ") for line in lines
    )
    assert "witness    none configured" in lines
    assert lines[-1] == "ok: no problems found; `bide run` would start with this config"
    assert tree(demo) == before


def test_three_mistakes_are_all_named_with_file_and_line(demo: Path, tmp_path: Path) -> None:
    root = copy_of(demo, tmp_path)
    profile = root / "profiles" / "demo.toml"
    text = profile.read_text()
    assert 'state_pointer = "/status"' in text
    profile.write_text(text.replace('state_pointer = "/status"', 'state_pointer = "status"'))
    pointer_line = text[: text.index("state_pointer")].count("\n") + 1
    config = root / "bide.toml"
    config.write_text(CONFIG + "\n[log]\ncheckpoint_evry = 100\n\n[api]\nmax_wait_seconds = 600\n")
    before = tree(root)
    out = check(config)
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem: ")]
    assert problems == [
        f"problem: {config}:8: log.checkpoint_evry: unknown key; did you mean 'checkpoint_every'?",
        f"problem: {config}:11: api.max_wait_seconds: must be a number <= 60.0, got 600; "
        f"or remove it for the default, 60.0",
        f"problem: {profile}:{pointer_line}: contract.state_pointer: 'status' is not a JSON "
        f'pointer: it must start with "/" (write "/status"; "" is the whole body)',
    ]
    assert out.stdout.splitlines()[-1] == "3 problems found; fix and check again"
    assert f"profiles   0 valid in {root / 'profiles'} (1 refused: demo)" in out.stdout
    assert "(not created yet: `bide run` creates it)" in out.stdout
    assert tree(root) == before  # no state dir, no log, no socket, no key


def test_json_gives_the_same_problems_for_a_script(demo: Path, tmp_path: Path) -> None:
    root = copy_of(demo, tmp_path)
    config = root / "bide.toml"
    config.write_text(CONFIG + '\n[metrcs]\nlisten = "127.0.0.1:9464"\n')
    out = check(config, "--json")
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert report["config"] == str(config)
    assert report["found"]["profiles"]["names"] == ["demo"]
    assert report["found"]["keys"]["data_keys"] == 1
    assert report["found"]["store"] == {
        "kind": "files",
        "path": str(root / "state/log"),
        "log": None,
    }
    assert report["problems"] == [
        {
            "file": str(config),
            "line": 7,
            "key": "metrcs",
            "message": "unknown section",
            "fix": "did you mean 'metrics'?",
        }
    ]
    clean = root / "clean.toml"
    clean.write_text(CONFIG)
    out = check(clean, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"] is True
    assert json.loads(out.stdout)["problems"] == []


def test_an_unreachable_database_is_a_problem_on_the_store_line(demo: Path, tmp_path: Path) -> None:
    root = copy_of(demo, tmp_path)
    port = closed_port()
    config = root / "bide.toml"
    config.write_text(
        CONFIG + f'\n[log]\nstore = "postgresql://bide@127.0.0.1:{port}/bide"\n'
        "forward_secure = false\n"
    )
    out = check(config)
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    assert f"store      postgresql 127.0.0.1:{port}/bide: NOT reachable" in out.stdout
    problem = f"problem: {config}:8: log.store: cannot connect to PostgreSQL: "
    assert problem in out.stdout
    assert "Connection refused" in out.stdout
    assert "check that the server runs" in out.stdout
    assert not (root / "state").exists()


def test_a_reachable_database_shows_its_lease(demo: Path, tmp_path: Path, pg_dsn: str) -> None:
    root = copy_of(demo, tmp_path)
    config = root / "bide.toml"
    config.write_text(CONFIG + f'\n[log]\nforward_secure = false\n\n[postgres]\ndsn = "{pg_dsn}"\n')
    out = check(config)
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    assert "no bide schema" in out.stdout
    assert "bide log init --dsn DSN" in out.stdout
    init_log(pg_dsn)
    out = check(config)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ": reachable, lease epoch 0" in out.stdout


def test_a_down_witness_is_a_warning_not_a_problem(demo: Path, tmp_path: Path) -> None:
    root = copy_of(demo, tmp_path)
    token = root / "witness.token"
    subprocess.run([*BIDE, "witness", "token", "--out", str(token)], check=True, timeout=30)
    url = f"http://127.0.0.1:{closed_port()}/v1/heads"
    config = root / "bide.toml"
    config.write_text(CONFIG + f'\n[witness]\nurls = ["{url}"]\ntoken_file = "witness.token"\n')
    out = check(config)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"witness    {url} unreachable" in out.stdout
    assert f"warning: {config}:8: witness {url} cannot be reached" in out.stdout


def test_a_missing_config_is_named_with_the_fix(tmp_path: Path) -> None:
    out = check(tmp_path / "nope.toml")
    assert out.returncode == EX_CONFIG
    assert f"problem: {tmp_path / 'nope.toml'}: does not exist; pass --config FILE" in out.stdout


def test_the_shipped_service_config_passes_with_keys_left_to_systemd(tmp_path: Path) -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    mine = grp.getgrgid(os.getgid()).gr_name
    config = tmp_path / "bide.toml"
    config.write_text(
        (deploy / "bide.toml")
        .read_text()
        .replace("/var/lib/bide", str(tmp_path / "state"))
        .replace("/etc/bide/profiles", str(deploy / "profiles"))
        .replace('"bide-agents"', f'"{mine}"')  # the guide's groups exist where it is followed
        .replace('"bide-approvers"', f'"{mine}"')
    )
    out = check(config)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "keys       from $CREDENTIALS_DIRECTORY at start (not checked here)" in out.stdout
    shipped = len(list((deploy / "profiles").glob("*.toml")))
    assert f"profiles   {shipped} valid in {deploy / 'profiles'}" in out.stdout
    assert not (tmp_path / "state").exists()


def test_witness_mistakes_are_named_on_their_lines(demo: Path, tmp_path: Path) -> None:
    root = copy_of(demo, tmp_path)
    config = root / "bide.toml"
    config.write_text(
        CONFIG + '\n[witness]\nurls = ["http://127.0.0.1:9/v1/heads"]\nwitness_keys = ["nope"]\n'
    )
    out = check(config, "--json")
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    problems = {(p["line"], p["key"]) for p in json.loads(out.stdout)["problems"]}
    assert problems == {(8, "witness.urls"), (9, "witness.witness_keys")}


def test_what_run_would_refuse_at_start_is_named_too(demo: Path, tmp_path: Path) -> None:
    """Beyond the file's own rules: a spool group that does not exist, forward-secure keys
    with the log in PostgreSQL on a node not enrolled (bide node enroll)."""
    root = copy_of(demo, tmp_path)
    config = root / "bide.toml"
    config.write_text(
        CONFIG + '\n[log]\nstore = "postgresql://bide@127.0.0.1:9/bide"\n\n'
        '[spool]\napprovers_group = "no-such-group-bide"\n'
    )
    out = check(config, "--json")
    assert out.returncode == EX_CONFIG, out.stdout + out.stderr
    problems = {p["key"]: p for p in json.loads(out.stdout)["problems"]}
    assert problems["log.forward_secure"]["line"] == 7  # the [log] table: the key is not written
    assert "set [log] forward_secure = false" in problems["log.forward_secure"]["fix"]
    assert "bide node enroll" in problems["log.forward_secure"]["message"]
    assert problems["spool.approvers_group"]["line"] == 11
    assert problems["spool.approvers_group"]["message"] == (
        "group 'no-such-group-bide' does not exist"
    )
