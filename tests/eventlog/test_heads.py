"""heads.jsonl stays cheap however long it grows: the latest head comes from the file's tail,
and a reader that keeps its byte offset reads only what was recorded after it."""

from __future__ import annotations

from pathlib import Path

from eventlog.heads import Head, HeadStore, encode_head


def _head(seq: int) -> Head:
    return Head(
        log="ab" * 16, seq=seq, hash=f"{seq:064x}", epoch=1, sig="s" * 88, t_us=seq, cp="{}"
    )


def _store(tmp_path: Path, count: int) -> HeadStore:
    path = tmp_path / "heads.jsonl"
    path.write_bytes(b"".join(encode_head(_head(i)) + b"\n" for i in range(count)))
    return HeadStore(path)


def test_latest_is_read_from_the_tail_of_a_long_file(tmp_path: Path) -> None:
    store = _store(tmp_path, 5_000)  # about 1.1 MB, far past the tail read
    assert store.path.stat().st_size > 1_000_000
    latest = store.latest()
    assert latest is not None
    assert latest.seq == 4_999


def test_a_torn_last_line_is_not_the_latest(tmp_path: Path) -> None:
    store = _store(tmp_path, 3)
    with store.path.open("ab") as f:
        f.write(encode_head(_head(3))[:40])  # a crash in the middle of a line
    latest = store.latest()
    assert latest is not None
    assert latest.seq == 2
    assert HeadStore(tmp_path / "missing.jsonl").latest() is None


def test_read_from_an_offset_gives_only_later_heads(tmp_path: Path) -> None:
    store = _store(tmp_path, 10)
    rows = store.read_from(0)
    assert [h.seq for _, h in rows] == list(range(10))
    offset_of_7 = rows[7][0]
    assert [h.seq for _, h in store.read_from(offset_of_7)] == [7, 8, 9]
    end = store.path.stat().st_size
    assert store.read_from(end) == []
