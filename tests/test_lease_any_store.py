"""The node's standby policy (``daemon.lease``) talks to the store interface only: given the
segment-file store's following side, it copies the log, takes the directory lock as its
lease, keeps it, and hands it over, with no database anywhere."""

from __future__ import annotations

from pathlib import Path

import anyio

from daemon.lease import Lease
from eventlog.filestore import FILE_EPOCH, FileStore
from eventlog.pgstore import PgSettings
from eventlog.segments import list_segments
from tests.eventlog._logtools import build_log, make_keys


def _bytes(log_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for _, p in list_segments(log_dir))


def test_a_standby_follows_and_takes_a_file_log(tmp_path: Path) -> None:
    source = tmp_path / "log"
    build_log(source, make_keys(tmp_path / "keys"), 30)
    store = FileStore(source, snapshot_path=tmp_path / "state.snapshot")
    onlooker = FileStore(source, snapshot_path=tmp_path / "state.snapshot")
    lease = Lease(
        PgSettings("postgresql://nowhere.invalid/none"),
        tmp_path / "copy",
        lease_seconds=60,
        renew_seconds=0.05,
        margin=0.2,
        poll=0.05,
        following=store.following(),
    )

    async def run() -> None:
        await lease.open()
        try:
            with anyio.fail_after(10):
                assert await lease.acquire() == FILE_EPOCH
                assert onlooker.lease().held
                assert onlooker.take_lease("other", 60) is None
                with anyio.move_on_after(0.3):  # a few renewals, all granted
                    await lease.keep()
                assert lease.stats.renewals >= 2
                assert lease.allows(1.0)
                await lease.release()
        finally:
            await lease.aclose()

    anyio.run(run)
    assert _bytes(tmp_path / "copy") == _bytes(source)
    assert not onlooker.lease().held
    assert onlooker.take_lease("other", 60) is not None
    onlooker.close()
