"""The witness's state (``daemon.witness.service.WitnessState``) with the heads of real logs
written by the real writer: it follows the certified keys of a forward-secure log across
epochs and of a single-key log, keeps what it holds across a restart, and its state file
stays one line per log plus a bounded tail however many heads it accepts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio

from daemon.witness.service import Trusted, WitnessState, load_or_create_key
from eventlog import keys
from eventlog.envelope import record_hash
from eventlog.epochs import EpochPolicy, EpochSigning
from eventlog.headchain import Proof, genesis_line, head_problem
from eventlog.heads import Head, HeadStore, read_heads
from eventlog.writer import LogWriter

TOKEN = b"state-test-token-0123456789"


async def _write(root: Path, checkpoints: int, rotate_every: int | None) -> None:
    signer: keys.Signer | EpochSigning = keys.load_signer(root / "keys")
    if rotate_every is not None:
        signer = EpochSigning(
            keys.load_verify_key(root / "keys" / "verify.pub"),
            root / "epochs",
            policy=EpochPolicy(every_checkpoints=rotate_every, every_seconds=0),
            root=keys.load_signer(root / "keys"),
        )
    async with LogWriter(
        root / "log",
        keys.load_keyring(root / "keys"),
        signer,
        heads=HeadStore(root / "heads.jsonl"),
        checkpoint_interval=3600,
    ) as w:
        for _ in range(checkpoints):
            await w.append(b"x" * 64)
            await w.checkpoint()


def _log(root: Path, checkpoints: int, rotate_every: int | None) -> tuple[list[Head], str]:
    keys.generate(root / "keys")
    anyio.run(_write, root, checkpoints, rotate_every)
    genesis = genesis_line(root / "log")
    assert genesis is not None
    return read_heads(root / "heads.jsonl"), genesis


def _state(root: Path, log: str, verify_pub: Path) -> WitnessState:
    trust = {log: Trusted(keys.load_verify_key(verify_pub).raw, hashlib.sha256(TOKEN).digest())}
    return WitnessState(root / "state.jsonl", load_or_create_key(root / "w.key"), trust)


def test_heads_of_a_rotating_log_are_followed_one_by_one_and_across_a_restart(
    tmp_path: Path,
) -> None:
    heads, genesis = _log(tmp_path / "a", 90, rotate_every=3)
    assert heads[-1].epoch > 25
    verify_pub = tmp_path / "a" / "keys" / "verify.pub"
    state = _state(tmp_path / "w", heads[0].log, verify_pub)
    assert state.offer(heads[:1], Proof(genesis))[0] == 200
    for i in range(1, 20):
        status, verdict = state.offer(heads[i - 1 : i + 1])
        assert status == 200, verdict.reason
    # A restart: what it held, and the key in force, come back from the file.
    state = _state(tmp_path / "w", heads[0].log, verify_pub)
    for i in range(20, len(heads)):
        status, verdict = state.offer(heads[i - 1 : i + 1])
        assert status == 200, verdict.reason
    held = state.latest[heads[0].log]
    assert (held.seq, held.hash) == (heads[-1].seq, heads[-1].hash)
    # Its certificates prove the held head to a verifier that has the genesis record only.
    assert (
        head_problem(held, keys.load_verify_key(verify_pub).raw, genesis, state.certs(held.log))
        is None
    )
    # A head of a log it does not trust is refused.
    other, _ = _log(tmp_path / "b", 2, rotate_every=None)
    assert state.offer([other[-1]])[0] == 403
    # The file: one line per log after a compaction, and bounded however many heads came.
    lines = (tmp_path / "w" / "state.jsonl").read_bytes().splitlines()
    assert len(lines) <= 4 * 16 + 1 < len(heads)
    _state(tmp_path / "w", heads[0].log, verify_pub)
    assert len((tmp_path / "w" / "state.jsonl").read_bytes().splitlines()) == 1


def test_a_single_key_log_is_checked_with_the_root_key_itself(tmp_path: Path) -> None:
    heads, genesis = _log(tmp_path / "a", 3, rotate_every=None)
    verify_pub = tmp_path / "a" / "keys" / "verify.pub"
    state = _state(tmp_path / "w", heads[0].log, verify_pub)
    status, verdict = state.offer(heads, Proof(genesis))
    assert status == 200, verdict.reason
    other_keys = tmp_path / "other"
    keys.generate(other_keys)
    wrong = _state(tmp_path / "w2", heads[0].log, other_keys / "verify.pub")
    status, verdict = wrong.offer(heads, Proof(genesis))
    assert status == 403
    assert "not by the trusted key" in verdict.reason


def test_every_head_of_a_heads_file_is_checked_in_one_pass(tmp_path: Path) -> None:
    """The daemon's file target holds every checkpoint, certificates included: each head
    verifies from verify.pub; one whose checkpoint was altered is a lie, the rest are not."""
    from daemon.witness.remote import believed, witnessed

    heads, genesis = _log(tmp_path / "a", 60, rotate_every=2)
    root = keys.load_verify_key(tmp_path / "a" / "keys" / "verify.pub").raw
    source = witnessed(str(tmp_path / "a" / "heads.jsonl"), heads[0].log)
    good, lies = believed(source, root, genesis, None)
    assert (len(good), lies) == (len(heads), [])
    assert '"final":false' in heads[30].cp
    forged_cp = heads[30].cp.replace('"final":false', '"final":true')
    source.heads[30] = Head(
        heads[30].log,
        heads[30].seq,
        record_hash(forged_cp.encode()),
        heads[30].epoch,
        heads[30].sig,
        heads[30].t_us,
        forged_cp,
    )
    good, lies = believed(source, root, genesis, None)
    assert len(good) == len(heads) - 1
    assert [lie.head.seq for lie in lies] == [heads[30].seq]
    assert "does not verify" in lies[0].reason
