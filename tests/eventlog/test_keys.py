"""Keys: verify needs only verify.pub; key file errors; rotation; $CREDENTIALS_DIRECTORY."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

from eventlog import keys
from eventlog.envelope import EventRecord
from eventlog.errors import DecryptError, KeyFileError, UnknownKeyError
from eventlog.reader import LogReader
from tests.eventlog._logtools import KeySet, bide, build_log, make_keys, verify, verify_cli


def secrets_of(ks: KeySet) -> list[str]:
    """Every rendering of the secret keys that could leak into a message."""
    out = []
    for path in ks.directory.glob("*.key"):
        text = path.read_text().strip()
        raw = base64.b64decode(text)
        out += [text, raw.hex(), repr(raw)[2:-1]]
    return out


def test_verify_where_only_verify_pub_exists(tmp_path: Path, ks: KeySet) -> None:
    build_log(tmp_path / "log", ks, 30)
    auditor = tmp_path / "auditor"
    auditor.mkdir()
    shutil.copytree(tmp_path / "log", auditor / "log")
    shutil.copyfile(ks.verify_pub, auditor / "verify.pub")
    shutil.rmtree(ks.directory)  # no data.key or signing.key anywhere
    assert sorted(p.name for p in auditor.rglob("*.key")) == []
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    proc = bide(
        "verify",
        "log",
        "--verify-key",
        "verify.pub",
        cwd=auditor,
        env={"BIDE_CONFIG": "/nonexistent", **env},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].endswith("verdict=intact")


def test_verify_takes_paths_from_config_and_credentials_directory(
    tmp_path: Path, ks: KeySet
) -> None:
    build_log(tmp_path / "state" / "log", ks, 5)
    config = tmp_path / "bide.toml"
    config.write_text('[paths]\nstate_dir = "state"\n')
    proc = bide("verify", "--config", config, env={"CREDENTIALS_DIRECTORY": str(ks.directory)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_key_readable_by_others_is_refused(tmp_path: Path, ks: KeySet) -> None:
    data_key = ks.directory / "data.key"
    data_key.chmod(0o644)
    with pytest.raises(KeyFileError) as err:
        keys.load_keyring(ks.directory)
    assert str(data_key) in str(err.value)
    assert f"chmod 600 {data_key}" in str(err.value)
    proc = bide("keygen", "--rotate", ks.directory)  # the CLI says the same, without traceback
    assert proc.returncode == 2
    assert f"chmod 600 {data_key}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(s in proc.stderr + str(err.value) for s in secrets_of(ks))


def test_missing_key_names_keygen(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"does not exist; create keys with `bide keygen "):
        keys.load_keyring(tmp_path / "nowhere")
    with pytest.raises(KeyFileError, match=r"signing\.key does not exist"):
        keys.load_signer(tmp_path / "nowhere")


def test_missing_verify_key_on_the_cli(tmp_path: Path, ks: KeySet) -> None:
    build_log(tmp_path / "log", ks, 1)
    result = verify_cli(tmp_path / "log", tmp_path / "no.pub")
    assert result.status == 2
    assert "no.pub does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_key_file(ks: KeySet) -> None:
    (ks.directory / "data.key").write_text("not base64 at all\n")
    with pytest.raises(KeyFileError, match="is not a bide key"):
        keys.load_keyring(ks.directory)


def test_no_keys_directory_and_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(KeyFileError, match="CREDENTIALS_DIRECTORY"):
        keys.keys_directory(None)


def test_keys_load_from_credentials_directory(
    tmp_path: Path, ks: KeySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(ks.directory))
    directory = keys.keys_directory(None)
    assert directory == ks.directory
    assert keys.keys_directory(tmp_path) == tmp_path  # an explicit directory wins
    build_log(tmp_path / "log", KeySet(directory), 3)
    assert verify(tmp_path / "log", ks).verdict == "intact"


def test_wrong_data_key(tmp_path: Path, ks: KeySet) -> None:
    build_log(tmp_path / "log", ks, 3)
    stranger = make_keys(tmp_path / "stranger")
    reader = LogReader(tmp_path / "log", stranger.keyring())
    events = [s for s in reader.poll() if isinstance(s.record, EventRecord)]
    kid = ks.keyring().active
    with pytest.raises(UnknownKeyError, match=f"no data key with id {kid}") as unknown:
        reader.decrypt(events[0])
    # The same id mapped to the wrong bytes (a mixed-up key file): authentication fails.
    wrong = keys.KeyRing(active=kid, keys={kid: os.urandom(32)})
    with pytest.raises(DecryptError, match=f"record 1 \\(data key {kid}\\)") as bad:
        LogReader(tmp_path / "log", wrong).decrypt(events[0])
    for message in (str(unknown.value), str(bad.value)):
        assert not any(s in message for s in secrets_of(ks) + secrets_of(stranger))


def test_rotation_keeps_old_records_readable_until_the_key_is_retired(
    tmp_path: Path, ks: KeySet
) -> None:
    log = tmp_path / "log"
    build_log(log, ks, 5)
    old_kid = ks.keyring().active
    proc = bide("keygen", "--rotate", ks.directory)
    assert proc.returncode == 0, proc.stderr
    retired = ks.directory / f"data-{old_kid}.key"
    assert retired.exists()
    assert (retired.stat().st_mode & 0o777) == 0o600
    new_kid = ks.keyring().active
    assert new_kid != old_kid
    build_log(log, ks, 5, payload=lambda i: b"new %d" % i)

    def read_all() -> dict[str, list[bytes | str]]:
        reader = LogReader(log, ks.keyring())
        out: dict[str, list[bytes | str]] = {}
        for s in reader.poll():
            if isinstance(s.record, EventRecord):
                try:
                    value: bytes | str = reader.decrypt(s)
                except UnknownKeyError as exc:
                    value = str(exc)
                out.setdefault(s.record.kid, []).append(value)
        return out

    both = read_all()
    assert len(both[old_kid]) == len(both[new_kid]) == 5
    assert all(isinstance(v, bytes) for v in both[old_kid] + both[new_kid])

    retired.unlink()  # crypto-shredding: retire the old key
    assert verify(log, ks).verdict == "intact"
    shredded = read_all()
    assert all(isinstance(v, str) and old_kid in v for v in shredded[old_kid])
    assert shredded[new_kid] == [b"new %d" % i for i in range(5)]
    # Reading payloads: raises at the first shredded one, or lists each by seq and reads on.
    with pytest.raises(UnknownKeyError):
        list(LogReader(log, ks.keyring()).payloads())
    unreadable: list[tuple[int, str]] = []
    read = list(LogReader(log, ks.keyring()).payloads(unreadable))
    assert [p for _, p in read] == [b"new %d" % i for i in range(5)]
    assert len(unreadable) == 5
    assert all(old_kid in why for _, why in unreadable)
    assert max(seq for seq, _ in unreadable) < min(seq for seq, _ in read)


def test_keygen_never_overwrites(ks: KeySet) -> None:
    before = {p.name: p.read_bytes() for p in ks.directory.iterdir()}
    proc = bide("keygen", ks.directory)
    assert proc.returncode == 2
    assert "refusing to overwrite" in proc.stderr
    assert {p.name: p.read_bytes() for p in ks.directory.iterdir()} == before


def test_keys_directory_writable_by_others_is_refused(ks: KeySet) -> None:
    for mode in (0o770, 0o702, 0o777):
        ks.directory.chmod(mode)
        for load in (keys.load_keyring, keys.load_signer):
            with pytest.raises(KeyFileError) as err:
                load(ks.directory)
            assert f"keys directory {ks.directory} is writable by group or others" in str(err.value)
            assert f"chmod 700 {ks.directory}" in str(err.value)
    ks.directory.chmod(0o750)  # readable by a group is fine: the files are 0600
    keys.load_keyring(ks.directory)
    proc = bide("keygen", "--rotate", ks.directory)
    assert proc.returncode == 0, proc.stderr


def test_key_file_owned_by_another_user_is_refused(ks: KeySet) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    signing = ks.directory / "signing.key"
    os.chown(signing, 65534, -1)
    with pytest.raises(KeyFileError) as err:
        keys.load_signer(ks.directory)
    assert f"key file {signing} is owned by uid 65534" in str(err.value)
    assert f"chown {os.geteuid()} {signing}" in str(err.value)
    assert not any(s in str(err.value) for s in secrets_of(ks))
    os.chown(signing, 0, -1)  # root's is fine
    keys.load_signer(ks.directory)
