"""``ParallelReader`` in forked workers reads (or finds, with a needle) exactly what the serial
reader does, and where the log is damaged it raises what the serial reader raises."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eventlog.errors import DamagedLogError
from eventlog.parallel import ParallelReader
from eventlog.reader import LogReader
from tests.eventlog._logtools import KeySet, build_log

EVENTS = 300


def _payload(i: int) -> bytes:
    return b'{"operation_id": "op-%d", "n": %d}' % (i % 7, i)


def _serial(log: Path, ks: KeySet, needle: bytes) -> tuple[list[tuple[int, bytes]], int]:
    reader = LogReader(log, ks.keyring())
    found = [(seq, p) for seq, p in reader.payloads([]) if needle in p]
    return found, reader.next_seq - 1


# A reader in a fresh interpreter, as `bide story --offline` runs: this test process has
# threads (anyio's idle workers from building the log), so here it would read serially.
_READ = """
import pickle, sys
from pathlib import Path
from eventlog import keys
from eventlog.parallel import ParallelReader
reader = ParallelReader(Path(sys.argv[1]), keys.load_keyring(Path(sys.argv[2])),
                        bytes.fromhex(sys.argv[3]), jobs=2, unit_bytes=4096, min_bytes=0)
try:
    out = (list(reader.payloads([])), reader.next_seq - 1, reader.workers)
except Exception as exc:
    out = (type(exc), str(exc))
sys.stdout.buffer.write(pickle.dumps(out))
"""


def _parallel(log: Path, ks: KeySet, needle: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """What the reader found, in 2 forked workers; what it raised is raised here."""
    child = subprocess.run(
        [sys.executable, "-c", _READ, str(log), str(ks.directory), needle.hex()],
        capture_output=True,
        check=True,
        timeout=120,
    )
    out = pickle.loads(child.stdout)
    if len(out) == 2:
        raise out[0](out[1])
    found, head, workers = out
    assert workers == 2
    return found, head


@pytest.fixture
def log(tmp_path: Path, ks: KeySet) -> Path:
    build_log(tmp_path / "log", ks, EVENTS, segment_bytes=16384, payload=_payload, batch=4)
    return tmp_path / "log"


@pytest.mark.parametrize("needle", [b"", b'"op-3"', b'"n": 1', b"no such bytes"])
def test_finds_what_the_serial_reader_finds(log: Path, ks: KeySet, needle: bytes) -> None:
    assert len(list(log.glob("seg-*"))) >= 3  # units cross segment files
    assert _parallel(log, ks, needle) == _serial(log, ks, needle)


def test_a_partial_last_line_is_left_to_the_writer(log: Path, ks: KeySet) -> None:
    last = sorted(log.glob("seg-*"))[-1]
    with last.open("ab") as f:
        f.write(b'{"seq": 99999, "half a record')  # what a live writer's next line looks like
    assert _parallel(log, ks, b'"op-1"') == _serial(log, ks, b'"op-1"')


def test_a_damaged_record_raises_what_the_serial_reader_raises(
    log: Path, ks: KeySet, tmp_path: Path
) -> None:
    middle = sorted(log.glob("seg-*"))[1]
    data = bytearray(middle.read_bytes())
    data[len(data) // 2] ^= 0x01
    middle.write_bytes(bytes(data))
    with pytest.raises(DamagedLogError) as serial:
        _serial(log, ks, b'"op-1"')
    with pytest.raises(DamagedLogError) as parallel:
        _parallel(log, ks, b'"op-1"')
    assert str(parallel.value) == str(serial.value)


def test_a_log_from_another_start_is_read_serially(log: Path, ks: KeySet, tmp_path: Path) -> None:
    """Without its first segment the joined chain cannot start: the serial reader decides."""
    cut = tmp_path / "cut"
    shutil.copytree(log, cut)
    sorted(cut.glob("seg-*"))[0].unlink()
    with pytest.raises(DamagedLogError) as serial:
        _serial(cut, ks, b'"op-1"')
    with pytest.raises(DamagedLogError) as parallel:
        _parallel(cut, ks, b'"op-1"')
    assert type(parallel.value) is type(serial.value)
    assert str(parallel.value) == str(serial.value)


def test_a_process_with_other_threads_reads_serially(log: Path, ks: KeySet) -> None:
    """Forking a threaded process could hand the child a lock another thread held."""
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        reader = ParallelReader(log, ks.keyring(), b'"op-2"', jobs=2, unit_bytes=4096, min_bytes=0)
        found = list(reader.payloads([]))
    finally:
        release.set()
        other.join()
    assert reader.workers == 0
    assert (found, reader.next_seq - 1) == _serial(log, ks, b'"op-2"')
