"""Forward-secure signing under HA: nodes enrolled once from the root key, each with a key chain
of its own; a node that takes a log over signs its takeover with its current node key, carrying
its certificate and chain, and ``verify`` with ``verify.pub`` alone follows the log across
takeovers. A takeover by an unenrolled key, a forged certificate, another root's node, a node
key used twice (a kept copy of a destroyed key) or a truncated chain is damage, named.

Each case runs on a file log and on a log in PostgreSQL (the node's local copy, every write
committed to the database under the node's lease epoch, then exported and verified)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import anyio
import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from daemon.config import load_config
from daemon.signing import (
    database_tail_epochs,
    log_node,
    node_chain,
    open_log_signing,
    term_ended,
)
from eventlog import headchain, keys, pgstore
from eventlog.envelope import (
    Checkpoint,
    EventRecord,
    Genesis,
    NodeCert,
    Seal,
    Takeover,
    associated_data,
    encode_record,
    record_hash,
)
from eventlog.epochs import (
    EPOCHS_DIR,
    EpochPolicy,
    EpochSigning,
    epoch_key_files,
    forget_epoch_keys,
)
from eventlog.errors import DamagedLogError, KeyFileError
from eventlog.logstore import Term
from eventlog.nodekeys import (
    CERT_FILE,
    LINKS_FILE,
    NodeChain,
    check_chain,
    enroll,
    node_key_name,
    not_enrolled,
)
from eventlog.seal import Sealer
from eventlog.store import StoredLine as DbLine
from eventlog.store import write_segments
from eventlog.verify import Report, verify_log
from eventlog.writer import LogWriter
from tests.eventlog._logtools import (
    KeySet,
    StoredLine,
    make_keys,
    payload_for,
    read_lines,
    rechain,
    write_lines,
)

EVERY_2 = EpochPolicy(every_checkpoints=2, every_seconds=0)


def _node(ks: KeySet, state: Path, name: str) -> NodeChain:
    """Node ``name`` enrolled with ``ks``'s root, its files copied into ``state/node``."""
    out = state.parent / f"{state.name}-{name}.enrolled"
    enroll(ks.signer(), name, out)
    node_dir = state / "node"
    node_dir.mkdir(mode=0o700, parents=True)
    for path in out.iterdir():
        (node_dir / path.name).write_bytes(path.read_bytes())
        (node_dir / path.name).chmod(path.stat().st_mode & 0o777)
    return NodeChain(node_dir, ks.verify_key(), name)


def _signing(ks: KeySet, state: Path, chain: NodeChain) -> EpochSigning:
    return EpochSigning(ks.verify_key(), state / EPOCHS_DIR, policy=EVERY_2, node=chain)


class Log:
    """One log written term by term by nodes, on files or in PostgreSQL."""

    def __init__(self, root: Path, dsn: str | None) -> None:
        self.root, self.dsn = root, dsn
        self.epoch = 0
        self.exports = 0

    def term(self, ks: KeySet, state: Path, chain: NodeChain, events: int = 5) -> None:
        """A node's term: open its copy, write its takeover, some events."""
        self.epoch += 1
        holder = f"{chain.node}/{100 + self.epoch}/ab"
        log_dir = state / "log"

        async def run() -> None:
            taken = None if self.dsn is None else _pg_term(self.dsn, holder, log_dir)
            store = None if taken is None else taken[0]
            signing = _signing(ks, state, chain)
            if self.dsn is not None:  # as daemon.signing gives it to a node
                signing.tail_epochs = database_tail_epochs(pgstore.PgSettings(self.dsn))
            try:
                async with LogWriter(
                    log_dir if store is not None else self.root / "log",
                    ks.keyring(),
                    signing,
                    checkpoint_every=3,
                    checkpoint_interval=3600,
                    store=store,
                ) as w:
                    await w.checkpoint(Takeover(lease_epoch=self.epoch, holder=holder))
                    for n in range(events):
                        await w.append(payload_for(10 * self.epoch + n))
            finally:
                if taken is not None:
                    taken[0].close()
                    _release(self.dsn, holder, taken[1])
                # The term ends (daemon.node does the same): the node keeps no key of the log.
                forget_epoch_keys(state / EPOCHS_DIR)

        anyio.run(run)

    def log_dir(self) -> Path:
        """The log as an auditor gets it (for PostgreSQL: exported)."""
        if self.dsn is None:
            return self.root / "log"
        self.exports += 1
        out = self.root / f"export-{self.exports}"
        with pgstore.connect(pgstore.PgSettings(self.dsn), read_only=True) as conn:
            write_segments(pgstore.iter_all(conn), out)
        return out


def _release(dsn: str | None, holder: str, term: Term) -> None:
    assert dsn is not None
    with pgstore.connect(pgstore.PgSettings(dsn)) as conn:
        assert pgstore.release_lease(conn, holder, term)


def _pg_term(dsn: str, holder: str, log_dir: Path) -> tuple[pgstore.PgStore, Term]:
    """Take the lease as ``holder`` and give the writer the database store under that epoch,
    after copying the log into ``log_dir`` (as a standby does)."""
    settings = pgstore.PgSettings(dsn)
    with pgstore.connect(settings) as conn:
        term = pgstore.take_lease(conn, holder, 30.0)
    assert term is not None
    log_dir.mkdir(parents=True, exist_ok=True)
    for seg in log_dir.glob("seg-*"):
        seg.unlink()
    with pgstore.connect(settings, read_only=True) as conn:
        write_segments(pgstore.iter_all(conn), log_dir)
    return pgstore.PgStore(settings, term), term


@pytest.fixture(params=["file", "postgres"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Log:
    if request.param == "file":
        return Log(tmp_path, None)
    dsn = request.getfixturevalue("pg_dsn")
    with pgstore.PgLogStore(pgstore.PgSettings(dsn)) as store:
        store.init()
    return Log(tmp_path, dsn)


def _verify(log: Log, ks: KeySet) -> Report:
    return verify_log(log.log_dir(), ks.verify_key())


def test_two_enrolled_nodes_take_turns_and_verify_follows_both_chains(
    log: Log, ks: KeySet, tmp_path: Path
) -> None:
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    for state, chain in [(tmp_path / "a", a), (tmp_path / "b", b), (tmp_path / "a", a)]:
        log.term(ks, state, chain)
    report = _verify(log, ks)
    assert report.damage is None, report.damage
    assert [holder.split("/")[0] for _, _, holder in report.takeovers] == [
        "node-a",
        "node-b",
        "node-a",
    ]
    # The genesis by node-a's key 1 (its first takeover, in the same term, by the epoch key
    # the genesis certified); node-b's takeover by its key 1, node-a's next by its key 2.
    assert [(node, index) for _, node, index, _ in report.node_signed] == [
        ("node-a", 1),
        ("node-b", 1),
        ("node-a", 2),
    ]
    # Every node key used is gone: one key file per node, the next one.
    assert sorted(p.name for p in (tmp_path / "a" / "node").glob("*.key")) == [node_key_name(3)]
    assert sorted(p.name for p in (tmp_path / "b" / "node").glob("*.key")) == [node_key_name(2)]
    # Neither node keeps an epoch key of the log after its term.
    assert epoch_key_files(tmp_path / "b" / EPOCHS_DIR, report.log_id) == []
    assert epoch_key_files(tmp_path / "a" / EPOCHS_DIR, report.log_id) == []


def _edit_takeover(log: Log, edit: Callable[[Checkpoint], Checkpoint], nth: int = 1) -> Path:
    """The auditor's copy of the log with the ``nth`` takeover checkpoint replaced by
    ``edit``'s (the records after it relinked, as an attacker would)."""
    log_dir = log.log_dir()
    lines = read_lines(log_dir)
    i = [k for k, ln in enumerate(lines) if isinstance(ln.record, Checkpoint) and ln.record.holder][
        nth
    ]
    rec = lines[i].record
    assert isinstance(rec, Checkpoint)
    lines[i] = StoredLine(lines[i].segment, encode_record(edit(rec)))
    write_lines(log_dir, rechain(lines, i + 1))
    return log_dir


def _damage(log_dir: Path, ks: KeySet) -> str:
    report = verify_log(log_dir, ks.verify_key())
    assert report.damage is not None
    assert report.damage.kind == "bad_signature"
    return report.damage.detail


@pytest.fixture
def two_terms(log: Log, ks: KeySet, tmp_path: Path) -> tuple[NodeChain, NodeChain]:
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    log.term(ks, tmp_path / "a", a)
    log.term(ks, tmp_path / "b", b)
    assert _verify(log, ks).damage is None
    return a, b


def test_a_takeover_by_an_unenrolled_key_is_damage_naming_it(
    log: Log, ks: KeySet, two_terms: tuple[NodeChain, NodeChain]
) -> None:
    detail = _damage(_edit_takeover(log, lambda cp: msgspec.structs.replace(cp, cert=None)), ks)
    assert "never enrolled" in detail


def test_a_forged_certificate_is_damage_naming_the_node(
    log: Log, ks: KeySet, two_terms: tuple[NodeChain, NodeChain], tmp_path: Path
) -> None:
    # A certificate for a key of the forger's choosing, "signed" by reusing another one's
    # signature: the root key is not theirs.
    forger = keys.Signer(Ed25519PrivateKey.generate())

    def forge(cp: Checkpoint) -> Checkpoint:
        assert cp.cert is not None
        key = base64.b64encode(forger.public_bytes).decode()
        return msgspec.structs.replace(cp, cert=msgspec.structs.replace(cp.cert, key=key))

    detail = _damage(_edit_takeover(log, forge), ks)
    assert "node 'node-b'" in detail
    assert "forged" in detail


def test_a_node_enrolled_by_another_root_is_damage(
    log: Log, ks: KeySet, two_terms: tuple[NodeChain, NodeChain], tmp_path: Path
) -> None:
    other = make_keys(tmp_path / "other-keys")
    enroll(other.signer(), "node-b", tmp_path / "other-b")
    foreign = msgspec.json.decode((tmp_path / "other-b" / CERT_FILE).read_bytes(), type=NodeCert)
    detail = _damage(
        _edit_takeover(log, lambda cp: msgspec.structs.replace(cp, cert=foreign, links=())), ks
    )
    assert "another root key" in detail


def test_a_truncated_chain_is_damage(log: Log, ks: KeySet, tmp_path: Path) -> None:
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    for state, chain in [("a", a), ("b", b), ("a", a), ("b", b), ("a", a)]:
        log.term(ks, tmp_path / state, chain)
    # node-a's last takeover carries the links to its keys 2 and 3: drop the first.
    edited = _edit_takeover(log, lambda cp: msgspec.structs.replace(cp, links=cp.links[1:]), 4)
    detail = _damage(edited, ks)
    assert "truncated" in detail
    assert "node-a" in detail


def test_a_kept_copy_of_a_destroyed_node_key_is_damage(
    log: Log, ks: KeySet, tmp_path: Path
) -> None:
    """A thief who copied node-a's key 2 before it signed (and was destroyed) signs a
    takeover with it after node-a used it: the log already shows key 2's one use."""
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    log.term(ks, tmp_path / "a", a)  # the genesis: key 1
    stolen = tmp_path / "stolen"
    stolen.mkdir(mode=0o700)
    for path in (tmp_path / "a" / "node").iterdir():  # key 2, the link to it
        (stolen / path.name).write_bytes(path.read_bytes())
        (stolen / path.name).chmod(path.stat().st_mode & 0o777)
    log.term(ks, tmp_path / "b", b)
    log.term(ks, tmp_path / "a", a)  # node-a signs with key 2, which is destroyed
    thief = NodeChain(stolen, ks.verify_key(), "node-a")  # the copy of key 2
    log.term(ks, tmp_path / "thief", thief)
    detail = _damage(log.log_dir(), ks)
    assert "node 'node-a''s key 2" in detail
    assert "already signed" in detail


def test_enrol_refuses_to_overwrite_and_the_node_refuses_another_name(
    ks: KeySet, tmp_path: Path
) -> None:
    cert, key = enroll(ks.signer(), "n1", tmp_path / "out")
    assert key.stat().st_mode & 0o777 == 0o600
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        enroll(ks.signer(), "n1", tmp_path / "out")
    assert not_enrolled(tmp_path / "out", ks.verify_key(), "n2") is not None
    assert not_enrolled(tmp_path / "nothing", ks.verify_key(), "n1") is not None
    assert not_enrolled(tmp_path / "out", ks.verify_key(), "n1") is None
    c = msgspec.json.decode(cert.read_bytes(), type=NodeCert)
    assert check_chain(ks.verify_key().raw, c, ()) != check_chain(
        make_keys(tmp_path / "k2").verify_key().raw, c, ()
    )
    assert not (tmp_path / "out" / LINKS_FILE).exists()


def test_a_node_that_crashed_mid_evolution_keeps_a_usable_chain(ks: KeySet, tmp_path: Path) -> None:
    """A key made but never linked (a crash before the link was written) is left alone by a
    reader and destroyed when the node itself reconciles at start; the node goes on from its
    last certified key."""
    chain = _node(ks, tmp_path / "a", "node-a")
    chain.sign(b"x")
    node_dir = tmp_path / "a" / "node"
    (node_dir / node_key_name(3)).write_bytes((node_dir / node_key_name(2)).read_bytes())
    (node_dir / node_key_name(3)).chmod(0o600)
    again = NodeChain(node_dir, ks.verify_key(), "node-a")
    assert again.index == 2
    assert (node_dir / node_key_name(3)).exists()
    assert again.reconcile() == 1
    assert not (node_dir / node_key_name(3)).exists()
    _, _, links = again.sign(b"y")
    assert len(links) == 1
    assert NodeChain(node_dir, ks.verify_key(), "node-a").index == 3


def test_a_genesis_made_by_a_node_needs_no_root_key(log: Log, ks: KeySet, tmp_path: Path) -> None:
    a = _node(ks, tmp_path / "a", "node-a")
    (ks.directory / keys.SIGNING_KEY).unlink()  # offline
    log.term(ks, tmp_path / "a", a)
    report = _verify(log, ks)
    assert report.damage is None
    genesis = read_lines(log.log_dir())[0].record
    assert isinstance(genesis, Genesis)
    assert genesis.cert is not None


def test_one_node_chain_signs_many_logs_at_once(ks: KeySet, tmp_path: Path) -> None:
    """A node holding many shards (one log each) shares its one chain: takeovers of six logs
    at once, their writers signing from worker threads, each use a key of their own, and every
    log verifies."""
    maker, taker = _node(ks, tmp_path / "m", "maker"), _node(ks, tmp_path / "t", "taker")
    logs = [tmp_path / f"shard-{k:03d}" for k in range(6)]

    async def term(chain: NodeChain, state: Path, log_dir: Path, epoch: int) -> None:
        async with LogWriter(
            log_dir,
            ks.keyring(),
            _signing(ks, state / log_dir.name, chain),
            checkpoint_every=3,
            checkpoint_interval=3600,
        ) as w:
            await w.checkpoint(Takeover(lease_epoch=epoch, holder=f"{chain.node}/1/ab"))
            for n in range(4):
                await w.append(payload_for(n))

    async def all_at_once(chain: NodeChain, state: Path, epoch: int) -> None:
        async with anyio.create_task_group() as tg:
            for log_dir in logs:
                tg.start_soon(term, chain, state, log_dir, epoch)

    anyio.run(all_at_once, maker, tmp_path / "m", 1)
    anyio.run(all_at_once, taker, tmp_path / "t", 2)
    used: list[int] = []
    for log_dir in logs:
        report = verify_log(log_dir, ks.verify_key())
        assert report.damage is None, report.damage
        (_, node, index, _), *rest = [s for s in report.node_signed if s[1] == "taker"]
        assert (node, rest) == ("taker", [])
        used.append(index)
    assert sorted(used) == list(range(1, 7))
    node_dir = tmp_path / "t" / "node"
    assert [p.name for p in node_dir.glob("*.key")] == [node_key_name(7)]
    assert len((node_dir / LINKS_FILE).read_text().splitlines()) == 6


def test_a_node_refuses_to_sign_over_records_written_in_an_epoch_no_takeover_names(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    """Whoever holds the nodes' database role and the data key takes a lease of its own and
    appends an event with a seal it cannot make. A node taking over cannot check that seal
    (its MAC key is the previous holder's epoch key), but the record's epoch is named by no
    signed takeover: the node refuses to sign over it, naming the record and the epoch."""
    with pgstore.PgLogStore(pgstore.PgSettings(pg_dsn)) as store:
        store.init()
    log = Log(tmp_path, pg_dsn)
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    log.term(ks, tmp_path / "a", a)
    settings = pgstore.PgSettings(pg_dsn)
    with pgstore.connect(settings) as conn:
        term = pgstore.take_lease(conn, "mallory/1/ab", 30.0)
        last = list(pgstore.iter_all(conn))[-1]
    assert term is not None
    log_id = read_lines(log.log_dir())[0].record.log
    keyring = ks.keyring()
    seq, prev, kid = last.seq + 1, last.hash, keyring.active
    nonce, ct = Sealer(keyring.get(kid)).seal(
        payload_for(99), associated_data(log_id, seq, prev, kid)
    )
    event = encode_record(EventRecord(seq, prev, log_id, kid, nonce, ct))
    seal = encode_record(Seal(seq + 1, record_hash(event), log_id, "A" * 43 + "="))
    offset = last.offset + len(last.data) + 1
    writer = pgstore.PgStore(settings, term)
    writer.commit(
        [
            DbLine(seq, last.segment, offset, event),
            DbLine(seq + 1, last.segment, offset + len(event) + 1, seal),
        ],
        prev,
    )
    writer.close()
    with pgstore.connect(settings) as conn:
        assert pgstore.release_lease(conn, "mallory/1/ab", term)
    log.epoch += 1  # mallory's
    with pytest.raises(
        DamagedLogError, match=f"record {seq} .* lease epoch {term.epoch}, which no"
    ):
        log.term(ks, tmp_path / "b", b)


def test_a_witness_follows_the_node_signed_chain_to_the_head(
    log: Log, ks: KeySet, tmp_path: Path
) -> None:
    """A head checked on its own (eventlog.headchain, as a witness does): the genesis and the
    key-certifying checkpoints, node-signed ones included, lead from verify.pub to it."""
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    for name, chain in [("a", a), ("b", b), ("a", a)]:
        log.term(ks, tmp_path / name, chain)
    log_dir = log.log_dir()
    report = verify_log(log_dir, ks.verify_key())
    head = report.head_seq + 1
    keys_now = headchain.through(ks.verify_key().raw, headchain.log_proof(log_dir, head), head)
    assert (keys_now.epoch, keys_now.epoch_key) == (report.epoch, report.epoch_key)
    assert keys_now.lease_epoch == 3


def test_a_node_enrolled_again_starts_a_new_chain_that_verifies(ks: KeySet, tmp_path: Path) -> None:
    """Re-enrolment (a fresh key 1, say after the chain's cap) is not a reused key."""
    log = Log(tmp_path, None)
    a, b = _node(ks, tmp_path / "a", "node-a"), _node(ks, tmp_path / "b", "node-b")
    for state, chain in [("a", a), ("b", b), ("a", a), ("b", b)]:
        log.term(ks, tmp_path / state, chain)
    again = _node(ks, tmp_path / "a2", "node-a")  # key 1 of a new enrolment
    log.term(ks, tmp_path / "a2", again)
    report = _verify(log, ks)
    assert report.damage is None, report.damage
    assert [(n, i) for _, n, i, _ in report.node_signed][-1] == ("node-a", 1)


def test_a_sharded_node_signs_every_shard_with_its_one_chain(
    pg_dsn: str, ks: KeySet, tmp_path: Path
) -> None:
    """What a node holding many shards calls (daemon.signing), per shard: the process's one
    node chain, each shard's epoch keys and heads in the shard's own state directory, the
    shard's database for the tail check; and at each term's end the shard's epoch keys go."""
    config = tmp_path / "bide.toml"
    config.write_text(
        f'[paths]\nstate_dir = "state"\nkeys_dir = "{ks.directory}"\n\n'
        f'[postgres]\ndsn = "{pg_dsn}"\nnode = "node-s"\n'
    )
    cfg = load_config(str(config))
    with pytest.raises(KeyFileError, match="bide node enroll --name node-s"):
        node_chain(cfg, ks.directory)
    _node(ks, cfg.state_dir, "node-s")
    with pgstore.PgLogStore(pgstore.PgSettings(pg_dsn)) as store:
        store.init()
    shards = [cfg.state_dir / "shards" / f"{k:03d}" for k in range(3)]
    chains = {id(log_node(cfg, ks.directory, s / "log")) for s in shards}
    assert len(chains) == 1
    for shard in shards:
        chosen = open_log_signing(
            cfg,
            ks.directory,
            state_dir=shard,
            log_dir=shard / "log",
            node=log_node(cfg, ks.directory, shard / "log"),
        )
        signing = chosen.signing
        assert isinstance(signing, EpochSigning)
        assert signing.node is node_chain(cfg, ks.directory)
        assert signing.key_dir == shard / EPOCHS_DIR
        assert signing.tail_epochs is not None
        assert signing.tail_epochs(0) == []  # the shard's (here: the one) log is empty

        async def write(log_dir: Path, signing: EpochSigning = signing) -> None:
            async with LogWriter(log_dir, ks.keyring(), signing, checkpoint_every=3) as w:
                await w.append(payload_for(1))

        anyio.run(write, shard / "log")
        assert epoch_key_files(
            shard / EPOCHS_DIR, verify_log(shard / "log", ks.verify_key()).log_id
        )
        assert term_ended(shard) == 1
        assert (
            epoch_key_files(shard / EPOCHS_DIR, verify_log(shard / "log", ks.verify_key()).log_id)
            == []
        )
    assert node_chain(cfg, ks.directory).index == 4  # three geneses, one key each
