"""The daemon's config file (TOML) and where every other path is derived from.

Lookup order: ``--config FILE``, then ``$BIDE_CONFIG``, then ``/etc/bide/bide.toml``.
Relative paths in the file are relative to the file's own directory, so a config written
next to its state (``bide demo --keep DIR``) works from any working directory.

Every key, its type, default, limits and meaning: ``deploy/CONFIG.md``, generated from the
structs below by :mod:`daemon.config_reference` (add a key's meaning there); a working
example: ``deploy/bide.toml``. A minimal config::

    [paths]
    state_dir = "/var/lib/bide"           # log/, spool/, outbox/ live here
    keys_dir = "/etc/bide/keys"           # omit under systemd: $CREDENTIALS_DIRECTORY
    profiles_dir = "/etc/bide/profiles"   # one TOML provider profile per file

Errors name the file, the key's own line and the nearest valid key (:func:`read_config`
collects every problem; ``bide run --check`` reports them all).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec

from daemon.errors import ConfigError, UsageError
from daemon.logfmt import LogLevel
from daemon.tomllines import (
    KeyPath,
    dotted,
    fields_at,
    key_lines,
    line_of,
    msgspec_place,
    type_at,
    type_in_words,
)

DEFAULT_CONFIG = Path("/etc/bide/bide.toml")


class PathsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    state_dir: str
    keys_dir: str | None = None
    profiles_dir: str | None = None
    credentials_dir: str | None = None


class LogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    segment_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 64 * 1024 * 1024
    checkpoint_every: Annotated[int, msgspec.Meta(ge=1)] = 1000
    checkpoint_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    snapshot_every: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    forward_secure: bool = True  # new logs: epoch keys certified from the root (format 3)
    epoch_seconds: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # a new epoch key this often
    epoch_checkpoints: Annotated[int, msgspec.Meta(ge=0)] = 0  # or every N checkpoints (0 off)
    store: str = "files"  # "files", or a postgresql:// DSN (the [postgres] table says more)
    level: LogLevel = "info"  # the daemon's log lines at or above: debug, info, warning, error


class PostgresConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The log in PostgreSQL (``daemon.pgconfig``); a password only from ``password_file``."""

    dsn: str = ""
    password_file: str | None = None
    allow_async_commit: bool = False  # accept synchronous_commit = off (acks may be lost)
    lease_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    renew_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 3.0
    request_margin_seconds: Annotated[float, msgspec.Meta(ge=0, le=600)] = 1.0
    #: A standby wakes on every committed round and handover (NOTIFY); this poll is the floor,
    #: and what finds a lease that expired without a handover (its holder killed).
    standby_poll_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.5
    node: str = ""  # default: the host name


class WitnessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where every signed checkpoint head is published (see ``daemon/witness``)."""

    file: str = ""  # an append-only file, e.g. on a mount of another host
    syslog: bool = False  # one line per head to syslog/journald
    urls: list[str] = msgspec.field(default_factory=list)  # `bide witness serve` endpoints
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=300)] = 5.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=20)] = 3  # quick retries per attempt
    retry_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0  # then retry this often
    ca_file: str = ""  # PEM roots for https witnesses (a private CA); default: certifi's
    #: The secret `bide witness serve` knows this log's publisher by (0600; required for urls).
    token_file: str = ""
    #: Pinned witness public keys (base64, as `bide witness serve` prints them): a head a
    #: witness returns must carry a countersignature by one of them to be believed.
    witness_keys: list[str] = msgspec.field(default_factory=list)


class SpoolConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    agents_group: str = ""  # group that may write registrations (spool/incoming)
    approvers_group: str = ""  # group that may write decisions (spool/decisions)
    allow_root_approval: bool = False  # with approvers_group: may root's files approve?
    require_escalation_number: bool = True  # a decision names the escalation it answers
    receipt_retention_seconds: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    rejected_max_files: Annotated[int, msgspec.Meta(ge=1)] = 1000  # refused files kept
    receipt_max_files: Annotated[int, msgspec.Meta(ge=1)] = 10_000  # per receipts directory


#: The patterns of bide.toml's strings, and what they ask for in words.
LISTEN_PATTERN = r"^$|^[^\s:]+:\d{1,5}$"
MODE_PATTERN = r"^0?[0-7]{3}$"
PATTERN_WORDS = {
    LISTEN_PATTERN: 'HOST:PORT, e.g. "127.0.0.1:9464" (or "" for off)',
    MODE_PATTERN: 'a file mode in octal, e.g. "0660"',
}


class MetricsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    listen: Annotated[str, msgspec.Meta(pattern=LISTEN_PATTERN)] = ""  # "" is off


class ApiConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The local API (HTTP/1.1 + JSON over a Unix socket); see ``daemon/api``."""

    enabled: bool = True
    socket: str = ""  # default: $RUNTIME_DIRECTORY/api.sock under systemd, else state_dir
    socket_mode: Annotated[str, msgspec.Meta(pattern=MODE_PATTERN)] = "0660"
    socket_group: str = "bide-agents"  # "" keeps the daemon's own group
    agents_group: str | None = None  # default: [spool] agents_group; "" admits everyone
    approvers_group: str | None = None  # default: [spool] approvers_group; "" admits everyone
    operators_group: str = ""  # besides root and the daemon's own user
    #: The user the daemon runs as: the CLI talks only to a socket answered by this user (or
    #: root, as systemd is while it holds the socket); "" trusts the socket file's owner.
    daemon_user: str = ""
    allow_self_approval: bool = False  # may an approver answer their own operation's escalation
    max_live_per_principal: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    registrations_per_second: Annotated[float, msgspec.Meta(gt=0)] = 50.0
    registrations_burst: Annotated[int, msgspec.Meta(ge=1)] = 100
    max_wait_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 60.0
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 2048
    max_connections_per_user: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0
    closed_stories: Annotated[int, msgspec.Meta(ge=0)] = 10_000  # ended operations' stories kept
    story_events_kept: Annotated[int, msgspec.Meta(ge=16)] = 64  # per operation, in memory


class FetchConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Fetching results (``bide fetch``, ``POST /v1/operations/{id}/fetch``): how often one
    principal may ask, and how much of ``state_dir/results`` is kept."""

    per_principal_per_minute: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    burst: Annotated[int, msgspec.Meta(ge=1)] = 10
    results_max_age_seconds: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    results_max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 * 1024**3


class RetentionConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Ended operations leaving the daemon's memory and its snapshot (replay.retention);
    the log keeps every event, and ``bide story OP --offline`` reads a retired one's."""

    ended_after: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0  # seconds kept after ending
    max_ended: Annotated[int, msgspec.Meta(ge=0)] = 10_000  # ended operations kept at most
    max_tombstones: Annotated[int, msgspec.Meta(ge=0)] = 100_000  # retired ids answered
    check_seconds: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 60.0  # between passes


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    drain_seconds: Annotated[float, msgspec.Meta(ge=0, le=300)] = 5.0


class ConfigFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    paths: PathsConfig
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    spool: SpoolConfig = msgspec.field(default_factory=SpoolConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    api: ApiConfig = msgspec.field(default_factory=ApiConfig)
    fetch: FetchConfig = msgspec.field(default_factory=FetchConfig)
    retention: RetentionConfig = msgspec.field(default_factory=RetentionConfig)
    witness: WitnessConfig = msgspec.field(default_factory=WitnessConfig)
    postgres: PostgresConfig | None = None


class Config:
    """A loaded config with every path resolved."""

    def __init__(
        self, path: Path, raw: ConfigFile, lines: dict[KeyPath, int] | None = None
    ) -> None:
        self.path = path
        self.raw = raw
        self.lines = lines or {}
        base = path.parent
        self.state_dir = (base / raw.paths.state_dir).resolve()
        self.keys_dir = (base / raw.paths.keys_dir).resolve() if raw.paths.keys_dir else None
        self.profiles_dir = (
            (base / raw.paths.profiles_dir).resolve() if raw.paths.profiles_dir else None
        )
        self.credentials_dir = (
            (base / raw.paths.credentials_dir).resolve() if raw.paths.credentials_dir else None
        )
        self.log = raw.log
        self.spool = raw.spool
        self.metrics = raw.metrics
        self.daemon = raw.daemon
        self.api = raw.api
        self.fetch = raw.fetch
        self.retention = raw.retention
        self.witness = raw.witness
        self.witness_file = (base / raw.witness.file).resolve() if raw.witness.file else None
        self.witness_ca = (base / raw.witness.ca_file).resolve() if raw.witness.ca_file else None
        self.witness_token = (
            (base / raw.witness.token_file).resolve() if raw.witness.token_file else None
        )
        self.api_socket = (base / raw.api.socket).resolve() if raw.api.socket else None
        self.postgres = _postgres(self)
        self.password_file = (
            (base / self.postgres.password_file).resolve()
            if self.postgres is not None and self.postgres.password_file
            else None
        )

    def where(self, *keys: str | int) -> str:
        """``FILE:LINE`` of ``keys`` in the file (or of the nearest enclosing key written)."""
        line = line_of(self.lines, keys)
        return f"{self.path}:{line}" if line else str(self.path)

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def snapshot_path(self) -> Path:
        """The encrypted state snapshot: a restart folds only the events after it."""
        return self.state_dir / "snapshot"

    @property
    def spool_dir(self) -> Path:
        return self.state_dir / "spool"

    @property
    def outbox_dir(self) -> Path:
        return self.state_dir / "outbox"

    @property
    def socket_path(self) -> Path:
        """Where the API listens: ``[api] socket``, else ``$RUNTIME_DIRECTORY/api.sock``
        under systemd, else ``<state_dir>/api.sock``."""
        if self.api_socket is not None:
            return self.api_socket
        runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        if runtime:
            return Path(runtime) / "api.sock"
        return self.state_dir / "api.sock"

    @property
    def verify_key_path(self) -> Path:
        if self.keys_dir is not None:
            return self.keys_dir / "verify.pub"
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        if creds:
            return Path(creds) / "verify.pub"
        raise ConfigError(
            f"{self.path}: no [paths] keys_dir and no $CREDENTIALS_DIRECTORY; set keys_dir to "
            f"the directory `bide keygen` wrote"
        )


def _postgres(cfg: Config) -> PostgresConfig | None:
    """The PostgreSQL store's settings, or None for the file store; the DSN from ``[log]
    store`` or ``[postgres] dsn`` (both: they must agree)."""
    store, pg = cfg.raw.log.store, cfg.raw.postgres
    in_log = store.startswith(("postgresql://", "postgres://"))
    if store != "files" and not in_log:
        raise ConfigError(
            f'{cfg.where("log", "store")}: log.store: "{store.split(":")[0]}:..." is neither '
            f'"files" nor a postgresql:// DSN'
        )
    if pg is None:
        return PostgresConfig(dsn=store) if in_log else None
    if in_log and pg.dsn and pg.dsn != store:
        raise ConfigError(
            f"{cfg.where('postgres', 'dsn')}: postgres.dsn: [log] store and [postgres] dsn "
            f"name two databases; keep one of them"
        )
    if not (in_log or pg.dsn):
        raise ConfigError(
            f"{cfg.where('postgres')}: postgres: a [postgres] table without a dsn; set dsn "
            f'there (or [log] store = "postgresql://...")'
        )
    if pg.renew_seconds >= pg.lease_seconds:
        raise ConfigError(
            f"{cfg.where('postgres', 'renew_seconds')}: postgres.renew_seconds: "
            f"{pg.renew_seconds:g} must be shorter than lease_seconds ({pg.lease_seconds:g})"
        )
    return msgspec.structs.replace(pg, dsn=pg.dsn or store)


def config_path(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("BIDE_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG


class Problem(msgspec.Struct, frozen=True):
    """One mistake in bide.toml or a profile: the file, the line of the key itself (0 where
    none is written), the key (dotted, ``log.checkpoint_every``), what is wrong, the fix."""

    file: str
    line: int
    key: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.key}:" if self.key else ""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{where}:{key} {self.message}{fix}"


class Loaded(msgspec.Struct, frozen=True):
    """What reading a config found: the config (built from what was valid, every faulty key
    left at its default) unless a required key is missing, and every problem."""

    config: Config | None
    problems: list[Problem]


def read_config(path: Path) -> Loaded:
    """Read and validate ``path``, naming every problem rather than the first; the file must
    exist and be readable (:func:`load_config` says so as a usage error)."""
    path = path.resolve()
    text = path.read_bytes().decode("utf-8", errors="replace")
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r" \(at line (\d+), column \d+\)", str(exc))
        what = str(exc)[: m.start()] if m else str(exc)
        line = int(m.group(1)) if m else 0
        return Loaded(None, [Problem(str(path), line, "", f"not valid TOML: {what}")])
    lines = key_lines(text)
    problems: list[Problem] = []
    filled: set[KeyPath] = set()  # tables put in for a missing one: their keys are missing too
    cfg: Config | None = None
    for _ in range(_MAX_PROBLEMS):
        try:
            raw = msgspec.convert(table, ConfigFile)
        except msgspec.ValidationError as exc:
            keys, problem = _explain(path, lines, table, str(exc))
            missing = problem.message.startswith("missing")
            if not (missing and keys[:-1] in filled):
                problems.append(problem)
            if missing and _fill(table, keys):
                filled.add(keys)
            elif missing or not _drop(table, keys):
                break
            continue
        try:
            cfg = Config(path, raw, lines)
        except ConfigError as exc:
            problems.append(problem_of(str(exc), path))
        break
    problems.sort(key=lambda p: p.line or _MAX_LINE)
    return Loaded(None if filled else cfg, problems)


_MAX_PROBLEMS = 100
_MAX_LINE = 1 << 30
_PROBLEM_TEXT = re.compile(r"^(?::(?P<line>\d+))?: (?:(?P<key>[\w.\[\]\"/~-]+): )?")


def problem_of(message: str, file: Path | str) -> Problem:
    """A ``FILE:LINE: key: what; fix`` message about ``file`` (bide.toml's, a profile's) as a
    :class:`Problem`; a message in another form is its message whole."""
    m = _PROBLEM_TEXT.match(message[len(str(file)) :]) if message.startswith(str(file)) else None
    if not m:
        return Problem(str(file), 0, "", message)
    rest = message[len(str(file)) + m.end() :]
    what, _, fix = rest.partition("; did you mean ")
    return Problem(
        str(file),
        int(m.group("line") or 0),
        m.group("key") or "",
        what,
        f"did you mean {fix}" if fix else "",
    )


def _explain(
    path: Path, lines: dict[KeyPath, int], table: dict[str, Any], message: str
) -> tuple[KeyPath, Problem]:
    """msgspec's message about bide.toml as the key's own line, words and the fix."""
    keys, detail = msgspec_place(message)
    fix = ""
    if found := re.match(r"Object contains unknown field `([^`]+)`", detail):
        keys = (*keys, found.group(1))
        what = "unknown section" if len(keys) == 1 else "unknown key"
        detail, fix = what, _did_you_mean(found.group(1), _fields_at(keys[:-1]))
    elif found := re.match(r"Object missing required field `([^`]+)`", detail):
        keys = (*keys, found.group(1))
        detail = "missing: this " + ("key" if len(keys) > 1 else "section") + " is required"
        fix = f"add it under [{dotted(keys[:-1])}]" if len(keys) > 1 else f"add a [{keys[0]}] table"
    elif found := re.match(r"Invalid enum value (.+)", detail):
        value = found.group(1)
        detail = f"{value} is not valid"
        fix = _did_you_mean(value.strip("'\""), _literal_at(keys))
    elif found := re.match(r"Expected `str` matching regex (['\"])(.+)\1$", detail):
        words = PATTERN_WORDS.get(found.group(2).replace("\\\\", "\\"), "")
        detail = f"must be {words}" if words else detail
        detail += f", got {_shown(table, keys)}"
    elif said := type_in_words(detail, _shown(table, keys)):
        detail = said
    if not fix and (default := _default_at(keys)):
        fix = f"or remove it for the default, {default}"
    line = line_of(lines, keys)
    return keys, Problem(str(path), line, dotted(keys), detail, fix)


def _default_at(keys: KeyPath) -> str:
    """The default of the key at ``keys``, as TOML would write it ("" when it has none)."""
    tp = _type_at(keys[:-1])
    if not keys or not isinstance(tp, type) or not issubclass(tp, msgspec.Struct):
        return ""
    for f in msgspec.structs.fields(tp):
        if f.name == keys[-1] and f.default is not msgspec.NODEFAULT and f.default is not None:
            if isinstance(f.default, bool):
                return str(f.default).lower()
            return msgspec.json.encode(f.default).decode()
    return ""


def _did_you_mean(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"one of {', '.join(choices)}" if choices else ""


def _shown(table: dict[str, Any], keys: KeyPath) -> str:
    value: Any = table
    for key in keys:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return "?"
    text = msgspec.json.encode(value).decode() if not isinstance(value, bool) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_at(keys: KeyPath) -> object:
    """The declared type at ``keys`` in bide.toml (None where none is declared)."""
    return type_at(ConfigFile, keys)


def _fields_at(keys: KeyPath) -> tuple[str, ...]:
    return fields_at(ConfigFile, keys)


def _literal_at(keys: KeyPath) -> tuple[str, ...]:
    tp = _type_at(keys)
    return tuple(str(a) for a in get_args(tp)) if get_origin(tp) is Literal else ()


def _drop(table: dict[str, Any], keys: KeyPath) -> bool:
    """Remove the faulty key so its default applies and the rest can be checked (a faulty
    list element: the whole list). False when there is nothing to remove."""
    while keys:
        parent: Any = table
        for key in keys[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and keys[-1] in parent:
            del parent[keys[-1]]
            return True
        keys = keys[:-1]
    return False


def _fill(table: dict[str, Any], keys: KeyPath) -> bool:
    """Put a stand-in where a required key is missing, so the rest can be checked."""
    tp = _type_at(keys)
    parent: Any = table
    for key in keys[:-1]:
        parent = parent[key]
    if not isinstance(parent, dict):
        return False
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        parent[keys[-1]] = {}
    elif tp is str:
        parent[keys[-1]] = ""
    else:
        return False
    return True


def load_config(explicit: str | None) -> Config:
    """The config, or a :class:`ConfigError` naming every problem in it."""
    path = config_path(explicit)
    try:
        path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"config file {path} does not exist; pass --config FILE or set $BIDE_CONFIG "
            f"(`bide demo --keep DIR` writes a working example to DIR/bide.toml)"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror}") from None
    loaded = read_config(path)
    if len(loaded.problems) == 1:
        raise ConfigError(str(loaded.problems[0]))
    if loaded.problems:
        raise ConfigError(
            f"{len(loaded.problems)} problems in the config:\n"
            + "\n".join(f"  {p}" for p in loaded.problems)
        )
    assert loaded.config is not None
    return loaded.config


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default: $BIDE_CONFIG, else /etc/bide/bide.toml)",
    )
