"""The operator's and auditor's tools on a sharded log in a real PostgreSQL: ``bide verify
--dsn`` per shard and for all shards, ``bide log export`` per shard (and ``bide verify`` of
the export), ``bide replay --check --dsn``, ``bide log shards`` and ``bide status --node``.

The log is made as ``bide log init --shards 4`` makes it; two shards get real records,
written as a node writes them (a lease taken in the shard's schema, a term's store under a
:class:`~eventlog.writer.LogWriter`), each record an event of an operation whose id belongs
to that shard. Every command runs as a real process, as an operator runs it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import psycopg
import pytest
from psycopg import sql

from daemon.errors import UsageError
from daemon.pgconfig import chosen_shards
from eventlog import pgstore
from eventlog.segments import list_segments
from eventlog.shards import Layout, init_sharded, shard_of
from eventlog.writer import LogWriter
from replay import PollScheduled, encode_event
from tests.e2e.harness import config_text, postgres_table
from tests.eventlog._logtools import KeySet, make_keys
from tests.pgsupport import role, schema_dsn
from tests.replay.helpers import Daemon

BIDE = [sys.executable, "-m", "daemon.cli"]
COUNT = 4
WRITTEN = (1, 2)  # the shards that get records; 0 and 3 stay as init left them


def bide(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BIDE, *args], capture_output=True, text=True, timeout=120, check=False)


def op_in(shard: int, prefix: str = "job") -> str:
    """An operation id that belongs to ``shard`` of :data:`COUNT`."""
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", COUNT) == shard)


def events_of(op_id: str, *, skew: bool = False) -> list[bytes]:
    """An operation's events as the daemon records them (registered, three polls); with
    ``skew`` one recorded delay is not the one ``decide`` gives (a replay mismatch)."""
    d = Daemon.start(operation_id=op_id)
    for _ in range(3):
        d.poll_and_respond(draw=0.25)
    log = list(d.log)
    if skew:
        i = next(i for i, ev in enumerate(log) if isinstance(ev, PollScheduled) and i > 2)
        ev = log[i]
        assert isinstance(ev, PollScheduled)
        log[i] = msgspec.structs.replace(ev, next_poll_at=ev.next_poll_at + 7, delay=ev.delay + 7)
    return [encode_event(ev) for ev in log]


def write_shard(
    settings: pgstore.PgSettings, copy: Path, ks: KeySet, payloads: list[bytes], node: str
) -> None:
    """Append ``payloads`` to a shard as its holder does: take the shard's lease, then write
    through the term's store (every round committed under the epoch)."""
    with pgstore.connect(settings) as conn:
        term = pgstore.take_lease(conn, f"{node}/4242/ab12cd", 60)
    assert term is not None
    store = pgstore.PgStore(settings, term)

    async def run() -> None:
        async with LogWriter(
            copy,
            ks.keyring(),
            ks.signer(),
            segment_bytes=4096,
            checkpoint_every=5,
            checkpoint_interval=3600,
            store=store,
        ) as w:
            for p in payloads:
                await w.append(p)

    try:
        anyio.run(run)
    finally:
        store.close()


class Sharded:
    """A 4-shard log with records in shards 1 and 2, and the keys that wrote them."""

    def __init__(
        self,
        dsn: str,
        tmp: Path,
        *,
        skew_shard: int | None = None,
        reader: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.tmp = tmp
        self.ks = make_keys(tmp / "keys")
        self.layout, _ = init_sharded(pgstore.PgSettings(dsn), COUNT, reader=reader)
        self.ops = {k: op_in(k) for k in WRITTEN}
        for k in WRITTEN:
            write_shard(
                self.settings(k),
                tmp / f"copy-{k}",
                self.ks,
                events_of(self.ops[k], skew=k == skew_shard),
                node=f"node-{'ab'[k - 1]}",
            )

    def settings(self, shard: int) -> pgstore.PgSettings:
        return self.layout.settings(pgstore.PgSettings(self.dsn), shard)

    def head(self, shard: int) -> int:
        """The sequence number of the shard's last record, as the database holds it."""
        with pgstore.PgLogStore(self.settings(shard), read_only=True) as store:
            got = store.head()
        assert got is not None
        return got[0]

    @property
    def verify_pub(self) -> str:
        return str(self.ks.verify_pub)

    def config(self) -> Path:
        path = self.tmp / "bide.toml"
        path.write_text(config_text(postgres=postgres_table(self.dsn, node="node-a")))
        return path


@pytest.fixture
def sharded(pg_dsn: str, tmp_path: Path) -> Sharded:
    return Sharded(pg_dsn, tmp_path)


def tamper(dsn: str, layout: Layout, shard: int, seq: int) -> None:
    """Flip one byte of a stored record as the tables' owner can (past the trigger)."""
    schema = sql.Identifier(layout.schema(shard))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {}.bide_records DISABLE TRIGGER bide_records_append_only").format(
                schema
            )
        )
        row = conn.execute(
            sql.SQL(
                "UPDATE {}.bide_records SET line = set_byte(line, length(line) - 20, "
                "get_byte(line, length(line) - 20) # 1) "
                "WHERE seq = %s RETURNING seq"
            ).format(schema),
            (seq,),
        ).fetchone()
    assert row == (seq,)


def test_verify_every_shard_then_one_and_a_tampered_shard_alone_is_damaged(
    sharded: Sharded,
) -> None:
    out = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for k in WRITTEN:
        assert any(line.startswith(f"shard 00{k}: records=") and "intact" in line for line in lines)
    for k in (0, 3):
        assert f"shard 00{k}: records=0 verdict=empty (no node has taken this shard yet)" in lines
    assert lines[-1].startswith("total: 4 shard(s) (all): 2 intact, 2 empty;")
    assert lines[-1].endswith("verdict=intact")

    one = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--shard", "2")
    assert one.returncode == 0, one.stdout + one.stderr
    assert [ln.split(":")[0] for ln in one.stdout.splitlines() if ln.startswith("shard")] == [
        "shard 002"
    ]
    assert "total: 1 shard(s) (of 4): 1 intact" in one.stdout

    tamper(sharded.dsn, sharded.layout, 2, 3)
    bad = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--json")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert report["verdict"] == "damaged"
    assert report["exit_status"] == 1
    assert report["count"] == COUNT
    verdicts = {s["shard"]: s["verdict"] for s in report["shards"]}
    assert verdicts == {0: "empty", 1: "intact", 2: "damaged", 3: "empty"}
    damaged = report["shards"][2]
    assert damaged["damage"]["seq"] == 3, damaged["damage"]
    assert damaged["damage"]["kind"] == "modified"
    assert damaged["where"] == sharded.layout.schema(2)

    text = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub)
    assert text.returncode == 1
    assert any(
        ln.startswith("shard 002: DAMAGE modified at record 3") for ln in text.stdout.splitlines()
    )
    assert "DAMAGE" not in "".join(ln for ln in text.stdout.splitlines() if "shard 001" in ln)
    assert "verdict=damaged" in text.stdout.splitlines()[-1]
    # The untouched shard alone still verifies.
    assert (
        bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--shard", "1")
    ).returncode == 0


def test_shard_out_of_range_names_the_range_and_an_unsharded_log_takes_zero_only(
    sharded: Sharded, tmp_path: Path
) -> None:
    out = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--shard", "99")
    assert out.returncode == 2
    assert "--shard 99: the log in schema" in out.stderr
    assert "has 4 shards, 0..3 (or all)" in out.stderr
    out = bide("log", "export", str(tmp_path / "x"), "--dsn", sharded.dsn, "--shard", "-1")
    assert out.returncode == 2
    assert "0..3" in out.stderr

    # --shard with the config of a node whose log is in PostgreSQL: that database (and the
    # config's verify.pub, in the keys directory the log was written with).
    config = sharded.config()
    by_config = bide("verify", "--config", str(config), "--shard", "2")
    assert by_config.returncode == 0, by_config.stdout + by_config.stderr
    assert "total: 1 shard(s) (of 4): 1 intact" in by_config.stdout
    # A log directory is one log: --shard names a shard of a sharded log only.
    lone = bide(
        "verify", str(tmp_path / "copy-1"), "--verify-key", sharded.verify_pub, "--shard", "1"
    )
    assert lone.returncode == 2
    assert "is one log (shard 0), not a sharded export (shards.json)" in lone.stderr

    plain = sharded.settings(1)  # one shard's schema is an unsharded log of its own
    out = bide("verify", "--dsn", plain.dsn, "--verify-key", sharded.verify_pub, "--shard", "1")
    assert out.returncode == 2
    assert "is not sharded (one shard): only --shard 0 or all" in out.stderr
    out = bide("verify", "--dsn", plain.dsn, "--verify-key", sharded.verify_pub, "--shard", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "shard 00" not in out.stdout  # an unsharded log's report is the one it always had
    assert out.stdout.splitlines()[-1].endswith("verdict=intact")
    listed = bide("log", "shards", "--dsn", plain.dsn, "--json")
    assert listed.returncode == 0, listed.stderr
    view = json.loads(listed.stdout)
    assert (view["count"], view["sharded"], view["nodes"]) == (1, False, [])
    assert view["shards"][0]["schema"] == sharded.layout.schema(1)
    assert view["shards"][0]["node"] == "node-a"

    # A shard whose schema is gone (an init that never finished): the error names it.
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(sharded.layout.schema(3)))
        )
    gone = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub)
    assert gone.returncode == 2
    assert f"shard 3 ({sharded.layout.schema(3)}): " in gone.stderr


def _files(log_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for _, p in list_segments(log_dir)}


def test_export_writes_a_directory_per_shard_that_verifies_alone_and_together(
    sharded: Sharded, tmp_path: Path
) -> None:
    out_dir = tmp_path / "export"
    out = bide("log", "export", str(out_dir), "--dsn", sharded.dsn)
    assert out.returncode == 0, out.stdout + out.stderr
    index = json.loads((out_dir / "shards.json").read_text())
    assert index["count"] == COUNT
    assert index["base"] == sharded.layout.base
    assert index["shards"] == {str(k): f"shard-{k:03d}" for k in range(COUNT)}
    for k in WRITTEN:
        # byte for byte what the writing node's own copy holds
        assert _files(out_dir / f"shard-{k:03d}") == _files(tmp_path / f"copy-{k}")
        alone = bide("verify", str(out_dir / f"shard-{k:03d}"), "--verify-key", sharded.verify_pub)
        assert alone.returncode == 0, alone.stdout + alone.stderr
    together = bide("verify", str(out_dir), "--verify-key", sharded.verify_pub, "--json")
    assert together.returncode == 0, together.stdout + together.stderr
    report = json.loads(together.stdout)
    assert report["export"] == str(out_dir)
    assert [s["verdict"] for s in report["shards"]] == ["empty", "intact", "intact", "empty"]

    every = bide("log", "export", str(tmp_path / "every"), "--dsn", sharded.dsn, "--shard", "all")
    assert every.returncode == 0, every.stdout + every.stderr
    assert json.loads((tmp_path / "every" / "shards.json").read_text()) == index

    # One shard exported into a directory of its own: an ordinary log.
    one = bide("log", "export", str(tmp_path / "one"), "--dsn", sharded.dsn, "--shard", "1")
    assert one.returncode == 0, one.stdout + one.stderr
    assert _files(tmp_path / "one") == _files(tmp_path / "copy-1")
    assert not (tmp_path / "one" / "shards.json").exists()

    # An export cut short (shards.json is written last) is named as such.
    (out_dir / "shards.json").rename(tmp_path / "index")
    cut = bide("verify", str(out_dir), "--verify-key", sharded.verify_pub)
    assert cut.returncode == 2
    assert "an export that did not finish" in cut.stderr
    (tmp_path / "index").rename(out_dir / "shards.json")

    # A damaged segment in one exported shard: only that shard is damaged.
    seg = list_segments(out_dir / "shard-001")[0][1]
    data = bytearray(seg.read_bytes())
    data[300] ^= 1
    seg.write_bytes(bytes(data))
    bad = bide("verify", str(out_dir), "--verify-key", sharded.verify_pub)
    assert bad.returncode == 1
    damaged = [ln for ln in bad.stdout.splitlines() if "DAMAGE" in ln]
    assert damaged
    assert all(ln.startswith("shard 001: ") for ln in damaged)


def test_replay_check_from_the_database_one_verdict_per_shard(pg_dsn: str, tmp_path: Path) -> None:
    log = Sharded(pg_dsn, tmp_path, skew_shard=2)
    config = log.config()
    out = bide("replay", "--check", "--dsn", log.dsn, "--config", str(config))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "shard 001: check: 13 events, 1 operations, 0 mismatch(es)" in lines
    assert any(ln.startswith(f"shard 002: MISMATCH {log.ops[2]} at event") for ln in lines)
    assert all(log.ops[1] not in ln for ln in lines if "MISMATCH" in ln)
    assert "shard 002: check: 13 events, 1 operations, 2 mismatch(es)" in lines
    assert "shard 000: check: empty (no record)" in lines
    assert lines[-1] == (
        "total: 4 shard(s) (all), 1 with mismatches: 26 events, 2 operations, 2 mismatch(es)"
    )
    # A sharded node's config (its copies in STATE/shards/): the database, with no flag.
    (tmp_path / "state" / "shards").mkdir(parents=True)
    node = bide("replay", "--check", "--config", str(config))
    assert node.returncode == 1
    assert node.stdout.splitlines()[-1] == lines[-1]
    audit = bide("verify", "--config", str(config), "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert json.loads(audit.stdout)["count"] == COUNT
    one = bide("replay", "--check", "--shard", "1", "--config", str(config), "--json")
    assert one.returncode == 0, one.stdout + one.stderr
    report = json.loads(one.stdout)
    assert [op["operation_id"] for op in report["operations"]] == [log.ops[1]]
    assert report["shards"] == [
        {
            "shard": 1,
            "verdict": "ok",
            "events": 13,
            "operations": 1,
            "head_seq": log.head(1),
            "mismatches": 0,
        }
    ]


def test_replay_check_finds_an_operation_in_the_wrong_shard(pg_dsn: str, tmp_path: Path) -> None:
    ks = make_keys(tmp_path / "keys")
    layout, _ = init_sharded(pgstore.PgSettings(pg_dsn), COUNT)
    stray = op_in(3)
    write_shard(
        layout.settings(pgstore.PgSettings(pg_dsn), 0), tmp_path / "c0", ks, events_of(stray), "n"
    )
    config = tmp_path / "bide.toml"
    config.write_text(config_text(postgres=postgres_table(pg_dsn)))
    out = bide("replay", "--check", "--config", str(config), "--shard", "all")
    assert out.returncode == 1
    assert (
        f"shard 000: MISMATCH {stray} at event 0 (wrong_shard): recorded in shard 0, but its "
        f"id belongs to shard 3"
    ) in out.stdout.splitlines()


def test_log_shards_and_status_node_show_holders_leases_and_nodes(sharded: Sharded) -> None:
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bide_nodes (node, expires_at, leaving, held) VALUES "
            "('node-a', now() + interval '30 seconds', false, 1), "
            "('node-b', now() + interval '30 seconds', true, 1), "
            "('node-gone', now() - interval '20 seconds', false, 0)"
        )
    out = bide("log", "shards", "--dsn", sharded.dsn, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    view = json.loads(out.stdout)
    assert (view["count"], view["held"], view["sharded"]) == (4, 2, True)
    by_shard = {s["shard"]: s for s in view["shards"]}
    assert by_shard[1]["node"] == "node-a"
    assert by_shard[2]["node"] == "node-b"
    assert by_shard[1]["epoch"] == 1
    assert 50 < by_shard[1]["lease_remaining_seconds"] <= 60
    head = sharded.head(1)
    assert (by_shard[1]["head_seq"], by_shard[1]["records"]) == (head, head + 1)
    assert by_shard[0] | {"schema": None} == {
        "shard": 0,
        "schema": None,
        "held": False,
        "holder": None,
        "node": None,
        "last_holder": None,
        "epoch": 0,
        "lease_remaining_seconds": 0,
        "head_seq": -1,
        "records": 0,
    }
    nodes = {n["node"]: n for n in view["nodes"]}
    assert (nodes["node-a"]["live"], nodes["node-a"]["holding"]) == (True, [1])
    assert (nodes["node-b"]["leaving"], nodes["node-b"]["holding"]) == (True, [2])
    assert nodes["node-gone"]["live"] is False
    assert nodes["node-gone"]["heartbeat_remaining_seconds"] < -19

    text = bide("log", "shards", "--dsn", sharded.dsn)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"4 shard(s) in schema {sharded.layout.base}, sharded: 2 held, 2 free"
    assert lines[1].split() == ["shard", "holder", "epoch", "lease", "head", "records"]
    assert lines[2].split() == ["000", "-", "0", "free", "-1", "0"]
    assert lines[3].split()[:3] == ["001", "node-a/4242/ab12cd", "1"]
    assert any(ln.split()[:2] == ["node-gone", "expired"] for ln in lines)

    status = bide("status", "--node", "--config", str(sharded.config()), "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    mine = json.loads(status.stdout)
    assert (mine["node"], mine["live"], mine["held"], mine["following"]) == (
        "node-a",
        True,
        [1],
        [0, 2, 3],
    )
    plain = bide("status", "--node", "--config", str(sharded.config()))
    assert plain.returncode == 0, plain.stderr
    out_lines = plain.stdout.splitlines()
    assert out_lines[0].startswith("node node-a: live (heartbeat ")
    assert out_lines[0].endswith("holds 1 of 4 shards (1), follows 3")
    assert out_lines[2].startswith("shard 001: held by this node (node-a/4242/ab12cd), epoch 1")
    assert out_lines[3].startswith("shard 002: following; held by node-b (epoch 1, lease ")
    assert out_lines[1] == (
        "shard 000: following; no node holds it (epoch 0; the lease is free), head -1"
    )


@pytest.fixture
def other_dsn() -> Iterator[str]:
    """A second fresh schema of this test's own (dropped with its shards afterwards)."""
    yield from schema_dsn()


def test_an_export_imports_back_shard_by_shard_and_heads_anchor_one_shard(
    sharded: Sharded, other_dsn: str, tmp_path: Path
) -> None:
    out_dir = tmp_path / "export"
    assert bide("log", "export", str(out_dir), "--dsn", sharded.dsn).returncode == 0

    two, _ = init_sharded(pgstore.PgSettings(other_dsn), 2)
    refused = bide(
        "log", "import", str(out_dir), "--verify-key", sharded.verify_pub, "--dsn", other_dsn
    )
    assert refused.returncode == 2
    assert "export of 4 shard(s) but the log in schema" in refused.stderr
    assert "nothing copied" in refused.stderr
    with pgstore.PgLogStore(two.settings(pgstore.PgSettings(other_dsn), 0)) as store:
        assert store.head() is None

    with psycopg.connect(other_dsn, autocommit=True) as conn:  # start again with 4 shards
        for schema in [*two.schemas(), two.base]:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(two.base)))
    init_sharded(pgstore.PgSettings(other_dsn), COUNT)
    whole = bide(
        "log",
        "import",
        str(tmp_path / "copy-1"),
        "--verify-key",
        sharded.verify_pub,
        "--dsn",
        other_dsn,
    )
    assert whole.returncode == 2
    assert "is sharded (4 shards)" in whole.stderr
    back = bide(
        "log", "import", str(out_dir), "--verify-key", sharded.verify_pub, "--dsn", other_dsn
    )
    assert back.returncode == 0, back.stdout + back.stderr
    assert back.stdout.splitlines()[-1] == "imported 2 shard(s) of 4"
    again = bide("log", "export", str(tmp_path / "again"), "--dsn", other_dsn)
    assert again.returncode == 0, again.stdout + again.stderr
    for k in WRITTEN:
        name = f"shard-{k:03d}"
        assert _files(tmp_path / "again" / name) == _files(out_dir / name)

    heads = bide("log", "head", "--dsn", sharded.dsn)
    assert heads.returncode == 0, heads.stderr
    lines = heads.stdout.splitlines()
    assert lines[0] == "shard 000 -"
    assert lines[1].startswith(f"shard 001 {sharded.head(1)}:")
    one = bide("log", "head", "--dsn", sharded.dsn, "--shard", "1")
    anchor = one.stdout.strip()
    assert anchor == lines[1].split()[2]
    good = bide(
        "verify",
        "--dsn",
        sharded.dsn,
        "--verify-key",
        sharded.verify_pub,
        "--shard",
        "1",
        "--anchor",
        anchor,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    several = bide(
        "verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--anchor", anchor
    )
    assert several.returncode == 2
    assert "--anchor names one shard's head: add --shard K" in several.stderr


def test_the_shard_flag_names_the_range_of_the_log_it_reads() -> None:
    sixteen = Layout("bide", 16)
    assert chosen_shards(sixteen, None) == list(range(16))
    assert chosen_shards(sixteen, "all") == list(range(16))
    assert chosen_shards(sixteen, " 7 ") == [7]
    for wrong in ("99", "16", "-1", "seven", ""):
        with pytest.raises(UsageError, match=r"has 16 shards, 0\.\.15 \(or all\)"):
            chosen_shards(sixteen, wrong)
    one = Layout("public", 1)
    assert chosen_shards(one, "0") == [0]
    assert chosen_shards(one, "ALL") == [0]
    with pytest.raises(UsageError, match=r"--shard 1: the log in schema public is not sharded"):
        chosen_shards(one, "1")


def test_a_shard_copied_over_another_is_damage_in_both(sharded: Sharded) -> None:
    """Each shard's chain verifies alone, so a copy of shard 1's records put in place of
    shard 0's would pass shard by shard: the shared log id gives it away."""
    source, target = (sql.Identifier(sharded.layout.schema(k)) for k in (1, 0))
    with psycopg.connect(sharded.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.bide_records SELECT * FROM {}.bide_records").format(
                target, source
            )
        )
    out = bide("verify", "--dsn", sharded.dsn, "--verify-key", sharded.verify_pub, "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    verdicts = {s["shard"]: s["verdict"] for s in report["shards"]}
    assert verdicts == {0: "damaged", 1: "damaged", 2: "intact", 3: "empty"}
    for k in (0, 1):
        damage = report["shards"][k]["damage"]
        assert damage["kind"] == "duplicated"
        assert "shards 0, 1 hold the same log" in damage["detail"]


@pytest.fixture
def auditor_dsn(pg_dsn: str) -> Iterator[str]:
    """A role that may only read (dropped afterwards), and the DSN that logs in as it."""
    yield from role(pg_dsn, f"bide_audit_{secrets.token_hex(4)}")


def test_an_auditors_read_only_role_verifies_exports_and_lists_every_shard(
    pg_dsn: str, auditor_dsn: str, tmp_path: Path
) -> None:
    auditor = str(psycopg.conninfo.conninfo_to_dict(auditor_dsn)["user"])
    log = Sharded(pg_dsn, tmp_path, reader=auditor)
    out = bide("verify", "--dsn", auditor_dsn, "--verify-key", log.verify_pub)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1].startswith("total: 4 shard(s) (all): 2 intact")
    export = bide("log", "export", str(tmp_path / "export"), "--dsn", auditor_dsn)
    assert export.returncode == 0, export.stdout + export.stderr
    listed = bide("log", "shards", "--dsn", auditor_dsn, "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert json.loads(listed.stdout)["held"] == 2
