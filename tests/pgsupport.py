"""A real PostgreSQL for the tests: ``$BIDE_TEST_POSTGRES_DSN`` (default: the local server).

Each test gets its own schema (``search_path`` set in the DSN it is handed), dropped after it.
Where no server answers the tests skip with the reason -- unless ``BIDE_REQUIRE_POSTGRES=1``
(CI), under which that is a failure.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import psycopg

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def base_dsn() -> str:
    return os.environ.get("BIDE_TEST_POSTGRES_DSN") or DEFAULT_DSN


def unavailable(reason: str) -> None:
    if os.environ.get("BIDE_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL is required (BIDE_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"no PostgreSQL for this test: {reason} (set BIDE_TEST_POSTGRES_DSN)")


def schema_dsn() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema; the schema is dropped afterwards."""
    try:
        import psycopg
        from psycopg import sql
    except ImportError:
        unavailable("psycopg is not installed (pip install 'bide[postgres]')")
        raise
    base = base_dsn()
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        unavailable(f"{base} does not answer: {str(exc).strip().splitlines()[0]}")
        raise
    schema = f"bide_t_{secrets.token_hex(6)}"
    with admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        try:
            yield psycopg.conninfo.make_conninfo(base, options=f"-csearch_path={schema}")
        finally:
            drop_schemas(admin, schema)


def drop_schemas(admin: psycopg.Connection[Any], schema: str) -> None:
    """Drop ``schema`` and the shard schemas a sharded log made beside it."""
    from psycopg import sql

    rows = admin.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
        (schema, f"{schema}\\_shard\\_%"),
    ).fetchall()
    for (name,) in rows:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def role(dsn: str, name: str) -> Iterator[str]:
    """A LOGIN role with no privileges (dropped afterwards, with whatever it was granted), and
    ``dsn`` rewritten to log in as it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(base_dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        try:
            yield psycopg.conninfo.make_conninfo(dsn, user=name)
        finally:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
