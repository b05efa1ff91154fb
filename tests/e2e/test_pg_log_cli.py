"""``bide log init|import|export`` and ``bide verify --dsn`` as an operator and an auditor run
them, against a real PostgreSQL, with an auditor's role that may only read."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from eventlog.segments import list_segments
from tests.eventlog._logtools import build_log, make_keys
from tests.pgsupport import role

BIDE = [sys.executable, "-m", "daemon.cli"]


def bide(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BIDE, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def auditor_dsn(pg_dsn: str) -> Iterator[str]:
    yield from role(pg_dsn, f"bide_audit_{secrets.token_hex(4)}")


def _files(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for _, p in list_segments(log_dir)}


def test_import_export_and_verify_with_a_read_only_role(
    pg_dsn: str, auditor_dsn: str, tmp_path: Path
) -> None:
    ks = make_keys(tmp_path / "keys")
    build_log(tmp_path / "log", ks, 50)
    auditor = auditor_dsn.split("user=")[1].split()[0]

    missing = bide("verify", "--dsn", pg_dsn, "--verify-key", str(ks.verify_pub))
    assert missing.returncode == 2
    assert "bide log init" in missing.stderr

    out = bide("log", "init", "--dsn", pg_dsn, "--reader-role", auditor)
    assert out.returncode == 0, out.stderr
    assert "created the bide schema, version 2" in out.stdout
    again = bide("log", "init", "--dsn", pg_dsn)
    assert "nothing to upgrade" in again.stdout

    out = bide(
        "log", "import", str(tmp_path / "log"), "--verify-key", str(ks.verify_pub), "--dsn", pg_dsn
    )
    assert out.returncode == 0, out.stderr

    out = bide("log", "export", str(tmp_path / "export"), "--dsn", auditor_dsn)
    assert out.returncode == 0, out.stderr
    assert _files(tmp_path / "export") == _files(tmp_path / "log")

    out = bide("verify", "--dsn", auditor_dsn, "--verify-key", str(ks.verify_pub))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "intact" in out.stdout

    # The auditor's role reads, and may not write.
    refused = bide(
        "log",
        "import",
        str(tmp_path / "log"),
        "--verify-key",
        str(ks.verify_pub),
        "--dsn",
        auditor_dsn,
    )
    assert refused.returncode != 0


def test_a_password_in_the_dsn_is_refused_and_never_printed(tmp_path: Path) -> None:
    out = bide("log", "init", "--dsn", "postgresql://bide:s3cr3t-pw@127.0.0.1:1/x")
    assert out.returncode == 2
    assert "password_file" in out.stderr
    assert "s3cr3t" not in out.stdout + out.stderr


def test_import_refuses_a_damaged_log(pg_dsn: str, tmp_path: Path) -> None:
    ks = make_keys(tmp_path / "keys")
    build_log(tmp_path / "log", ks, 10)
    seg = list_segments(tmp_path / "log")[0][1]
    data = bytearray(seg.read_bytes())
    data[200] ^= 1
    seg.write_bytes(bytes(data))
    assert bide("log", "init", "--dsn", pg_dsn).returncode == 0
    out = bide(
        "log", "import", str(tmp_path / "log"), "--verify-key", str(ks.verify_pub), "--dsn", pg_dsn
    )
    assert out.returncode == 2
    assert "nothing copied" in out.stderr


@pytest.fixture
def writer_dsn(pg_dsn: str) -> Iterator[str]:
    yield from role(pg_dsn, f"bidep_w_{secrets.token_hex(4)}")


def _user(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["user"])


def test_log_init_as_documented_leaves_the_daemons_role_only_the_checked_functions(
    pg_dsn: str, writer_dsn: str, auditor_dsn: str
) -> None:
    out = bide(
        "log",
        "init",
        "--dsn",
        pg_dsn,
        "--writer-role",
        _user(writer_dsn),
        "--reader-role",
        _user(auditor_dsn),
    )
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr
    with psycopg.connect(writer_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO bide_records (seq, segment, byte_offset, line, hash, "
                "epoch) VALUES (0, 1, 0, 'junk', 'h', 0)"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE bide_lease SET epoch = 9223372036854775807")
        row = conn.execute("SELECT taken_epoch FROM bide_take_lease('node-a', 5)").fetchone()
        assert row == (1,)
    with (
        psycopg.connect(auditor_dsn, autocommit=True) as conn,  # reads, never takes
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM bide_take_lease('auditor', 5)")
    # A daemons' role the database cannot fence is named, with the fix.
    out = bide("log", "init", "--dsn", pg_dsn, "--writer-role", "postgres")
    assert out.returncode == 0, out.stderr
    assert "warning: role postgres is a superuser" in out.stderr
