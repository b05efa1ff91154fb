"""The configuration reference (every key of bide.toml), generated from the structs that read
the file so it cannot drift from the code: ``python -m daemon.config_reference`` prints it, and
``deploy/CONFIG.md`` is its output (a test compares them).

Types, defaults and constraints come from the structs (:mod:`daemon.config`); what a key means
is written once, in :data:`MEANINGS` below, which a test holds complete. To add a key: add
the field to its struct, a line to its section here, and regenerate the document.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, get_args, get_origin, get_type_hints

import msgspec
from msgspec import inspect

from daemon.config import PATTERN_WORDS, ConfigFile
from daemon.tomllines import unwrap

#: What each section is for (one line, under its heading).
SECTIONS: dict[str, str] = {
    "paths": "Where everything lives. Relative paths are relative to the config file's "
    "own directory.",
    "log": "The event log: segments, signed checkpoints, snapshots, forward-secure signing, "
    "and where the records are stored.",
    "postgres": "The log in PostgreSQL, for a standby that takes over (operator's guide, "
    "section 7; `pip install 'bide[postgres]'`). Without this table and without a "
    "`postgresql://` `[log] store`, the log is in files.",
    "witness": "Where every signed checkpoint head is published, off the host, so a rollback "
    "or rewrite is detected (operator's guide, section 3).",
    "spool": "The spool directory: the intake that works while the daemon is down.",
    "metrics": "Prometheus metrics.",
    "daemon": "The daemon process.",
    "api": "The local API: HTTP/1.1 + JSON over a Unix socket; callers are known by the "
    "kernel (SO_PEERCRED), their groups give their roles.",
    "fetch": "Fetching results (`bide fetch`, `POST /v1/operations/{id}/fetch`) and what "
    "`state_dir/results` keeps.",
    "retention": "Ended operations leave the daemon's memory and its snapshot (operator's "
    "guide, section 10); the log keeps every event, `bide story OP --offline` reads them.",
}

#: What each key means, by section (one line each; a test fails when one is missing).
MEANINGS: dict[str, dict[str, str]] = {
    "paths": {
        "state_dir": "the log (`log/`), `spool/`, `outbox/`, `results/` and the snapshot",
        "keys_dir": "the directory `bide keygen` wrote; unset under systemd: "
        "`$CREDENTIALS_DIRECTORY` (LoadCredential=)",
        "profiles_dir": "one TOML provider profile per file; SIGHUP or a change reloads them",
        "credentials_dir": "the provider tokens profiles name; unset: `$CREDENTIALS_DIRECTORY`",
    },
    "log": {
        "segment_bytes": "a new segment file is started past this size",
        "checkpoint_every": "records between signed checkpoints",
        "checkpoint_interval_seconds": "and a checkpoint at least this often while running",
        "snapshot_every": "events between state snapshots (`0`: only at stop); a restart folds "
        "at most this many events past the snapshot",
        "forward_secure": "new logs: checkpoints signed by evolving epoch keys certified by the "
        "root key, which may then go offline; with the log in PostgreSQL each node must be "
        "enrolled (`bide node enroll`) and signs its takeovers with its own key chain "
        "(`false`: one `signing.key` on every node, format 2)",
        "epoch_seconds": "a new epoch key (the old one destroyed) this often",
        "epoch_checkpoints": "or every N checkpoints, whichever comes first (`0`: off)",
        "store": '`"files"`, or a `postgresql://` DSN (the same as `[postgres] dsn`)',
        "level": "the daemon's log lines at this level and above are written (`bide run "
        "--log-level` overrides it for one run)",
    },
    "postgres": {
        "dsn": "the database (conninfo or `postgresql://` URL); never a password: `password_file`",
        "password_file": "the database password (0600); or libpq's `PGPASSFILE`",
        "allow_async_commit": "accept a server with `synchronous_commit = off` (an "
        "acknowledged record may be lost)",
        "lease_seconds": "how long a node's lease runs without renewal",
        "renew_seconds": "how often the active node renews it (less than `lease_seconds`)",
        "request_margin_seconds": "a request is sent only while the lease has its timeout "
        "plus this left",
        "standby_poll_seconds": "how often a standby looks for an expired lease (it also wakes "
        "on every commit and handover)",
        "node": "this node's name in the lease and the story (default: the host name)",
    },
    "witness": {
        "file": "an append-only file, e.g. on a mount of another host",
        "syslog": "one line per head to syslog/journald",
        "urls": "`bide witness serve` endpoints (each needs `token_file`)",
        "timeout_seconds": "how long one publication or question to a witness may take",
        "retries": "quick retries per attempt",
        "retry_seconds": "then a pending head is retried this often",
        "ca_file": "PEM roots for https witnesses (a private CA); default: certifi's",
        "token_file": "the secret a witness knows this log's publisher by (0600; "
        "`bide witness token`)",
        "witness_keys": "pinned witness public keys (base64, as `bide witness serve` prints "
        "them): a head a witness returns must be countersigned by one",
    },
    "spool": {
        "agents_group": "the group that may write registrations (`spool/incoming`)",
        "approvers_group": "the group that may write decisions (`spool/decisions`)",
        "allow_root_approval": "with `approvers_group`: may files owned by root approve",
        "require_escalation_number": "a decision names the escalation it answers "
        "(`bide decide OP OPTION --escalation N`)",
        "receipt_retention_seconds": "how long receipts of ingested files are kept",
        "rejected_max_files": "refused files kept in `spool/rejected/` (the oldest go first)",
        "receipt_max_files": "receipts kept per receipts directory",
    },
    "metrics": {
        "listen": 'where Prometheus scrapes `/metrics`; `""` is off',
    },
    "daemon": {
        "drain_seconds": "on SIGTERM, how long requests in flight may finish",
    },
    "api": {
        "enabled": "serve the local API at all",
        "socket": "the socket's path; default `$RUNTIME_DIRECTORY/api.sock` under systemd, "
        "else `state_dir/api.sock`",
        "socket_mode": "the socket's file mode",
        "socket_group": 'who may connect; `""` keeps the daemon\'s own group',
        "agents_group": 'the agents role; unset: `[spool] agents_group`; `""` admits everyone',
        "approvers_group": 'the approvers role; unset: `[spool] approvers_group`; `""` '
        "admits everyone",
        "operators_group": "the operators role, besides root and the daemon's own user",
        "daemon_user": 'the CLI talks only to a socket this user (or root) answers; `""` '
        "trusts the socket file's owner",
        "allow_self_approval": "may an approver answer their own operation's escalation "
        "(one-person setups)",
        "max_live_per_principal": "live operations one user may have at once",
        "registrations_per_second": "registrations per user per second (then 429 with Retry-After)",
        "registrations_burst": "registrations at once after a quiet spell",
        "max_wait_seconds": "the longest server-side wait one call may ask for (`?wait=`)",
        "max_connections": "connections open at once",
        "max_connections_per_user": "connections one user may hold open at once",
        "request_timeout_seconds": "how long a client may take to send its request",
        "closed_stories": "ended operations whose stories are kept in memory",
        "story_events_kept": "events of one operation's story kept in memory",
    },
    "fetch": {
        "per_principal_per_minute": "fetches one user may ask for per minute (then 429)",
        "burst": "fetches at once after a quiet spell",
        "results_max_age_seconds": "`results/` files older than this are removed",
        "results_max_bytes": "and the oldest beyond this total (the newest always stays)",
    },
    "retention": {
        "ended_after": "seconds an ended operation stays in memory before it retires",
        "max_ended": "ended operations kept at most; beyond it the oldest retire at once",
        "max_tombstones": "retired ids that still answer a retry alike (about 30 bytes each); "
        "the older half is forgotten at once",
        "check_seconds": "how often the daemon looks for ended operations due to retire",
    },
}

#: The sections in the order an operator reads them.
ORDER = (
    "paths",
    "log",
    "postgres",
    "witness",
    "spool",
    "metrics",
    "daemon",
    "api",
    "fetch",
    "retention",
)


def sections() -> list[tuple[str, inspect.StructType, bool]]:
    """Every table of bide.toml: its name, its struct's type info, whether it is required."""
    out = []
    info = inspect.type_info(ConfigFile)
    assert isinstance(info, inspect.StructType)
    for f in info.fields:
        tp = f.type
        if isinstance(tp, inspect.UnionType):
            tp = next(t for t in tp.types if not isinstance(t, inspect.NoneType))
        assert isinstance(tp, inspect.StructType), f.name
        out.append((f.name, tp, f.required))
    rank = {name: n for n, name in enumerate(ORDER)}
    return sorted(out, key=lambda s: rank.get(s[0], len(ORDER)))


def _type(tp: inspect.Type) -> str:
    if isinstance(tp, inspect.UnionType):
        return " or ".join(_type(t) for t in tp.types if not isinstance(t, inspect.NoneType))
    if isinstance(tp, inspect.ListType):
        return f"list of {_type(tp.item_type)}s"
    if isinstance(tp, inspect.LiteralType):
        return "string"
    return {
        inspect.StrType: "string",
        inspect.IntType: "integer",
        inspect.FloatType: "number",
        inspect.BoolType: "boolean",
    }.get(type(tp), type(tp).__name__)


def _constraints(tp: inspect.Type) -> str:
    if isinstance(tp, inspect.UnionType):
        return "; ".join(
            c for t in tp.types if not isinstance(t, inspect.NoneType) if (c := _constraints(t))
        )
    if isinstance(tp, inspect.LiteralType):
        return "one of " + ", ".join(f"`{v}`" for v in tp.values)
    if isinstance(tp, inspect.IntType | inspect.FloatType):
        bounds = [(">", tp.gt), (">=", tp.ge), ("<", tp.lt), ("<=", tp.le)]
        return ", ".join(f"{op} {_number(v)}" for op, v in bounds if v is not None)
    if isinstance(tp, inspect.StrType) and tp.pattern is not None:
        return PATTERN_WORDS.get(tp.pattern, f"matches `{tp.pattern}`").replace("|", "\\|")
    return ""


def _choices(declared: object) -> str:
    """A Literal's values in the order the code declares them (msgspec sorts them)."""
    tp = unwrap(declared)
    if get_origin(tp) is not Literal:
        return ""
    return "one of " + ", ".join(f"`{v}`" for v in get_args(tp))


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _default(f: inspect.Field) -> str:
    if f.required:
        return "required"
    value: Any = f.default
    if value is msgspec.NODEFAULT:
        value = f.default_factory()
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{msgspec.json.encode(value).decode()}`"


def reference() -> str:
    lines = [
        "# Configuration reference (bide.toml)",
        "",
        "Every key of every table of the daemon's config, with its type, default and limits.",
        "Generated from the structs that read the file (`python -m daemon.config_reference >",
        "deploy/CONFIG.md`); a test fails when this file and the code disagree. The config is",
        "found at `--config FILE`, else `$BIDE_CONFIG`, else `/etc/bide/bide.toml`; relative",
        "paths in it are relative to its own directory. A working example is",
        "[`deploy/bide.toml`](bide.toml) (the one `deploy/bide.service` runs with); how to",
        "deploy it: [the operator's guide](README.md). Check a config without starting",
        "anything: `bide run --check --config FILE` (every problem with its line; exit 78).",
        "Provider profiles have [a reference of their own](profiles/REFERENCE.md).",
        "",
    ]
    for name, info, required in sections():
        title = f"## [{name}]" + (" (required)" if required else "")
        lines += [title, "", SECTIONS[name], ""]
        lines += ["| key | type | default | limits | meaning |", "|---|---|---|---|---|"]
        hints = get_type_hints(info.cls, include_extras=True)
        for f in info.fields:
            meaning = MEANINGS[name][f.name]
            limits = _choices(hints[f.name]) or _constraints(f.type)
            lines.append(f"| `{f.name}` | {_type(f.type)} | {_default(f)} | {limits} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    del argv
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
