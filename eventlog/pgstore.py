"""The log in PostgreSQL: the same record lines as the segment files, fenced by a lease epoch.

Needs psycopg 3 (``pip install 'bide[postgres]'``); the core install does not.

Tables (schema version :data:`SCHEMA_VERSION`, created and upgraded only by ``bide log init``):

    bide_meta       key/value: ``schema_version``
    bide_records    seq (primary key), segment, byte_offset, line (the exact stored bytes),
                    hash (the record hash, computed by the database), epoch (the lease epoch it
                    was committed under); append-only: a trigger refuses UPDATE, DELETE and
                    TRUNCATE
    bide_lease      one row: holder, epoch (grows by one per takeover, capped at
                    :data:`EPOCH_CAP`), expires_at (the database's clock, at most
                    :data:`LEASE_CAP_SECONDS` ahead); a trigger holds every role to that
    bide_snapshots  the latest state snapshot (name ``state``): the snapshot file's exact
                    bytes (sealed and tagged, see ``eventlog.snapshot``) and the record seq it
                    was taken at; a node taking the log over starts from it

The database enforces the fencing (version 2). The daemons' role has SELECT and nothing else
on the tables: it writes only through SECURITY DEFINER functions (:data:`NODE_FUNCTIONS`),
owned by the role that ran ``bide log init``, with a fixed search_path. ``bide_take_lease``
takes an expired lease by raising the epoch by one in the same ``UPDATE`` and hands the taker
a secret for the term (:class:`Term`; the row keeps only its hash). ``bide_append`` locks the
lease row ``FOR SHARE`` and refuses a round whose epoch is not the one in force or that does
not bring that term's secret, so a takeover (which must update that row) waits for an append
in flight, every append after it is refused, and the daemons' role alone (which can read the
epoch) cannot write inside another node's term. Renewals, releases and snapshots need the
secret too. It also refuses a line that is not numbered one past the stored head, whose
``prev`` is not the stored hash of the record before it, or that is not at the next place in
the segment layout, and computes each record's hash itself: a node never forks the chain in
the database, and the daemons' role cannot insert a row that breaks it. Committed rounds are
announced with ``NOTIFY bide_records`` for standbys. The owner of the tables (and any
superuser) is not fenced: it can disable the triggers and write anything.

Passwords come from a file (``password_file``) or libpq's own ``PGPASSFILE``; a DSN that holds
one is refused, and no message here ever includes a DSN.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eventlog.errors import DivergedError, EventLogError, FencedError, SchemaError, StoreError
from eventlog.logstore import Head, LeaseState
from eventlog.logstore import Term as Term  # where the term was defined first
from eventlog.store import StoredLine, write_segments

if TYPE_CHECKING:
    from eventlog.pglink import PgLink

_T = TypeVar("_T")


class MissingExtraError(EventLogError, ImportError):
    """psycopg is not installed."""


try:
    import psycopg
    from psycopg import sql
except ImportError as _exc:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(
        "the PostgreSQL store needs psycopg 3, which the core install leaves out: "
        "pip install 'bide[postgres]'"
    ) from _exc

SCHEMA_VERSION = 2
#: Every error psycopg raises (for callers that must not import psycopg themselves).
DatabaseError = psycopg.Error
NOTIFY_CHANNEL = "bide_records"

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS bide_meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS bide_records (
    seq bigint PRIMARY KEY CHECK (seq >= 0),
    segment integer NOT NULL CHECK (segment >= 1),
    byte_offset bigint NOT NULL CHECK (byte_offset >= 0),
    line bytea NOT NULL,
    hash text NOT NULL,
    epoch bigint NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (segment, byte_offset)
);
CREATE TABLE IF NOT EXISTS bide_lease (
    id integer PRIMARY KEY CHECK (id = 1),
    holder text NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 0),
    expires_at timestamptz NOT NULL
);
INSERT INTO bide_lease (id, holder, epoch, expires_at) VALUES (1, '', 0, '-infinity')
    ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS bide_snapshots (
    name text PRIMARY KEY,
    seq bigint NOT NULL,
    data bytea NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION bide_records_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'bide_records is append-only (% refused)', TG_OP;
END $$;
DROP TRIGGER IF EXISTS bide_records_append_only ON bide_records;
CREATE TRIGGER bide_records_append_only BEFORE UPDATE OR DELETE ON bide_records
    FOR EACH ROW EXECUTE FUNCTION bide_records_append_only();
DROP TRIGGER IF EXISTS bide_records_no_truncate ON bide_records;
CREATE TRIGGER bide_records_no_truncate BEFORE TRUNCATE ON bide_records
    FOR EACH STATEMENT EXECUTE FUNCTION bide_records_append_only();
"""

#: ``eventlog.envelope``'s record-hash domain: the database hashes each line as the verifier
#: does (a wrong domain would refuse the second line of every round: the tests would see it).
_RECORD_DOMAIN_HEX = b"bide.record.v1\n".hex()
#: The highest lease epoch: far below bigint's maximum, so that no value can be written that
#: leaves a takeover (which adds one) nowhere to go; 2**53 - 1 also survives a JSON float.
EPOCH_CAP = 2**53 - 1
#: The longest a lease may be taken or renewed for (the config allows up to 3600 s).
LEASE_CAP_SECONDS = 3600

#: Version 2: the database enforces fencing. The daemon's role inserts no record and updates
#: no lease row itself: it calls these SECURITY DEFINER functions (owned by the role that ran
#: ``bide log init``, their search_path fixed by :func:`init_schema`), which check inside the
#: transaction what bide's own statements used to. A trigger holds the lease row to its rules
#: for every role (the owner included, short of disabling it).
_SCHEMA_V2 = f"""
DO $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM bide_lease WHERE epoch > {EPOCH_CAP}) THEN
        RAISE EXCEPTION 'the lease epoch is above % (written by hand?); with every node '
            'stopped, set it one past the last epoch the records were committed under: '
            'UPDATE bide_lease SET epoch = (SELECT coalesce(max(epoch), 0) + 1 FROM '
            'bide_records), then run bide log init again', {EPOCH_CAP};
    END IF;
END $fn$;
ALTER TABLE bide_lease DROP CONSTRAINT IF EXISTS bide_lease_epoch_cap;
ALTER TABLE bide_lease DROP CONSTRAINT IF EXISTS bide_lease_holder_length;
UPDATE bide_lease SET expires_at = now() + interval '{LEASE_CAP_SECONDS} seconds'
    WHERE expires_at > now() + interval '{LEASE_CAP_SECONDS} seconds';
ALTER TABLE bide_lease ADD CONSTRAINT bide_lease_epoch_cap CHECK (epoch <= {EPOCH_CAP}),
    ADD CONSTRAINT bide_lease_holder_length CHECK (length(holder) <= 256);
-- The hash of the secret bide_take_lease gave the node that took the epoch: an append, a
-- renewal, a release or a snapshot must bring the secret itself, so the daemons' role alone
-- (which can read the epoch and the holder) cannot act inside another node's term.
ALTER TABLE bide_lease ADD COLUMN IF NOT EXISTS term_hash text NOT NULL DEFAULT '';

CREATE OR REPLACE FUNCTION bide_term_hash(p_term text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $fn$ SELECT encode(sha256(convert_to(p_term, 'UTF8')), 'hex') $fn$;

CREATE OR REPLACE FUNCTION bide_lease_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION 'bide_lease holds one row, updated only (% refused)', TG_OP;
    END IF;
    IF NEW.id <> OLD.id THEN
        RAISE EXCEPTION 'bide_lease: the row''s id is fixed';
    END IF;
    IF NEW.epoch <> OLD.epoch AND NEW.epoch <> OLD.epoch + 1 THEN
        RAISE EXCEPTION 'bide_lease: the epoch grows by one per takeover (% to % refused)',
            OLD.epoch, NEW.epoch;
    END IF;
    IF NEW.expires_at > now() + interval '{LEASE_CAP_SECONDS} seconds' THEN
        RAISE EXCEPTION 'bide_lease: a lease runs at most {LEASE_CAP_SECONDS} s (until % refused)',
            NEW.expires_at;
    END IF;
    RETURN NEW;
END $fn$;
DROP TRIGGER IF EXISTS bide_lease_guard ON bide_lease;
CREATE TRIGGER bide_lease_guard BEFORE UPDATE OR DELETE ON bide_lease
    FOR EACH ROW EXECUTE FUNCTION bide_lease_guard();
DROP TRIGGER IF EXISTS bide_lease_no_truncate ON bide_lease;
CREATE TRIGGER bide_lease_no_truncate BEFORE TRUNCATE ON bide_lease
    FOR EACH STATEMENT EXECUTE FUNCTION bide_lease_guard();

CREATE OR REPLACE FUNCTION bide_take_lease(p_holder text, p_seconds float8,
        OUT taken_epoch bigint, OUT term text)
    RETURNS SETOF record LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    term := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    UPDATE bide_lease SET holder = p_holder, epoch = epoch + 1, term_hash = bide_term_hash(term),
           expires_at = now() + make_interval(secs => p_seconds)
     WHERE id = 1 AND expires_at <= now() RETURNING epoch INTO taken_epoch;
    IF FOUND THEN
        RETURN NEXT;
    END IF;
END $fn$;

CREATE OR REPLACE FUNCTION bide_renew_lease(p_seconds float8, p_holder text, p_epoch bigint,
        p_term text)
    RETURNS SETOF bigint LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    renewed bigint;
BEGIN
    UPDATE bide_lease SET expires_at = now() + make_interval(secs => p_seconds)
     WHERE id = 1 AND holder = p_holder AND epoch = p_epoch
       AND term_hash = bide_term_hash(p_term) RETURNING epoch INTO renewed;
    IF FOUND THEN
        RETURN NEXT renewed;
    END IF;
END $fn$;

CREATE OR REPLACE FUNCTION bide_release_lease(p_holder text, p_epoch bigint, p_term text)
    RETURNS SETOF bigint LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    released bigint;
BEGIN
    UPDATE bide_lease SET expires_at = now() - interval '1 microsecond'
     WHERE id = 1 AND holder = p_holder AND epoch = p_epoch
       AND term_hash = bide_term_hash(p_term) RETURNING epoch INTO released;
    IF FOUND THEN
        PERFORM pg_notify('{NOTIFY_CHANNEL}', 'lease');
        RETURN NEXT released;
    END IF;
END $fn$;

-- One write round: under the lease epoch in force (the row locked FOR SHARE, so a takeover
-- waits for the round and every round after it sees the new epoch), each line numbered one
-- past the record before it, its "prev" that record's hash, at the next place in the segment
-- layout; the hashes are computed here, never taken from the caller. Refused rounds insert
-- nothing and say why.
CREATE OR REPLACE FUNCTION bide_append(p_epoch bigint, p_term text, p_seqs bigint[],
        p_segments integer[], p_offsets bigint[], p_lines bytea[], OUT lease_epoch bigint,
        OUT in_term boolean, OUT head_seq bigint, OUT head_hash text, OUT refused text)
    LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    n integer := coalesce(cardinality(p_lines), 0);
    head_segment integer;
    head_end bigint;
BEGIN
    SELECT l.epoch, l.epoch = p_epoch AND l.term_hash = bide_term_hash(p_term)
      INTO lease_epoch, in_term FROM bide_lease l WHERE l.id = 1 FOR SHARE;
    in_term := coalesce(in_term, false);
    SELECT r.seq, r.hash, r.segment, r.byte_offset + length(r.line) + 1
      INTO head_seq, head_hash, head_segment, head_end
      FROM bide_records r ORDER BY r.seq DESC LIMIT 1;
    IF NOT in_term THEN
        refused := format('the lease epoch in force is %s; this round is not from the node '
                          'that took epoch %s (or the term''s secret is wrong)', lease_epoch,
                          p_epoch);
        RETURN;
    END IF;
    IF n = 0 OR coalesce(cardinality(p_seqs), 0) <> n OR coalesce(cardinality(p_segments), 0) <> n
       OR coalesce(cardinality(p_offsets), 0) <> n THEN
        refused := 'a round is one or more lines, each with its seq, segment and offset';
        RETURN;
    END IF;
    -- Set-based (one pass over the arrays): each line against the one before it, the first
    -- against the stored head.
    -- A line's head is read by position, not by a regular expression (PostgreSQL's costs
    -- ~100 us a line): the writer's framing puts kind, seq and prev first, in that order.
    WITH given AS (
        SELECT u.i, u.seq, u.segment, u.byte_offset, u.line, h.text_head, h.kind,
               '{{"kind":"' || h.kind || '","seq":' || u.seq || ',"prev":"' AS want_head,
               encode(sha256(decode('{_RECORD_DOMAIN_HEX}', 'hex') || u.line), 'hex') AS hash
          FROM unnest(p_seqs, p_segments, p_offsets, p_lines) WITH ORDINALITY
               AS u(seq, segment, byte_offset, line, i),
               LATERAL (SELECT t.text_head, split_part(t.text_head, '"', 4) AS kind
                          FROM (SELECT encode(substring(u.line FROM 1 FOR 160), 'escape')
                                AS text_head) AS t) AS h),
    linked AS (
        SELECT g.*, coalesce(head_seq + 1, 0) + g.i - 1 AS want_seq,
               coalesce(lag(g.hash) OVER w, head_hash, repeat('0', 64)) AS want_prev,
               coalesce(lag(g.segment) OVER w, head_segment, 0) AS prev_segment,
               coalesce(lag(g.byte_offset + length(g.line) + 1) OVER w, head_end, 0) AS prev_end
          FROM given g WINDOW w AS (ORDER BY g.i)),
    judged AS (
        SELECT l.*, CASE
            WHEN l.seq IS DISTINCT FROM l.want_seq THEN
                format('line %s is record %s, not %s (one past the head)', l.i, l.seq,
                       l.want_seq)
            WHEN l.kind !~ '^[a-z]+$' OR NOT starts_with(l.text_head, l.want_head) THEN
                format('record %s is not a bide record numbered %s', l.want_seq, l.want_seq)
            WHEN substr(l.text_head, length(l.want_head) + 1, 67) <> l.want_prev || '","' THEN
                format('record %s does not link to record %s (its prev is not that '
                       'record''s hash)', l.seq, l.seq - 1)
            WHEN NOT ((l.segment = l.prev_segment AND l.byte_offset = l.prev_end)
                      OR (l.segment = l.prev_segment + 1 AND l.byte_offset = 0)) THEN
                format('record %s is at segment %s offset %s, not where the record before it '
                       'ends', l.seq, l.segment, l.byte_offset)
            END AS why
          FROM linked l),
    bad AS (SELECT j.why FROM judged j WHERE j.why IS NOT NULL ORDER BY j.i LIMIT 1),
    ins AS (
        INSERT INTO bide_records (seq, segment, byte_offset, line, hash, epoch)
        SELECT j.seq, j.segment, j.byte_offset, j.line, j.hash, p_epoch
          FROM judged j WHERE NOT EXISTS (SELECT 1 FROM bad) ORDER BY j.i
        RETURNING 1)
    SELECT (SELECT why FROM bad) INTO refused FROM (SELECT count(*) FROM ins) AS done;
    IF refused IS NULL THEN
        PERFORM pg_notify('{NOTIFY_CHANNEL}', p_seqs[n]::text);
    END IF;
END $fn$;

-- Keep a snapshot: only under the epoch in force, at a record the database holds, over an
-- older one only. Returns whether it was kept.
CREATE OR REPLACE FUNCTION bide_keep_snapshot(p_epoch bigint, p_term text, p_seq bigint,
        p_hash text, p_data bytea) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    kept integer;
BEGIN
    WITH lease AS (SELECT l.epoch, l.term_hash FROM bide_lease l WHERE l.id = 1 FOR SHARE),
         ins AS (INSERT INTO bide_snapshots AS s (name, seq, data)
                 SELECT 'state', p_seq, p_data
                  WHERE (SELECT epoch FROM lease) = p_epoch
                    AND (SELECT term_hash FROM lease) = bide_term_hash(p_term)
                    AND (SELECT r.hash FROM bide_records r WHERE r.seq = p_seq) = p_hash
                 ON CONFLICT (name) DO UPDATE
                     SET seq = excluded.seq, data = excluded.data, written_at = now()
                     WHERE s.seq < excluded.seq
                 RETURNING 1)
    SELECT count(*) INTO kept FROM ins;
    RETURN kept > 0;
END $fn$;
"""

#: Each version's upgrade from the one before (index 0 creates version 1).
_UPGRADES: tuple[str, ...] = (_SCHEMA_V1, _SCHEMA_V2)
#: What the daemon's role may call (and nothing else writes): each runs as the schema's owner.
NODE_FUNCTIONS = (
    "bide_append(bigint, text, bigint[], integer[], bigint[], bytea[])",
    "bide_take_lease(text, float8)",
    "bide_renew_lease(float8, text, bigint, text)",
    "bide_release_lease(text, bigint, text)",
    "bide_keep_snapshot(bigint, text, bigint, text, bytea)",
)
TABLES = ("bide_meta", "bide_records", "bide_lease", "bide_snapshots")


@dataclass(frozen=True)
class PgSettings:
    """How to reach the database. ``dsn`` never holds a password."""

    dsn: str
    password_file: Path | None = None
    allow_async_commit: bool = False  # synchronous_commit=off accepted (acks may be lost)
    connect_timeout: float = 5.0
    #: How long a TCP connection may go unanswered before libpq drops it: sent data left
    #: unacknowledged (``tcp_user_timeout``) or a silent peer (keepalives). Without it a
    #: silently dropped link stalls a commit for the kernel's ~15 minutes; a node sets it to
    #: its lease, so a stalled commit ends about when the node stops sending anyway.
    link_timeout: float = 30.0


def link_options(seconds: float) -> dict[str, Any]:
    """libpq's TCP options that bound a dead link to about ``seconds`` (ignored on a Unix
    socket, where the kernel reports a dead peer at once)."""
    idle = max(1, round(seconds / 3))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": 1,
        "keepalives_count": max(1, round(seconds) - idle),
        "tcp_user_timeout": max(1000, round(seconds * 1000)),
    }


def check_dsn(dsn: str) -> None:
    """Refuse a DSN that is not one, or that holds a password (passwords come from a file)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise StoreError(
            "the PostgreSQL DSN is not valid conninfo or a postgresql:// URL "
            "(its text is not repeated here: it may hold a secret)"
        ) from None
    if params.get("password"):
        raise StoreError(
            "the PostgreSQL DSN holds a password; remove it and put the password "
            "in a file (0600) named by password_file / --password-file, or in "
            "PGPASSFILE"
        )


def read_password(path: Path) -> str:
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"cannot read the database password file {path}: {exc.strerror}") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise StoreError(
            f"the database password file {path} is readable by others "
            f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 {path}"
        )
    return text.strip("\n")


def connect_kwargs(settings: PgSettings, *, read_only: bool = False) -> dict[str, Any]:
    """libpq parameters beyond the DSN: timeouts, the password from its file, read-only."""
    check_dsn(settings.dsn)
    kwargs: dict[str, Any] = {
        "connect_timeout": max(1, round(settings.connect_timeout)),
        "application_name": "bide",
        **link_options(settings.link_timeout),
    }
    if settings.password_file is not None:
        kwargs["password"] = read_password(settings.password_file)
    if read_only:  # added to the DSN's own options (a search_path, say), not replacing them
        given = psycopg.conninfo.conninfo_to_dict(settings.dsn).get("options") or ""
        kwargs["options"] = f"{given} -c default_transaction_read_only=on".strip()
    return kwargs


#: Asked of every connection that writes (records or the lease).
SHOW_SYNCHRONOUS_COMMIT = "SHOW synchronous_commit"


def require_synchronous_commit(value: object, settings: PgSettings) -> None:
    """Refuse a connection whose commits could be acknowledged and then lost: a lost lease
    update could even hand an epoch out twice."""
    if value == "off" and not settings.allow_async_commit:
        raise StoreError(
            "PostgreSQL has synchronous_commit = off for this connection: a commit could be "
            "acknowledged and then lost. Turn it on for the daemon's role (ALTER ROLE ... SET "
            "synchronous_commit = on), or set allow_async_commit = true under [postgres] if "
            "you accept that"
        )


def connect(
    settings: PgSettings, *, read_only: bool = False, autocommit: bool = False
) -> psycopg.Connection[Any]:
    """A connection, checked: ``synchronous_commit`` must not be off unless allowed."""
    kwargs = connect_kwargs(settings, read_only=read_only)
    try:
        conn = psycopg.connect(settings.dsn, autocommit=autocommit, **kwargs)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to PostgreSQL: {reason(exc)}") from None
    try:
        with conn.cursor() as cur:
            cur.execute(SHOW_SYNCHRONOUS_COMMIT)
            row = cur.fetchone()
        if not autocommit:
            conn.rollback()
    except psycopg.Error as exc:
        conn.close()
        raise StoreError(f"PostgreSQL failed: {reason(exc)}") from None
    if not read_only:
        try:
            require_synchronous_commit(row[0] if row else None, settings)
        except StoreError:
            conn.close()
            raise
    return conn


def reason(exc: BaseException) -> str:
    """The server's or libpq's message, first line only (libpq messages name host and port,
    never a password)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- schema --------------------------------------------------------------------------------


def schema_version(conn: psycopg.Connection[Any]) -> int | None:
    """The schema version in the connection's search path; None where there is none."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('bide_meta') IS NOT NULL")
        row = cur.fetchone()
        if row is None or not row[0]:
            return None
        cur.execute("SELECT value FROM bide_meta WHERE key = 'schema_version'")
        got = cur.fetchone()
    return int(got[0]) if got else None


def init_schema(
    conn: psycopg.Connection[Any], *, reader: str | None = None, writer: str | None = None
) -> tuple[int | None, int]:
    """Create or upgrade the schema to :data:`SCHEMA_VERSION` in one transaction; grant
    ``reader`` SELECT and ``writer`` (the daemons' role) SELECT and the node functions.
    Every run also takes back any INSERT, UPDATE, DELETE or TRUNCATE that a role other than
    the owner holds on the tables (what version 1 granted the daemons' role): only the
    functions write. Returns (before, after)."""
    try:
        before = schema_version(conn)
        if before is not None and before > SCHEMA_VERSION:
            raise SchemaError(
                f"the database holds bide schema version {before}, newer than "
                f"this bide knows ({SCHEMA_VERSION}); upgrade bide"
            )
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('bide_log_init'))")
            for script in _UPGRADES[(before or 0) :]:
                cur.execute(script)
            cur.execute(
                "INSERT INTO bide_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
            cur.execute("SELECT current_schema()")
            row = cur.fetchone()
            schema = sql.Identifier(str(row[0]) if row and row[0] else "public")
            _secure_functions(cur, schema)
            _revoke_writes(cur)
            for role in (reader, writer):
                if role:
                    cur.execute(
                        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                            schema, sql.Identifier(role)
                        )
                    )
                    for t in TABLES:
                        cur.execute(
                            sql.SQL("GRANT SELECT ON {} TO {}").format(
                                sql.Identifier(t), sql.Identifier(role)
                            )
                        )
            if writer:
                for fn in NODE_FUNCTIONS:
                    cur.execute(
                        sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                            sql.SQL(fn), sql.Identifier(writer)
                        )
                    )
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        raise StoreError(f"bide log init failed: {reason(exc)}") from None
    return before, SCHEMA_VERSION


def _secure_functions(cur: psycopg.Cursor[Any], schema: sql.Identifier) -> None:
    """The node functions run as their owner with the search path fixed to the schema (and
    pg_temp last), so no object a caller creates is ever picked up by them; nobody may call
    them but the roles granted (PostgreSQL grants EXECUTE to PUBLIC by default)."""
    for fn in NODE_FUNCTIONS:
        cur.execute(
            sql.SQL("ALTER FUNCTION {} SECURITY DEFINER SET search_path = {}, pg_temp").format(
                sql.SQL(fn), schema
            )
        )
        cur.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(sql.SQL(fn)))


#: Every role but the owner (0: PUBLIC) granted anything on a table, or on one of its columns.
_GRANTEES = """
SELECT DISTINCT c.relname::text, CASE WHEN g.grantee = 0 THEN NULL
                                      ELSE pg_get_userbyid(g.grantee)::text END
  FROM pg_class c,
       LATERAL (SELECT (aclexplode(c.relacl)).grantee
                UNION SELECT (aclexplode(a.attacl)).grantee FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL) AS g
 WHERE c.oid = ANY(%s::regclass[]) AND g.grantee <> c.relowner
"""


def _revoke_writes(cur: psycopg.Cursor[Any]) -> None:
    cur.execute(_GRANTEES, (list(TABLES),))
    for table, role in cur.fetchall():
        cur.execute(
            sql.SQL(
                "REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON {} FROM {}"
            ).format(
                sql.Identifier(table), sql.SQL("PUBLIC") if role is None else sql.Identifier(role)
            )
        )


def writer_unfenced(conn: psycopg.Connection[Any], writer: str) -> str | None:
    """Why the database cannot fence ``writer`` (it is a superuser, or it owns the tables or
    is a member of their owner), or None."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT r.rolsuper, pg_has_role(r.oid, c.relowner, 'USAGE'), "
            "pg_get_userbyid(c.relowner) FROM pg_roles r, pg_class c "
            "WHERE r.rolname = %s AND c.oid = 'bide_records'::regclass",
            (writer,),
        )
        row = cur.fetchone()
    conn.rollback()
    if row is None:
        return None
    if row[0]:
        return f"role {writer} is a superuser"
    if row[1]:
        return f"role {writer} owns the bide_ tables (or is a member of their owner, {row[2]})"
    return None


#: Versions whose tables a reader (export, verify, status) reads as this version's: version 2
#: changed who may write, not what is stored.
READABLE_VERSIONS = (1, 2)


def require_schema(conn: psycopg.Connection[Any]) -> None:
    """Refuse a database whose schema this version does not know, naming the fix. On a
    read-only connection an older schema whose tables read the same is accepted."""
    try:
        version = schema_version(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('transaction_read_only')")
            row = cur.fetchone()
        conn.rollback()
    except psycopg.Error as exc:
        raise StoreError(f"PostgreSQL failed: {reason(exc)}") from None
    if version is None:
        raise SchemaError(
            "the database holds no bide schema (no bide_meta table in the "
            "search path); create it with `bide log init --dsn DSN`"
        )
    if version in READABLE_VERSIONS and row is not None and row[0] == "on":
        return
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"the database holds bide schema version {version}; this bide "
            f"needs {SCHEMA_VERSION}: run `bide log init --dsn DSN` to upgrade"
            if version < SCHEMA_VERSION
            else f"the database holds bide schema version {version}, newer than "
            f"this bide knows ({SCHEMA_VERSION}); upgrade bide"
        )


# -- records -------------------------------------------------------------------------------


class PgStore:
    """The :class:`~eventlog.store.LineStore` of one node: appends under its lease term.

    Not thread-safe: the log writer's thread is its only caller. A failure closes the
    connection; the next call opens a new one.
    """

    def __init__(self, settings: PgSettings, term: Term) -> None:
        self.settings = settings
        self.epoch = term.epoch
        self._term = term
        self._conn: psycopg.Connection[Any] | None = None
        #: Rounds refused because another node's epoch was in force.
        self.fenced = 0
        #: Committed rounds (one transaction each).
        self.commits = 0

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def commit(self, lines: Sequence[StoredLine], prev_hash: str) -> None:
        """One statement, on an autocommit connection: the lease row is locked ``FOR SHARE``
        only while the server runs it, never while it waits on this node (a node paused
        mid-transaction would otherwise hold off every takeover until its connection died),
        and the whole round costs one round trip."""
        if not lines:
            return
        conn = self._connection()
        first = lines[0].seq
        try:
            row = conn.execute(
                APPEND_ROUND,
                {
                    "epoch": self.epoch,
                    "term": self._term.secret,
                    "seqs": [ln.seq for ln in lines],
                    "segments": [ln.segment for ln in lines],
                    "offsets": [ln.offset for ln in lines],
                    "lines": [ln.data for ln in lines],
                },
            ).fetchone()
        except psycopg.errors.UniqueViolation:
            self.close()
            raise DivergedError(
                f"append refused: the database already holds record {first} (a commit whose "
                f"outcome was lost?); this node's copy of the log is not the database's "
                f"(re-sync it)"
            ) from None
        except psycopg.Error as exc:
            self.close()  # the outcome of a commit cut off is unknown: the caller re-reads
            raise StoreError(f"appending to PostgreSQL failed: {reason(exc)}") from None
        assert row is not None
        epoch, in_term, head_seq, head_hash, refused = row
        if not in_term:
            self.fenced += 1
            why = (
                f"the log's lease epoch is {epoch}, not this node's {self.epoch} (another "
                f"node took over)"
                if epoch != self.epoch
                else f"the database does not know this node's secret for epoch {epoch}"
            )
            raise FencedError(
                f"append refused: {why}; this node stops sending and falls back to standby"
            )
        if refused is not None:
            why = _divergence(first, prev_hash, head_seq, head_hash, refused)
            raise DivergedError(
                f"append refused: {why}; this node's copy of the log is not "
                f"the database's (re-sync it)"
            )
        self.commits += 1

    def save_snapshot(self, seq: int, record_hash: str, data: bytes) -> bool:
        """Kept only under this node's epoch, at a record the database holds, and over an
        older snapshot only; one statement (the lease row is not locked while the bytes
        travel), on a connection of its own (the writer's is not thread-safe)."""
        try:
            with connect(self.settings, autocommit=True) as conn:
                row = conn.execute(
                    KEEP_SNAPSHOT,
                    {
                        "seq": seq,
                        "hash": record_hash,
                        "data": data,
                        "epoch": self.epoch,
                        "term": self._term.secret,
                    },
                ).fetchone()
        except psycopg.Error as exc:
            raise StoreError(f"keeping the snapshot in PostgreSQL failed: {reason(exc)}") from None
        except StoreError as exc:
            raise StoreError(f"keeping the snapshot in PostgreSQL failed: {exc}") from None
        return bool(row and row[0])

    def load_snapshot(self) -> bytes | None:
        try:
            with connect(self.settings, read_only=True) as conn:
                row = conn.execute(
                    "SELECT data FROM bide_snapshots WHERE name = 'state'"
                ).fetchone()
        except psycopg.Error as exc:
            raise StoreError(
                f"reading the snapshot from PostgreSQL failed: {reason(exc)}"
            ) from None
        return None if row is None else bytes(row[0])

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        conn = self._connection()
        try:
            return lines_after(conn, seq, limit)
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"reading PostgreSQL failed: {reason(exc)}") from None

    def head(self) -> Head | None:
        conn = self._connection()
        try:
            return head(conn)
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"reading PostgreSQL failed: {reason(exc)}") from None


#: A write round: ``bide_append`` (see :data:`_SCHEMA_V2`) checks the epoch, the numbering,
#: the ``prev`` links and the places, inserts, and announces the round. Returns the epoch in
#: force, the stored head (seq, hash) before the round, and why it was refused (NULL: stored).
APPEND_ROUND = (
    "SELECT lease_epoch, in_term, head_seq, head_hash, refused FROM bide_append("
    "%(epoch)s, %(term)s, %(seqs)b::bigint[], %(segments)b::integer[], "
    "%(offsets)b::bigint[], %(lines)b::bytea[])"
)

#: Keep a snapshot (``bide_keep_snapshot``): only under the epoch in force, at a record the
#: database holds, over an older one only. Returns whether it was kept.
KEEP_SNAPSHOT = "SELECT bide_keep_snapshot(%(epoch)s, %(term)s, %(seq)s, %(hash)s, %(data)s)"


def _divergence(
    first: int, prev_hash: str, head_seq: int | None, head_hash: str | None, refused: str
) -> str:
    """Why a round was refused, in the node's terms where they apply."""
    if head_seq is not None and first <= head_seq:
        return f"the database already holds record {first} (a commit whose outcome was lost?)"
    if first > (-1 if head_seq is None else head_seq) + 1:
        return f"record {first - 1} in the database is missing"
    if first > 0 and head_hash != prev_hash:
        return f"record {first - 1} in the database is another record"
    return f"the database refused the round: {refused}"


def stored_snapshot(conn: psycopg.Connection[Any]) -> bytes | None:
    """The snapshot :meth:`PgStore.save_snapshot` kept last, None when there is none."""
    with conn.cursor() as cur:
        cur.execute("SELECT data FROM bide_snapshots WHERE name = 'state'")
        row = cur.fetchone()
    if not conn.autocommit:
        conn.rollback()
    return None if row is None else bytes(row[0])


#: Up to a limit of lines after a sequence number, in order. Parameters: seq, limit.
LINES_AFTER = (
    "SELECT seq, segment, byte_offset, line FROM bide_records WHERE seq > %s ORDER BY seq LIMIT %s"
)


def stored_lines(rows: Sequence[tuple[Any, ...]]) -> list[StoredLine]:
    return [StoredLine(int(s), int(g), int(o), bytes(d)) for s, g, o, d in rows]


def lines_after(conn: psycopg.Connection[Any], seq: int, limit: int) -> list[StoredLine]:
    with conn.cursor(binary=True) as cur:
        cur.execute(LINES_AFTER, (seq, limit))
        rows = cur.fetchall()
    if not conn.autocommit:
        conn.rollback()
    return stored_lines(rows)


def iter_all(
    conn: psycopg.Connection[Any], *, after: int = -1, batch: int = 10_000
) -> Iterator[StoredLine]:
    """Every line after ``after``, in order, read in batches."""
    while True:
        try:
            got = lines_after(conn, after, batch)
        except psycopg.Error as exc:
            raise StoreError(f"reading PostgreSQL failed: {reason(exc)}") from None
        yield from got
        if len(got) < batch:
            return
        after = got[-1].seq


def epoch_changes(conn: psycopg.Connection[Any]) -> list[tuple[int, int]]:
    """(seq, epoch) of every record whose lease epoch differs from the record's before it
    (the first record included): where each term's records begin."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT seq, epoch FROM (SELECT seq, epoch, lag(epoch) OVER (ORDER BY seq) "
            "AS before FROM bide_records) AS t WHERE before IS DISTINCT FROM epoch "
            "ORDER BY seq"
        )
        rows = cur.fetchall()
    if not conn.autocommit:
        conn.rollback()
    return [(int(s), int(e)) for s, e in rows]


#: The last record's seq and hash (no row: an empty log).
STORED_HEAD = "SELECT seq, hash FROM bide_records ORDER BY seq DESC LIMIT 1"


def head(conn: psycopg.Connection[Any]) -> tuple[int, str] | None:
    with conn.cursor() as cur:
        cur.execute(STORED_HEAD)
        row = cur.fetchone()
    if not conn.autocommit:
        conn.rollback()
    return None if row is None else (int(row[0]), str(row[1]))


def import_lines(
    conn: psycopg.Connection[Any], lines: Iterator[StoredLine], batch: int = 5_000
) -> int:
    """Copy a file log's lines into an empty database log, in one transaction (epoch 0)."""
    count = 0
    try:
        with conn.cursor() as cur:
            cur.execute("LOCK TABLE bide_records IN EXCLUSIVE MODE")
            cur.execute("SELECT count(*) FROM bide_records")
            row = cur.fetchone()
            if row is not None and row[0]:
                conn.rollback()
                raise StoreError(
                    f"the database log already holds {row[0]} records; import "
                    f"goes only into an empty one (`bide log init` on a new "
                    f"schema)"
                )
            cur.execute("SELECT holder, expires_at > now() FROM bide_lease WHERE id = 1")
            lease = cur.fetchone()
            if lease is not None and lease[1]:
                conn.rollback()
                raise StoreError(
                    "a daemon holds the database log's lease; stop it before importing"
                )
            pending: list[tuple[int, int, int, bytes, str, int]] = []
            for ln in lines:
                pending.append((ln.seq, ln.segment, ln.offset, ln.data, ln.hash, 0))
                if len(pending) >= batch:
                    _insert(cur, pending)
                    count += len(pending)
                    pending = []
            if pending:
                _insert(cur, pending)
                count += len(pending)
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        raise StoreError(f"importing into PostgreSQL failed: {reason(exc)}") from None
    return count


def _insert(cur: psycopg.Cursor[Any], rows: list[tuple[int, int, int, bytes, str, int]]) -> None:
    with cur.copy(
        "COPY bide_records (seq, segment, byte_offset, line, hash, epoch) FROM STDIN"
    ) as copy:
        for r in rows:
            copy.write_row(r)


# -- the lease -----------------------------------------------------------------------------


#: The lease row: holder, epoch, seconds until expiry by the database's clock (negative:
#: expired).
LeaseRow = LeaseState


def lease_row(conn: psycopg.Connection[Any]) -> LeaseRow:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT holder, epoch, CASE WHEN isfinite(expires_at) THEN "
            "EXTRACT(EPOCH FROM (expires_at - now()))::float8 END "
            "FROM bide_lease WHERE id = 1"
        )
        row = cur.fetchone()
    if not conn.autocommit:
        conn.rollback()
    if row is None:
        raise SchemaError("bide_lease has no row; run `bide log init --dsn DSN`")
    remaining = float(row[2]) if row[2] is not None else float("-inf")
    return LeaseRow(str(row[0]), int(row[1]), remaining)


#: Take an expired (or handed-over) lease, raising the epoch by one in the same statement;
#: returns the new epoch and the term's secret, or no row while another node holds it.
#: Parameters: holder, seconds.
TAKE_LEASE = "SELECT taken_epoch, term FROM bide_take_lease(%s, %s)"
#: Extend our own lease; no row when it is no longer ours. Parameters: seconds, holder, epoch,
#: the term's secret.
RENEW_LEASE = "SELECT * FROM bide_renew_lease(%s, %s, %s, %s)"
#: Hand the lease over at once (graceful stop): expire it now and wake the standbys; the
#: epoch stays, the next taker raises it. Parameters: holder, epoch, the term's secret.
RELEASE_LEASE = "SELECT * FROM bide_release_lease(%s, %s, %s)"


def _returned(
    conn: psycopg.Connection[Any], statement: str, params: tuple[object, ...]
) -> int | None:
    with conn.cursor() as cur:
        cur.execute(statement, params)
        row = cur.fetchone()
    conn.commit()
    return None if row is None else int(row[0])


def take_lease(conn: psycopg.Connection[Any], holder: str, seconds: float) -> Term | None:
    """:data:`TAKE_LEASE` on a plain connection (tools and tests; the daemon's
    :class:`daemon.lease.Lease` runs the same statements on its pool)."""
    with conn.cursor() as cur:
        cur.execute(TAKE_LEASE, (holder, seconds))
        row = cur.fetchone()
    conn.commit()
    return None if row is None else Term(int(row[0]), str(row[1]))


def renew_lease(conn: psycopg.Connection[Any], holder: str, term: Term, seconds: float) -> bool:
    return _returned(conn, RENEW_LEASE, (seconds, holder, term.epoch, term.secret)) is not None


def release_lease(conn: psycopg.Connection[Any], holder: str, term: Term) -> bool:
    return _returned(conn, RELEASE_LEASE, (holder, term.epoch, term.secret)) is not None


def env_dsn() -> str | None:
    """``$BIDE_POSTGRES_DSN``, for commands given no --dsn."""
    return os.environ.get("BIDE_POSTGRES_DSN") or None


# -- the whole store interface ---------------------------------------------------------------


class PgLogStore:
    """The log in PostgreSQL as an :class:`~eventlog.logstore.LogStore`: one connection,
    opened at the first call (``read_only``: a reader's, as export, verify and status use),
    closed by :meth:`close` or the ``with`` block. Writers get :class:`PgStore` (one per
    term), a standby its :class:`~eventlog.pglink.PgLink`."""

    kind = "postgresql"

    def __init__(self, settings: PgSettings, *, read_only: bool = False) -> None:
        self.settings = settings
        self.read_only = read_only
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> PgLogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings, read_only=self.read_only)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _read(self, query: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        try:
            return query(self._connection())
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"reading PostgreSQL failed: {reason(exc)}") from None

    # -- schema --
    def version(self) -> int | None:
        return self._read(schema_version)

    def init(
        self, *, reader: str | None = None, writer: str | None = None
    ) -> tuple[int | None, int]:
        return init_schema(self._connection(), reader=reader, writer=writer)

    def unfenced(self, role: str) -> str | None:
        """Why the database cannot fence ``role`` (:func:`writer_unfenced`), or None."""
        return self._read(lambda conn: writer_unfenced(conn, role))

    def require(self) -> None:
        require_schema(self._connection())

    # -- records --
    def head(self) -> Head | None:
        return self._read(head)

    def lines_after(self, seq: int, limit: int = 10_000) -> list[StoredLine]:
        return self._read(lambda conn: lines_after(conn, seq, limit))

    def iter_lines(self, after: int = -1) -> Iterator[StoredLine]:
        return iter_all(self._connection(), after=after)

    def epoch_changes(self) -> list[tuple[int, int]]:
        return self._read(epoch_changes)

    # -- fencing --
    def lease(self) -> LeaseState:
        return self._read(lease_row)

    def take_lease(self, holder: str, seconds: float) -> Term | None:
        return self._read(lambda conn: take_lease(conn, holder, seconds))

    def renew_lease(self, holder: str, term: Term, seconds: float) -> bool:
        return self._read(lambda conn: renew_lease(conn, holder, term, seconds))

    def release_lease(self, holder: str, term: Term) -> bool:
        return self._read(lambda conn: release_lease(conn, holder, term))

    def writer(self, term: Term) -> PgStore:
        return PgStore(self.settings, term)

    # -- snapshots --
    def load_snapshot(self) -> bytes | None:
        return self._read(stored_snapshot)

    # -- export and import --
    def export(self, out_dir: Path) -> int:
        return write_segments(self.iter_lines(), out_dir)

    def import_lines(self, lines: Iterator[StoredLine]) -> int:
        """Copy a file log's lines into this empty log (:func:`import_lines`)."""
        return import_lines(self._connection(), lines)

    def following(self) -> PgLink:
        from eventlog.pglink import PgLink

        return PgLink(self.settings)
