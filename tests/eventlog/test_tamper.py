"""Tamper suite: every damage class, made to a real log on disk, named by class and sequence.

The base log (see conftest) has 60 events over about a dozen 2 KB segments, a checkpoint every
5 events, and a final checkpoint. A representative subset runs the real ``bide verify`` as a
subprocess; the rest calls ``verify_log`` directly.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from eventlog.envelope import (
    Checkpoint,
    EventRecord,
    Genesis,
    Segment,
    checkpoint_message,
    encode_record,
)
from eventlog.segments import list_segments, segment_name
from eventlog.verify import Report
from tests.eventlog._logtools import (
    StoredLine,
    make_keys,
    offsets,
    read_lines,
    rechain,
    verify,
    verify_cli,
    write_lines,
)
from tests.eventlog.conftest import BaseLogs


def damaged(report: Report, kind: str, seq: int) -> None:
    assert report.damage is not None, report.summary()
    assert (report.damage.kind, report.damage.seq) == (kind, seq), report.damage
    assert report.exit_status == 1


def middle_event(lines: list[StoredLine], after: int = 20) -> int:
    """Index of an event in the middle of a segment, followed by an event in the same file."""
    for i in range(after, len(lines) - 1):
        if (
            lines[i].kind == lines[i + 1].kind == "EventRecord"
            and lines[i - 1].segment == lines[i].segment == lines[i + 1].segment
        ):
            return i
    raise AssertionError("no middle event")


def test_intact_log_verifies_through_the_cli(base_logs: BaseLogs) -> None:
    """S40: verified offline, over the ciphertext, with the public key alone."""
    result = verify_cli(base_logs.log, base_logs.keys.verify_pub)
    assert result.status == 0, result.stdout + result.stderr
    assert result.report["verdict"] == "intact"
    assert result.report["clean_close"] is True
    assert result.report["segments"] == len(list_segments(base_logs.log)) >= 8
    assert result.report["checkpoints"] == 13  # 12 periodic + the final one


def test_text_output_ends_with_one_summary_line(base_logs: BaseLogs) -> None:
    from tests.eventlog._logtools import bide

    proc = bide("verify", base_logs.log, "--verify-key", base_logs.keys.verify_pub)
    assert proc.returncode == 0, proc.stderr
    lines = read_lines(base_logs.log)
    segments = len(list_segments(base_logs.log))
    assert proc.stdout.strip().splitlines()[-1] == (
        f"records={len(lines)} segments={segments} checkpoints=13 "
        f"head={lines[-1].seq}:{lines[-1].hash} verdict=intact"
    )


# -- modified ---------------------------------------------------------------------------------


def test_modified_ciphertext_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    rec = lines[i].record
    assert isinstance(rec, EventRecord)
    ct = base64.b64decode(rec.ct)
    forged = base64.b64encode(bytes([ct[0] ^ 1]) + ct[1:]).decode()
    lines[i].data = encode_record(msgspec.structs.replace(rec, ct=forged))
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 1
    assert result.damage["kind"] == "modified"
    assert result.damage["seq"] == rec.seq
    assert (result.damage["segment"], result.damage["offset"]) == offsets(log)[rec.seq]


def test_modified_last_record_of_a_segment(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(
        i
        for i in range(20, len(lines))
        if lines[i + 1].kind == "Segment" and lines[i].kind == "EventRecord"
    )
    rec = lines[i].record
    assert isinstance(rec, EventRecord)
    lines[i].data = encode_record(msgspec.structs.replace(rec, nonce=rec.nonce[::-1]))
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "modified", lines[i].seq)


def test_modified_sequence_number_field(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    lines[i].data = lines[i].data.replace(f'"seq":{seq},'.encode(), f'"seq":{seq + 3},'.encode())
    write_lines(log, lines)
    report = verify(log, base_logs.keys)
    damaged(report, "modified", seq)
    assert report.damage is not None
    assert "sequence number was altered" in report.damage.detail


def test_modified_line_that_no_longer_parses(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    lines[i].data = lines[i].data[:-1]  # drop the closing brace
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "modified", seq)


# -- missing, reordered, duplicated -----------------------------------------------------------


def test_missing_record_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    del lines[i]
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "missing", seq)


def test_missing_several_records(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    del lines[i : i + 3]
    write_lines(log, lines)
    report = verify(log, base_logs.keys)
    damaged(report, "missing", seq)
    assert report.damage is not None
    assert f"{seq}..{seq + 2}" in report.damage.detail


def test_missing_checkpoint(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(i for i in range(20, len(lines)) if lines[i].kind == "Checkpoint")
    seq = lines[i].seq
    del lines[i]
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "missing", seq)


def test_reordered_records_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "reordered", seq)


def test_record_moved_later(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    moved = lines.pop(i)
    moved.segment = lines[i + 4].segment
    lines.insert(i + 4, moved)
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "reordered", seq)


def test_duplicated_record_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    seq = lines[i].seq
    lines.insert(i + 1, StoredLine(lines[i].segment, lines[i].data))
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "duplicated", seq)
    assert result.damage["offset"] == offsets(log)[seq][1]  # the second copy (dict keeps last)


def test_record_duplicated_far_away(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines, after=10)
    copy = StoredLine(lines[i + 12].segment, lines[i].data)
    lines.insert(i + 12, copy)
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "duplicated", lines[i].seq)


def test_later_record_copied_earlier_is_duplicated(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines, after=10)
    lines.insert(i, StoredLine(lines[i].segment, lines[i + 8].data))
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "duplicated", lines[i].seq)


# -- spliced ----------------------------------------------------------------------------------


def test_record_spliced_from_another_log_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    theirs = read_lines(base_logs.other)
    i = middle_event(lines)
    seq = lines[i].seq
    assert theirs[i].seq == seq
    assert theirs[i].kind == "EventRecord"
    lines[i] = StoredLine(lines[i].segment, theirs[i].data)  # same keys, same position
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "spliced", seq)


def test_record_inserted_from_another_log(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    theirs = read_lines(base_logs.other)
    i = middle_event(lines)
    lines.insert(i, StoredLine(lines[i].segment, theirs[40].data))
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "spliced", lines[i + 1].seq)


def test_segment_spliced_from_another_log(log: Path, base_logs: BaseLogs) -> None:
    name = segment_name(4)
    seq = _first_seq(log, 4)
    shutil.copyfile(base_logs.other / name, log / name)
    damaged(verify(log, base_logs.keys), "spliced", seq)


# -- signatures -------------------------------------------------------------------------------


def test_wrong_verify_key_cli(log: Path, tmp_path: Path) -> None:
    stranger = make_keys(tmp_path / "stranger")
    result = verify_cli(log, stranger.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "bad_signature", 0)


def _forge(line: StoredLine, private: Ed25519PrivateKey, **changes: object) -> None:
    rec = line.record
    assert isinstance(rec, Checkpoint)
    rec = msgspec.structs.replace(rec, **changes)
    msg = checkpoint_message(rec.log, rec.seq, rec.prev, rec.t_us, rec.prev_cp, rec.final)
    line.data = encode_record(
        msgspec.structs.replace(rec, sig=base64.b64encode(private.sign(msg)).decode())
    )


def test_forged_checkpoint_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(i for i in range(20, len(lines)) if lines[i].kind == "Checkpoint")
    rec = lines[i].record
    assert isinstance(rec, Checkpoint)
    _forge(lines[i], Ed25519PrivateKey.generate(), t_us=rec.t_us + 1)
    write_lines(log, lines)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 1
    assert (result.damage["kind"], result.damage["seq"]) == ("bad_signature", rec.seq)


def test_checkpoint_with_empty_signature(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(i for i in range(20, len(lines)) if lines[i].kind == "Checkpoint")
    lines[i].data = encode_record(msgspec.structs.replace(lines[i].record, sig=""))
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "bad_signature", lines[i].seq)


def test_checkpoint_without_signature_field(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(i for i in range(20, len(lines)) if lines[i].kind == "Checkpoint")
    seq = lines[i].seq
    obj = json.loads(lines[i].data)
    del obj["sig"]
    lines[i].data = json.dumps(obj, separators=(",", ":")).encode()
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "bad_signature", seq)


def test_final_checkpoint_signature_in_non_canonical_base64(log: Path, base_logs: BaseLogs) -> None:
    # Ed25519 signatures are 64 bytes: the last base64 digit before "==" has 4 unused bits.
    # A decoder that ignores them would accept a changed final record.
    lines = read_lines(log)
    rec = lines[-1].record
    assert isinstance(rec, Checkpoint)
    assert rec.final
    assert rec.sig.endswith("==")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digit = alphabet.index(rec.sig[-3])
    sig = rec.sig[:-3] + alphabet[digit ^ 1] + "=="
    assert base64.b64decode(sig) == base64.b64decode(rec.sig)
    lines[-1].data = encode_record(msgspec.structs.replace(rec, sig=sig))
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "bad_signature", rec.seq)


def test_rechain_attack_fails_on_a_checkpoint_signature_cli(log: Path, base_logs: BaseLogs) -> None:
    """Delete a record and recompute every later seq, link and hash, without any key."""
    lines = read_lines(log)
    i = middle_event(lines)
    del lines[i]
    lines = rechain(lines, i)
    write_lines(log, lines)
    first_cp = next(line.seq for line in lines[i:] if line.kind == "Checkpoint")
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 1
    assert (result.damage["kind"], result.damage["seq"]) == ("bad_signature", first_cp)


def test_rechain_after_editing_a_payload(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = middle_event(lines)
    rec = lines[i].record
    assert isinstance(rec, EventRecord)
    lines[i].data = encode_record(msgspec.structs.replace(rec, ct=rec.ct[::-1]))
    lines = rechain(lines, i + 1)
    write_lines(log, lines)
    first_cp = next(line.seq for line in lines[i:] if line.kind == "Checkpoint")
    damaged(verify(log, base_logs.keys), "bad_signature", first_cp)


# -- segments ---------------------------------------------------------------------------------


def _first_seq(log: Path, index: int) -> int:
    return next(s for s, (seg, _) in sorted(offsets(log).items()) if seg == segment_name(index))


def test_middle_segment_deleted_cli(log: Path, base_logs: BaseLogs) -> None:
    seq = _first_seq(log, 5)
    (log / segment_name(5)).unlink()
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "segment_link", seq)


def test_two_segments_swapped_by_renaming(log: Path, base_logs: BaseLogs) -> None:
    seq = _first_seq(log, 3)
    (log / segment_name(3)).rename(log / "tmp")
    (log / segment_name(4)).rename(log / segment_name(3))
    (log / "tmp").rename(log / segment_name(4))
    damaged(verify(log, base_logs.keys), "segment_link", seq)


def test_segment_emptied(log: Path, base_logs: BaseLogs) -> None:
    seq = _first_seq(log, 6)
    (log / segment_name(6)).write_bytes(b"")
    damaged(verify(log, base_logs.keys), "segment_link", seq)


def test_two_segments_joined(log: Path, base_logs: BaseLogs) -> None:
    seq = _first_seq(log, 4)
    with (log / segment_name(3)).open("ab") as f:
        f.write((log / segment_name(4)).read_bytes())
    (log / segment_name(4)).unlink()
    for index, path in list_segments(log):  # renumber the later files to close the gap
        if index > 4:
            path.rename(log / segment_name(index - 1))
    damaged(verify(log, base_logs.keys), "segment_link", seq)


def test_first_segment_renamed(log: Path, base_logs: BaseLogs) -> None:
    for index, path in reversed(list_segments(log)):
        path.rename(log / segment_name(index + 1))
    damaged(verify(log, base_logs.keys), "segment_link", 0)


# -- truncation, torn tail, junk --------------------------------------------------------------


def test_truncated_before_anchor_cli(log: Path, base_logs: BaseLogs) -> None:
    head = read_lines(log)[-1]
    segments = list_segments(log)
    for _, path in segments[-2:]:
        path.unlink()
    remaining = read_lines(log)
    anchor = f"{head.seq}:{head.hash}"
    result = verify_cli(log, base_logs.keys.verify_pub, "--anchor", anchor)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (
        1,
        "truncated",
        remaining[-1].seq + 1,
    )
    # Without the anchor the cut is invisible, but the missing clean close is noted.
    plain = verify_cli(log, base_logs.keys.verify_pub)
    assert plain.status == 0
    assert plain.report["clean_close"] is False
    assert plain.report["notes"]


def test_truncated_at_a_line_inside_a_segment(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    head = lines[-1]
    cut = next(i for i in range(len(lines) - 4, 0, -1) if lines[i].kind != "Segment")
    write_lines(log, lines[:cut])
    damaged(verify(log, base_logs.keys, anchor=(head.seq, head.hash)), "truncated", lines[cut].seq)


def test_anchor_that_does_not_match(log: Path, base_logs: BaseLogs) -> None:
    damaged(verify(log, base_logs.keys, anchor=(30, "ab" * 32)), "modified", 30)


def test_anchor_that_matches(log: Path, base_logs: BaseLogs) -> None:
    line = read_lines(log)[30]
    report = verify(log, base_logs.keys, anchor=(line.seq, line.hash))
    assert report.verdict == "intact"


def _last_segment(log: Path) -> Path:
    return list_segments(log)[-1][1]


def test_torn_tail_incomplete_final_line_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    path = _last_segment(log)
    data = path.read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    path.write_bytes(data[: start + 40])
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 3, result.stdout
    assert result.report["verdict"] == "torn_tail"
    assert result.report["torn_tail"] == {
        "segment": path.name,
        "offset": start,
        "length": 40,
        "seq": lines[-1].seq,
    }
    assert result.report["head"] == {"seq": lines[-2].seq, "hash": lines[-2].hash}


def test_torn_tail_trailing_zero_bytes_cli(log: Path, base_logs: BaseLogs) -> None:
    path = _last_segment(log)
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(b"\x00" * 700)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 3
    assert result.report["torn_tail"] == {
        "segment": path.name,
        "offset": size,
        "length": 700,
        "seq": read_lines_head(log) + 1,
    }


def read_lines_head(log: Path) -> int:
    path = _last_segment(log)
    data = path.read_bytes().rstrip(b"\x00")
    return msgspec.json.decode(data[:-1].rsplit(b"\n", 1)[-1], type=dict[str, object])["seq"]  # type: ignore[return-value]


def test_garbage_line_appended_cli(log: Path, base_logs: BaseLogs) -> None:
    head = read_lines(log)[-1].seq
    with _last_segment(log).open("ab") as f:
        f.write(b'{"kind":"event","junk":true}\n')
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert (result.status, result.damage["kind"], result.damage["seq"]) == (1, "modified", head + 1)


def test_sector_of_zeros_in_the_middle_cli(log: Path, base_logs: BaseLogs) -> None:
    path = log / segment_name(3)
    data = bytearray(path.read_bytes())
    assert len(data) > 1024
    data[512:1024] = b"\x00" * 512
    path.write_bytes(bytes(data))
    # The damaged line starts with the record that holds byte 512.
    hit = max((s for s, (seg, off) in offsets_before(log, path.name, 512)), default=None)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 1
    assert (result.damage["kind"], result.damage["seq"]) == ("modified", hit)


def offsets_before(log: Path, name: str, pos: int) -> list[tuple[int, tuple[str, int]]]:
    # Offsets come from the undamaged base copy of the same file layout.
    return [(s, o) for s, o in _BASE_OFFSETS[0].items() if o[0] == name and o[1] <= pos]


_BASE_OFFSETS: list[dict[int, tuple[str, int]]] = []


@pytest.fixture(autouse=True)
def _base_offsets(base_logs: BaseLogs) -> None:
    if not _BASE_OFFSETS:
        _BASE_OFFSETS.append(offsets(base_logs.log))


def test_sector_of_zeros_in_the_last_segment_middle(log: Path, base_logs: BaseLogs) -> None:
    path = _last_segment(log)
    data = bytearray(path.read_bytes())
    assert len(data) > 700
    data[100:612] = b"\x00" * 512
    path.write_bytes(bytes(data))
    report = verify(log, base_logs.keys)
    assert report.exit_status == 1
    assert report.damage is not None
    assert report.damage.kind == "modified"


def test_sector_of_zeros_replacing_the_last_record_cli(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    path = _last_segment(log)
    data = path.read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    path.write_bytes(data[:start] + b"\x00" * 512)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 3
    assert result.report["torn_tail"] == {
        "segment": path.name,
        "offset": start,
        "length": 512,
        "seq": lines[-1].seq,
    }


def test_incomplete_line_at_the_end_of_a_middle_segment(log: Path, base_logs: BaseLogs) -> None:
    path = log / segment_name(4)
    data = path.read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    seq = msgspec.json.decode(data[start:-1], type=dict[str, object])["seq"]
    path.write_bytes(data[: start + 30])
    damaged(verify(log, base_logs.keys), "modified", seq)  # type: ignore[arg-type]


def test_empty_newest_segment_is_a_torn_tail(log: Path, base_logs: BaseLogs) -> None:
    index = list_segments(log)[-1][0]
    (log / segment_name(index + 1)).write_bytes(b"")
    report = verify(log, base_logs.keys)
    assert report.verdict == "torn_tail"
    assert report.torn is not None
    assert report.torn.segment.name == segment_name(index + 1)
    assert report.torn.length == 0


def test_segment_record_check_is_positional(log: Path, base_logs: BaseLogs) -> None:
    lines = read_lines(log)
    i = next(i for i in range(10, len(lines)) if lines[i].kind == "Segment")
    assert isinstance(lines[i].record, Segment)
    lines.insert(i + 1, StoredLine(lines[i].segment, lines[i].data))  # a segment record, twice
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "duplicated", lines[i].seq)


# -- the signed genesis: the checkpoint spacing it promises ------------------------------------


def test_every_checkpoint_stripped_and_rechained_is_caught(log: Path, base_logs: BaseLogs) -> None:
    """Without the signing key, an attacker can drop every checkpoint and recompute the chain;
    the signed genesis still promises a checkpoint every N records, so the run is too long."""
    lines = read_lines(log)
    first_cp = next(i for i, line in enumerate(lines) if line.kind == "Checkpoint")
    stripped = [line for line in lines if line.kind != "Checkpoint"]
    stripped = rechain(stripped, first_cp)
    write_lines(log, stripped)
    result = verify_cli(log, base_logs.keys.verify_pub)
    assert result.status == 1
    assert result.damage["kind"] == "missing"
    assert "without a signed checkpoint" in str(result.damage["detail"])


def test_genesis_promise_raised_without_the_key_is_a_bad_signature(
    log: Path, base_logs: BaseLogs
) -> None:
    lines = read_lines(log)
    genesis = lines[0].record
    assert isinstance(genesis, Genesis)
    assert genesis.checkpoint_every >= 1
    lines[0].data = encode_record(msgspec.structs.replace(genesis, checkpoint_every=10**9))
    lines = rechain(lines, 1)
    write_lines(log, lines)
    damaged(verify(log, base_logs.keys), "bad_signature", 0)
