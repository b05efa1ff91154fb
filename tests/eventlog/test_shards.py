"""The sharded layout in PostgreSQL: which shard holds an id (stable everywhere), where each
shard lives, and ``bide log init --shards N`` making every shard a log of its own, with its
own lease and epoch, that the daemons' role can append to only through the fenced functions."""

from __future__ import annotations

import collections
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import pgstore, shards
from eventlog.errors import SchemaError
from tests.pgsupport import role


def test_an_id_s_shard_is_fixed_by_its_text_alone() -> None:
    # Computed once and written down: a change here would move live operations between
    # shards on an upgrade, which must never happen silently.
    assert [shards.shard_of(f"job-{i}", 16) for i in range(8)] == [8, 10, 9, 7, 7, 0, 3, 6]
    assert shards.shard_of("nightly-export", 16) == 4
    assert shards.shard_of("nightly-export", 64) == 36
    assert shards.shard_of("anything", 1) == 0


@given(st.text(min_size=1, max_size=40).filter(lambda s: "~u" not in s), st.integers(0, 2**31))
def test_a_scoped_id_lives_in_the_shard_of_the_id_its_agent_chose(op_id: str, uid: int) -> None:
    for count in (2, 16, 64):
        assert shards.shard_of(f"{op_id}~u{uid}", count) == shards.shard_of(op_id, count)


def test_ids_spread_evenly_over_the_shards() -> None:
    counts = collections.Counter(shards.shard_of(f"op-{i}", 16) for i in range(16_000))
    assert len(counts) == 16
    assert max(counts.values()) < 1.1 * 1000
    assert min(counts.values()) > 0.9 * 1000


def test_the_search_path_is_replaced_and_every_other_option_kept() -> None:
    settings = pgstore.PgSettings(
        "host=127.0.0.1 dbname=test options='-c statement_timeout=5000 -csearch_path=app'"
    )
    moved = shards.with_schema(settings, "app_shard_003")
    assert shards.dsn_schema(moved.dsn) == "app_shard_003"
    options = psycopg.conninfo.conninfo_to_dict(moved.dsn)["options"]
    assert "statement_timeout=5000" in str(options)
    assert "search_path=app " not in str(options)
    assert shards.shard_schema("public", 3, 16) == "bide_shard_003"
    assert shards.shard_schema("app", 0, 1) == "app"


@pytest.fixture
def writer(pg_dsn: str) -> Iterator[str]:
    name = f"bidep_s_{secrets.token_hex(4)}"
    with contextmanager(role)(pg_dsn, name):
        yield name


def test_init_makes_every_shard_a_fenced_log_with_its_own_lease(pg_dsn: str, writer: str) -> None:
    settings = pgstore.PgSettings(pg_dsn)
    layout, versions = shards.init_sharded(settings, 4, writer=writer)
    assert layout.count == 4
    assert versions == [(None, pgstore.SCHEMA_VERSION)] * 4
    assert shards.layout_of(settings) == layout
    writer_settings = pgstore.PgSettings(psycopg.conninfo.make_conninfo(pg_dsn, user=writer))
    terms = []
    for k in range(4):
        with pgstore.PgLogStore(layout.settings(writer_settings, k)) as store:
            store.require()
            term = store.take_lease(f"node-{k}", 30)
            assert term is not None
            assert term.epoch == 1
            assert store.take_lease("other", 30) is None  # and its own lease
            terms.append(term)
    # The daemons' role coordinates through the catalog but writes no record there.
    with psycopg.connect(writer_settings.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bide_nodes (node, expires_at) VALUES ('a', now() + interval '5 s')"
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE bide_cluster SET value = '8' WHERE key = 'shards'")
    # Rerunning finishes or upgrades; another count is refused, naming the migration.
    again, versions = shards.init_sharded(settings, 4, writer=writer)
    assert again == layout
    assert versions == [(pgstore.SCHEMA_VERSION,) * 2] * 4
    with pytest.raises(SchemaError, match="offline migration"):
        shards.init_sharded(settings, 8)


def test_a_log_made_before_shards_is_one_shard_in_its_own_schema(pg_dsn: str) -> None:
    settings = pgstore.PgSettings(pg_dsn)
    with pgstore.PgLogStore(settings) as store:
        store.init()
    layout = shards.layout_of(settings)
    assert layout.count == 1
    assert layout.settings(settings, 0) == settings
    with pytest.raises(SchemaError, match="unsharded log"):
        shards.init_sharded(settings, 16)


def test_the_command_says_what_it_made(pg_dsn: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "log", "init", "--dsn", pg_dsn, "--shards", "3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "3 shard(s)" in out
    assert "3 created" in out
