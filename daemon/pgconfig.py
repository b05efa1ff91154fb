"""Which PostgreSQL a command or the daemon uses: ``--dsn`` / ``--password-file``, else the
config's ``[postgres]`` (or ``[log] store``), else ``$BIDE_POSTGRES_DSN``.

psycopg is imported only here, when a database is named, so the core install never needs it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.config import Config, load_config
from daemon.errors import UsageError

if TYPE_CHECKING:
    from eventlog.pgstore import PgLogStore, PgSettings
    from eventlog.shards import Layout


def add_dsn_flags(parser: argparse.ArgumentParser, *, what: str = "the log's database") -> None:
    parser.add_argument(
        "--dsn",
        metavar="DSN",
        help=f"{what}: a postgresql:// URL or conninfo, without a password "
        "(default: the config's [postgres] dsn, else $BIDE_POSTGRES_DSN)",
    )
    parser.add_argument(
        "--password-file",
        metavar="FILE",
        help="the database password, in a 0600 file (or use PGPASSFILE)",
    )


def settings_for(args: argparse.Namespace) -> PgSettings:
    """The database a command was pointed at, or a usage error naming the flags."""
    from eventlog.pgstore import PgSettings

    pw = Path(args.password_file) if getattr(args, "password_file", None) else None
    if args.dsn:
        return PgSettings(args.dsn, password_file=pw)
    if getattr(args, "config", None) or os.environ.get("BIDE_CONFIG"):
        settings = config_settings(load_config(args.config))
        if settings is not None:
            return settings if pw is None else PgSettings(settings.dsn, password_file=pw)
    env = os.environ.get("BIDE_POSTGRES_DSN")
    if env:
        return PgSettings(env, password_file=pw)
    raise UsageError(
        "name the database: --dsn DSN, a config with [postgres] dsn (--config), "
        "or $BIDE_POSTGRES_DSN"
    )


def store_for(args: argparse.Namespace, *, read_only: bool = False) -> PgLogStore:
    """The log store a command was pointed at (:func:`settings_for`); its connection opens
    at the first call (``read_only``: a reader's)."""
    from eventlog.pgstore import PgLogStore

    return PgLogStore(settings_for(args), read_only=read_only)


def config_settings(cfg: Config) -> PgSettings | None:
    """The config's database, or None when the log is in files."""
    if cfg.postgres is None:
        return None
    from eventlog.pgstore import PgSettings

    return PgSettings(
        cfg.postgres.dsn,
        password_file=cfg.password_file,
        allow_async_commit=cfg.postgres.allow_async_commit,
        link_timeout=cfg.postgres.lease_seconds,
    )


def add_shard_flag(parser: argparse.ArgumentParser, *, what: str = "the shards to read") -> None:
    """``--shard K|all`` (default all): which shards of a sharded log a command reads."""
    parser.add_argument(
        "--shard",
        metavar="K|all",
        help=f"{what}: one shard's number, or all (default); an unsharded log is shard 0",
    )


def one_shard(text: str | None) -> bool:
    """Whether ``--shard`` names one shard (not absent, not ``all``)."""
    return text is not None and text.strip().lower() != "all"


def chosen_shards(layout: Layout, text: str | None) -> list[int]:
    """The shards ``--shard`` names on ``layout``, or a usage error naming the range: every
    shard for ``all`` or no flag; an unsharded log accepts 0 only."""
    if text is None or not one_shard(text):
        return list(range(layout.count))
    word = text.strip()
    shard = int(word) if word.isdigit() else None
    if shard is not None and shard < layout.count:
        return [shard]
    if not layout.sharded:
        raise UsageError(
            f"--shard {word}: the log in schema {layout.base} is not sharded (one shard): "
            f"only --shard 0 or all"
        )
    raise UsageError(
        f"--shard {word}: the log in schema {layout.base} has {layout.count} shards, "
        f"0..{layout.count - 1} (or all)"
    )


def sharded_node(cfg: Config) -> bool:
    """Whether ``cfg`` is a node of a sharded log: its log in PostgreSQL and its local
    copies in ``STATE/shards/NNN/`` (where a sharded node keeps them; ``STATE/log`` is not
    used), so the readers that default to the local copy read the database instead."""
    return cfg.postgres is not None and (cfg.state_dir / "shards").is_dir()


@contextmanager
def naming_shard(layout: Layout, shard: int) -> Iterator[None]:
    """An error reading one shard of a sharded log names the shard and its schema (a shard
    ``bide log init`` did not finish, a role without USAGE on it)."""
    from eventlog.errors import EventLogError, StoreError

    try:
        yield
    except EventLogError as exc:
        if not layout.sharded:
            raise
        raise StoreError(f"shard {shard} ({layout.schema(shard)}): {exc}") from None
