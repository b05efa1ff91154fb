"""The snapshot file: sealed, bound to its position, 0600, and refused whole when altered."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
import pytest

from eventlog import keys
from eventlog.position import LogPosition
from eventlog.snapshot import SnapshotError, read_snapshot, write_snapshot
from tests.eventlog._logtools import KeySet, make_keys, reseal_with_data_key

POS = LogPosition(
    log_id="ab" * 16,
    seq=41,
    hash="cd" * 32,
    segment=2,
    line_start=100,
    end=180,
    last_cp_seq=40,
    last_cp_hash="ef" * 32,
    checkpoint_every=5,
    unsigned_run=1,
)
BODY = b"ledger bytes \x00\x01" * 1000


def test_round_trip_and_mode(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    size = write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    assert path.stat().st_size == size
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_snapshot(path, ks.keyring(), ks.signer().mac_key) == (POS, BODY)
    assert BODY not in path.read_bytes()  # sealed
    assert not path.with_name("snapshot.tmp").exists()


def test_a_leftover_temporary_file_does_not_block_the_next_write(
    tmp_path: Path, ks: KeySet
) -> None:
    path = tmp_path / "snapshot"
    path.with_name("snapshot.tmp").write_bytes(b"half a snapshot from a crash")
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    assert read_snapshot(path, ks.keyring(), ks.signer().mac_key) == (POS, BODY)


def _altered(path: Path, change: str) -> None:
    data = path.read_bytes()
    head, _, rest = data.partition(b"\n")
    if change == "position":
        header = msgspec.json.decode(head)
        header["position"]["seq"] = 40
        head = msgspec.json.encode(header)
    elif change == "body":
        rest = rest[:-1] + bytes([rest[-1] ^ 1])
    elif change == "truncated":
        rest = rest[: len(rest) // 2]
    elif change == "header":
        head = b"{not json"
    elif change == "no-header":
        head, rest = b"x" * 5000, b""
    path.write_bytes(head + b"\n" + rest)


@pytest.mark.parametrize("change", ["position", "body", "truncated", "header", "no-header"])
def test_any_alteration_is_refused(tmp_path: Path, ks: KeySet, change: str) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    _altered(path, change)
    with pytest.raises(SnapshotError, match="snapshot"):
        read_snapshot(path, ks.keyring(), ks.signer().mac_key)


def test_another_key_set_cannot_read_it(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    other = make_keys(tmp_path / "other")
    with pytest.raises(SnapshotError, match="failed authentication"):
        read_snapshot(path, other.keyring(), other.signer().mac_key)
    with pytest.raises(SnapshotError, match="does not hold"):
        read_snapshot(path, other.keyring(), ks.signer().mac_key)


def test_after_key_rotation_the_old_key_still_reads_it(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    keys.generate(ks.directory, rotate=True)
    assert read_snapshot(path, ks.keyring(), ks.signer().mac_key) == (POS, BODY)


def test_no_key_material_in_the_error(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    _altered(path, "body")
    with pytest.raises(SnapshotError) as caught:
        read_snapshot(path, ks.keyring(), ks.signer().mac_key)
    for key in ks.keyring().keys.values():
        assert key.hex() not in str(caught.value)


def test_a_body_rewritten_with_the_data_key_alone_is_refused(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    reseal_with_data_key(path, ks.keyring(), lambda body: body.replace(b"ledger", b"forged"))
    with pytest.raises(SnapshotError, match="failed authentication"):
        read_snapshot(path, ks.keyring(), ks.signer().mac_key)


def test_an_untagged_format_1_snapshot_is_refused(tmp_path: Path, ks: KeySet) -> None:
    path = tmp_path / "snapshot"
    write_snapshot(path, ks.keyring(), ks.signer().mac_key, POS, BODY)
    head, _, rest = path.read_bytes().partition(b"\n")
    header = msgspec.json.decode(head)
    header["format"] = 1
    path.write_bytes(msgspec.json.encode(header) + b"\n" + rest[:-32])
    with pytest.raises(SnapshotError, match="format 1"):
        read_snapshot(path, ks.keyring(), ks.signer().mac_key)
