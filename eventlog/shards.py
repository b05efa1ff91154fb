"""The log split into shards in PostgreSQL: where each shard lives and which one holds an id.

A sharded log is a fixed number of independent logs, each in its own schema beside the
DSN's (``<base>_shard_007``; ``bide_shard_007`` when the base is ``public``), each with the
tables, functions, lease and epoch of :mod:`eventlog.pgstore`: every fencing rule holds per
shard. The DSN's own schema holds the catalog, which coordinates the nodes and holds no
record of the log:

    bide_cluster    key/value: ``shards`` (the count, fixed at ``bide log init --shards N``),
                    ``layout_version``
    bide_nodes      each live node: its name, heartbeat (``expires_at``, the database's
                    clock), whether it is leaving, how many shards it holds
    bide_intake     requests for a shard taken through a node that does not hold it: written
                    by that node, taken and answered by the shard's holder
    bide_quota      each node's demand on each provider, which the nodes divide the
                    provider's quota by; a row dies with its node's heartbeat

A log made before shards (no ``bide_cluster`` table) is one shard: the DSN's own schema.
The shard of an operation is a stable hash of its id as the agent chose it (a principal's
scoped id, ``ID~uUID``, lives in the same shard as ``ID``), so any node finds it without
asking anyone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from typing import TYPE_CHECKING, Any

from eventlog.errors import SchemaError, StoreError

if TYPE_CHECKING:
    import psycopg

    from eventlog.pgstore import PgSettings

#: The most shards a log may be split into (each is a schema with its own lease row).
MAX_SHARDS = 1024
LAYOUT_VERSION = 1
_SCOPED = re.compile(r"~u\d+$")

CATALOG_TABLES = ("bide_cluster", "bide_nodes", "bide_intake", "bide_quota")
#: What the daemons' role may change in the catalog (the records stay fenced per shard).
CATALOG_WRITABLE = ("bide_nodes", "bide_intake", "bide_quota")

_CATALOG = """
CREATE TABLE IF NOT EXISTS bide_cluster (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS bide_nodes (
    node text PRIMARY KEY CHECK (length(node) <= 256),
    started_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    leaving boolean NOT NULL DEFAULT false,
    held integer NOT NULL DEFAULT 0
);
-- Joining: the node's copies of the shards are still catching up with the database; nobody
-- counts it in the fair share yet (daemon/shards/membership.py).
ALTER TABLE bide_nodes ADD COLUMN IF NOT EXISTS joining boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS bide_intake (
    id bigserial PRIMARY KEY,
    shard integer NOT NULL CHECK (shard >= 0),
    kind text NOT NULL,
    op_id text NOT NULL,
    request bytea NOT NULL,
    from_node text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    answered_at timestamptz,
    status integer,
    answer bytea
);
CREATE INDEX IF NOT EXISTS bide_intake_waiting ON bide_intake (shard, id)
    WHERE answered_at IS NULL;
-- The relay (daemon/shards/relay.py): a row's random id, bound into its sealed request and
-- answer (so a copied row fails authentication), and when the shard's holder took it.
ALTER TABLE bide_intake ADD COLUMN IF NOT EXISTS rid text;
ALTER TABLE bide_intake ADD COLUMN IF NOT EXISTS taken_at timestamptz;
CREATE UNIQUE INDEX IF NOT EXISTS bide_intake_rid ON bide_intake (rid);
CREATE TABLE IF NOT EXISTS bide_quota (
    provider text NOT NULL,
    node text NOT NULL,
    demand double precision NOT NULL DEFAULT 0 CHECK (demand >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (provider, node)
);
"""


def unscoped(op_id: str) -> str:
    """The id as its agent chose it (a scoped id's ``~uUID`` removed)."""
    return _SCOPED.sub("", op_id)


def shard_of(op_id: str, count: int) -> int:
    """The shard that holds ``op_id``: the first 8 bytes of SHA-256 of the unscoped id, modulo
    the count. Stable across processes, versions and hosts (never Python's ``hash``)."""
    if count < 1:
        raise ValueError(f"a log has at least one shard, not {count}")
    if count == 1:
        return 0
    digest = hashlib.sha256(unscoped(op_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def shard_schema(base: str, shard: int, count: int) -> str:
    """The schema of ``shard`` of ``count``; the base schema itself when there is one shard."""
    if not 0 <= shard < count:
        raise ValueError(f"shard {shard} is not one of 0..{count - 1}")
    if count == 1:
        return base
    prefix = "bide" if base == "public" else base
    return f"{prefix}_shard_{shard:03d}"


def _dsn_options(dsn: str) -> str:
    import psycopg

    return str(psycopg.conninfo.conninfo_to_dict(dsn).get("options") or "")


def dsn_schema(dsn: str) -> str | None:
    """The schema a DSN's ``options`` put first on the search path, if any."""
    tokens = shlex.split(_dsn_options(dsn))
    found: str | None = None
    for i, token in enumerate(tokens):
        setting = None
        if token.startswith("-csearch_path="):
            setting = token[len("-c") :]
        elif token == "-c" and i + 1 < len(tokens) and tokens[i + 1].startswith("search_path="):
            setting = tokens[i + 1]
        if setting is not None:
            found = setting.split("=", 1)[1].split(",")[0].strip().strip('"') or None
    return found


def with_schema(settings: PgSettings, schema: str) -> PgSettings:
    """``settings`` reaching ``schema`` (its search path replaced; every other option kept)."""
    import psycopg

    tokens = shlex.split(_dsn_options(settings.dsn))
    kept: list[str] = []
    skip = False
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        if token.startswith("-csearch_path="):
            continue
        if token == "-c" and i + 1 < len(tokens) and tokens[i + 1].startswith("search_path="):
            skip = True
            continue
        kept.append(token)
    kept.append(f"-csearch_path={schema}")
    options = " ".join(shlex.quote(t) for t in kept)
    return dataclasses.replace(
        settings, dsn=psycopg.conninfo.make_conninfo(settings.dsn, options=options)
    )


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a log's shards are: the base schema (the catalog's) and the count."""

    base: str
    count: int

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def schema(self, shard: int) -> str:
        return shard_schema(self.base, shard, self.count)

    def schemas(self) -> list[str]:
        return [self.schema(k) for k in range(self.count)]

    def shard_of(self, op_id: str) -> int:
        return shard_of(op_id, self.count)

    def settings(self, settings: PgSettings, shard: int) -> PgSettings:
        """How to reach ``shard`` (the settings themselves for an unsharded log)."""
        if not self.sharded:
            return settings
        return with_schema(settings, self.schema(shard))


def current_schema(conn: psycopg.Connection[Any]) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT current_schema()")
        row = cur.fetchone()
    if row is None or not row[0]:
        raise SchemaError(
            "the DSN's search_path names no schema that exists: create it, or fix the "
            "search_path in the DSN's options"
        )
    return str(row[0])


def read_layout(conn: psycopg.Connection[Any]) -> Layout:
    """The layout in the connection's schema: its shard count, 1 for a log made before shards
    (or with one shard)."""
    base = current_schema(conn)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('bide_cluster') IS NOT NULL")
        row = cur.fetchone()
        if row is None or not row[0]:
            return Layout(base, 1)
        cur.execute("SELECT value FROM bide_cluster WHERE key = 'shards'")
        got = cur.fetchone()
    if got is None:
        return Layout(base, 1)
    try:
        count = int(got[0])
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_SHARDS:
        raise SchemaError(
            f"bide_cluster says the log has {got[0]!r} shards, not a count bide can use "
            f"(1..{MAX_SHARDS}); it is written only by bide log init"
        )
    return Layout(base, count)


def init_catalog(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    reader: str | None = None,
    writer: str | None = None,
) -> Layout:
    """Create the catalog for ``count`` shards (in the connection's transaction) and grant
    the roles. A different count than the one recorded is refused: changing it is an
    offline migration (deploy/README.md, "Shards")."""
    from psycopg import sql

    if not 1 <= count <= MAX_SHARDS:
        raise SchemaError(f"--shards must be 1..{MAX_SHARDS}, not {count}")
    before = read_layout(conn)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('bide_cluster') IS NOT NULL")
        row = cur.fetchone()
        has_catalog = bool(row and row[0])
        cur.execute("SELECT to_regclass('bide_meta') IS NOT NULL")
        row = cur.fetchone()
        has_log = bool(row and row[0])
    if has_catalog and before.count != count:
        raise SchemaError(
            f"the log already has {before.count} shard(s); changing the count is an offline "
            f"migration (deploy/README.md, 'Shards'), not bide log init --shards {count}"
        )
    if not has_catalog and has_log and count != 1:
        raise SchemaError(
            f"the schema {before.base} already holds an unsharded log; it stays one shard "
            f"(an offline migration moves it: deploy/README.md, 'Shards')"
        )
    with conn.cursor() as cur:
        cur.execute(_CATALOG)
        cur.execute(
            "INSERT INTO bide_cluster (key, value) VALUES ('shards', %s), "
            "('layout_version', %s) ON CONFLICT (key) DO NOTHING",
            (str(count), str(LAYOUT_VERSION)),
        )
        base = sql.Identifier(before.base)
        for role in (reader, writer):
            if role:
                who = sql.Identifier(role)
                cur.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(base, who))
                for t in CATALOG_TABLES:
                    cur.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(t), who))
        if writer:
            who = sql.Identifier(writer)
            for t in CATALOG_WRITABLE:
                cur.execute(
                    sql.SQL("GRANT INSERT, UPDATE, DELETE ON {} TO {}").format(
                        sql.Identifier(t), who
                    )
                )
            cur.execute(sql.SQL("GRANT USAGE ON SEQUENCE bide_intake_id_seq TO {}").format(who))
    return Layout(before.base, count)


def init_sharded(
    settings: PgSettings,
    count: int,
    *,
    reader: str | None = None,
    writer: str | None = None,
) -> tuple[Layout, list[tuple[int | None, int]]]:
    """``bide log init --shards N``: the catalog and every shard's schema, tables and
    functions (:func:`eventlog.pgstore.init_schema` in each), one shard at a time; rerunning
    it finishes what an interrupted run left and upgrades each shard. Returns the layout and
    each shard's (version before, after)."""
    from psycopg import sql

    from eventlog import pgstore

    conn = pgstore.connect(settings)
    try:
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('bide_log_init'))")
            layout = init_catalog(conn, count, reader=reader, writer=writer)
            conn.commit()
        except pgstore.DatabaseError as exc:
            conn.rollback()
            raise StoreError(f"bide log init failed: {pgstore.reason(exc)}") from None
    finally:
        conn.close()
    versions: list[tuple[int | None, int]] = []
    for shard in range(layout.count):
        schema = layout.schema(shard)
        if layout.sharded:
            with pgstore.connect(settings, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
        shard_conn = pgstore.connect(layout.settings(settings, shard))
        try:
            versions.append(pgstore.init_schema(shard_conn, reader=reader, writer=writer))
        finally:
            shard_conn.close()
    return layout, versions


def layout_of(settings: PgSettings) -> Layout:
    """The layout the DSN's schema holds (one shard for a log made before shards)."""
    from eventlog import pgstore

    conn = pgstore.connect(settings, read_only=True)
    try:
        return read_layout(conn)
    finally:
        conn.close()
