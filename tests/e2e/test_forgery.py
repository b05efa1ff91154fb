"""Forgery with the data key alone, against the real daemon: neither a record appended to the
log's unsigned tail nor a rewritten state snapshot is acted on.

The attacker here holds ``data.key`` (it reads and encrypts payloads) but not
``signing.key``: the records after the last checkpoint and the snapshot are authenticated by
a MAC keyed from the signing key, which the data key does not give.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from daemon.config import load_config
from daemon.readers import open_keyring
from daemon.snapshots import MODEL
from eventlog.envelope import Recovery
from eventlog.reader import LogReader, read_payloads
from replay.events import OperationRegistered, decode_log_event, encode_event
from replay.ledger import Ledger
from tests.e2e.harness import Workspace, drop_registration, until, workspace
from tests.e2e.test_snapshot import FAST
from tests.e2e.test_snapshot import _replayed as replayed
from tests.eventlog._logtools import forge_event, reseal_with_data_key


def _polls(ws: Workspace, job: str) -> int:
    return len([r for r in ws.sim.requests(kind="status") if r.target.endswith("/" + job)])


def _run_and_stop(ws: Workspace) -> None:
    ws.write_profile(contract=FAST)
    daemon = ws.start_daemon()
    drop_registration(ws, "op-0", "job-0")
    until(lambda: _polls(ws, "job-0") >= 3, what="three polls of job-0")
    assert daemon.stop() == 0


def test_a_forged_record_in_the_unsigned_tail_is_quarantined_and_never_acted_on(
    tmp_path: Path,
) -> None:
    with workspace(tmp_path, {"job-0": "running", "job-forged": "running"}) as ws:
        _run_and_stop(ws)
        cfg = load_config(str(ws.config))
        keyring = open_keyring(cfg)
        # The attacker copies op-0's registration, points it at another job, and appends it
        # after the final checkpoint: chained and encrypted correctly, with the data key only.
        registered = next(
            ev
            for _, p in read_payloads(cfg.log_dir, keyring)
            if isinstance(ev := decode_log_event(p), OperationRegistered)
        )
        forged = msgspec.structs.replace(
            registered, operation_id="op-forged", provider_job_id="job-forged"
        )
        forged_seq = forge_event(cfg.log_dir, keyring, encode_event(forged))

        audit = ws.bide("verify", "--json")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "not followed by a seal" in audit.stdout

        second = ws.start_daemon()
        assert "log records no seal covers quarantined" in second.output()
        polled = _polls(ws, "job-0")
        until(lambda: _polls(ws, "job-0") >= polled + 3, what="op-0 still polled")
        assert second.stop() == 0
        assert _polls(ws, "job-forged") == 0  # never acted on
        log = ws.log()
        assert "op-forged" not in log.ops
        assert "op-0" in log.ops
        cuts = [s.record for s in LogReader(cfg.log_dir).poll() if isinstance(s.record, Recovery)]
        assert [(c.seq, c.reason) for c in cuts] == [(forged_seq, "unsealed")]
        assert (cfg.log_dir / cuts[0].quarantine).stat().st_size == cuts[0].cut_len
        audit = ws.bide("verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_snapshot_rewritten_with_the_data_key_is_refused_and_the_log_replayed(
    tmp_path: Path,
) -> None:
    with workspace(tmp_path, {"job-0": "running"}) as ws:
        _run_and_stop(ws)
        cfg = load_config(str(ws.config))

        def drop_op(body: bytes) -> bytes:
            ledger = Ledger.load(body, MODEL)
            del ledger.ops["op-0"]  # the attacker ends the operation in the daemon's state
            return ledger.dump(MODEL)

        reseal_with_data_key(cfg.snapshot_path, open_keyring(cfg), drop_op)
        second = ws.start_daemon()
        assert "state snapshot not used" in second.output()
        assert "no state snapshot usable; replaying the whole log" in second.output()
        events, from_snapshot = replayed(second)
        assert from_snapshot == 0 < events
        polled = _polls(ws, "job-0")
        until(lambda: _polls(ws, "job-0") >= polled + 2, what="op-0 still polled")
        assert second.stop() == 0
        assert "op-0" in ws.log().ops
