"""``bide run --check``: load what ``bide run`` would load, say what was found, name every
problem (like ``nginx -t``), and write nothing.

The config, every profile, the keys, the store (the database reached read-only, with a short
timeout) and the witnesses (asked for a head, a read) are each checked on their own, so one
mistake does not hide the next: a report holds every problem found, each with its file and
the line of its key where there is one, and the fix. Nothing is created or changed: no log,
no socket, no key, no state directory, no lease.
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from daemon.config import Config, Problem, config_path, problem_of, read_config
from daemon.interpreter_access import interpreter_unreachable_by_others
from daemon.profile import load_profiles, too_long_for_lease
from daemon.signing import (
    database_log_format,
    enrolled_node,
    log_format,
    log_identity,
    node_dir,
    node_name,
)
from daemon.tomllines import dotted, line_of
from eventlog.envelope import FORMAT_SINGLE_KEY
from eventlog.errors import EventLogError
from eventlog.keys import (
    SIGNING_KEY,
    VERIFY_KEY,
    keys_directory,
    load_keyring,
    load_signer,
    load_verify_key,
)
from eventlog.nodekeys import MAX_LINKS, NodeChain

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout

#: How long the database and each witness may take to answer.
REACH_SECONDS = 3.0
#: ``bide run --check``'s exit status when it found a problem (sysexits.h EX_CONFIG).
EX_CONFIG = 78
#: Asked of a witness when the log has no id yet: a well-formed id no log has (404 = reached).
_NO_LOG = "0" * 32
_LAST = 1 << 30
#: The longest Unix socket path (sun_path holds 108 bytes with the terminating NUL).
_SUN_PATH = 107


@dataclass
class Report:
    """What a check found (in the order it looked) and every problem, with any warnings."""

    config: str
    found: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: This node signs as an enrolled node (PostgreSQL, forward-secure, not a format-2 log).
    enrolled_node: bool = field(default=False, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems


def preflight(explicit: str | None, timeout: float = REACH_SECONDS) -> Report:
    """Check the config ``explicit`` (else ``$BIDE_CONFIG``, else the default) and everything
    it names; reads only."""
    path = config_path(explicit)
    report = Report(str(path))
    if not path.is_file() or not _readable(path):
        if not path.exists():
            what, fix = (
                "does not exist",
                (
                    "pass --config FILE or set $BIDE_CONFIG (`bide demo --keep DIR` writes a "
                    "working example to DIR/bide.toml)"
                ),
            )
        elif not path.is_file():
            what, fix = "is not a file", "pass the config file itself with --config FILE"
        else:
            what, fix = "cannot be read", "run the check as the daemon's user, or fix its mode"
        report.problems.append(Problem(str(path), 0, "", what, fix))
        return report
    loaded = read_config(path)
    report.problems += loaded.problems
    report.config = str(path.resolve())
    report.found["config"] = report.config
    cfg = loaded.config
    if cfg is None:
        return report
    report.found["state_dir"] = {"path": str(cfg.state_dir), "exists": cfg.state_dir.is_dir()}
    if unreachable := interpreter_unreachable_by_others():
        report.warnings.append(unreachable)
    _settings(cfg, report)
    _profiles(cfg, report)
    _keys(cfg, report)
    _store(cfg, report, timeout)
    _witness(cfg, report, timeout)
    files = list(dict.fromkeys(p.file for p in report.problems))
    report.problems.sort(key=lambda p: (files.index(p.file), p.line or _LAST))
    return report


def _readable(path: Path) -> bool:
    try:
        with path.open("rb"):
            return True
    except OSError:
        return False


def _at(cfg: Config, keys: tuple[str | int, ...], message: str, fix: str = "") -> Problem:
    """A problem about the config's key ``keys`` (on its line, or its table's)."""
    return Problem(str(cfg.path), line_of(cfg.lines, keys), dotted(keys), message, fix)


def _settings(cfg: Config, report: Report) -> None:
    """What ``bide run`` refuses at start beyond the file's own validation: spool groups that
    do not exist, a socket path too long, forward-secure keys with a shared log."""
    for key in ("agents_group", "approvers_group"):
        group = getattr(cfg.spool, key)
        if group and not _group_exists(group):
            report.problems.append(
                _at(
                    cfg,
                    ("spool", key),
                    f"group {group!r} does not exist",
                    f"create it (groupadd {group}), or clear the setting",
                )
            )
    if cfg.api.enabled:
        socket = cfg.socket_path
        report.found["api"] = {"socket": str(socket)}
        if len(os.fsencode(socket)) > _SUN_PATH:
            report.problems.append(
                _at(
                    cfg,
                    ("api", "socket") if cfg.api_socket is not None else ("paths", "state_dir"),
                    f"the API socket {socket} is longer than a Unix socket path may be "
                    f"({_SUN_PATH} bytes)",
                    "set [api] socket to a shorter path",
                )
            )
        if cfg.api.socket_group and not _group_exists(cfg.api.socket_group):
            report.warnings.append(
                f"{cfg.where('api', 'socket_group')}: api.socket_group: group "
                f"{cfg.api.socket_group!r} does not exist: only the daemon's user and root will "
                f"be able to connect"
            )
    if enrolled_node(cfg):
        problem = _not_enrolled(cfg, report)
        if problem is not None:
            report.problems.append(
                _at(
                    cfg,
                    ("log", "forward_secure"),
                    f"the log is in PostgreSQL and forward-secure (the default), so this node "
                    f"signs its takeovers with its own enrolled key: {problem}",
                    "or set [log] forward_secure = false to sign with one signing.key on "
                    "every node",
                )
            )


def _not_enrolled(cfg: Config, report: Report) -> str | None:
    """Why this node cannot sign as an enrolled node (None: it can, or the log in the
    database is format 2 and goes on with its one key). What it found goes into the report."""
    assert cfg.postgres is not None
    if (
        database_log_format(cfg) == FORMAT_SINGLE_KEY
        or log_format(cfg.log_dir) == FORMAT_SINGLE_KEY
    ):
        return None
    report.enrolled_node = True
    try:
        verify_key = load_verify_key(keys_directory(cfg.keys_dir) / VERIFY_KEY)
    except EventLogError:
        return None  # the keys check names it
    name = node_name(cfg.postgres.node)
    try:
        chain = NodeChain(node_dir(cfg), verify_key, name)
    except EventLogError as exc:
        return str(exc)
    report.found["node"] = {"name": name, "key": chain.index, "links": len(chain.links)}
    if len(chain.links) >= MAX_LINKS * 3 // 4:
        report.warnings.append(
            f"node {name} has used {len(chain.links)} of its {MAX_LINKS} node keys since it "
            f"was enrolled; enrol it again (bide node enroll) before it runs out"
        )
    return None


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _profiles(cfg: Config, report: Report) -> None:
    if cfg.profiles_dir is None:
        report.problems.append(
            _at(
                cfg,
                ("paths",),
                "no profiles_dir: the daemon has no provider profiles to poll with",
                'set profiles_dir = "DIR" under [paths], one TOML profile per provider in DIR',
            )
        )
        return
    if not cfg.profiles_dir.is_dir():
        report.problems.append(
            _at(
                cfg,
                ("paths", "profiles_dir"),
                f"{cfg.profiles_dir} is not a directory",
                "create it and put one TOML profile per provider in it (`bide check-profile -h`)",
            )
        )
        return
    good, bad = load_profiles(cfg.profiles_dir)
    if cfg.postgres is not None:
        pg = cfg.postgres
        longest = pg.lease_seconds - pg.renew_seconds - pg.request_margin_seconds
        for name, message in too_long_for_lease(good, longest).items():
            bad[good.pop(name).path] = f"{cfg.profiles_dir / name}.toml: {message}"
    report.found["profiles"] = {
        "dir": str(cfg.profiles_dir),
        "names": sorted(good),
        "refused": sorted(path.stem for path in bad),
    }
    report.problems += [problem_of(message, path) for path, message in sorted(bad.items())]
    creds = cfg.credentials_dir
    for name, profile in sorted(good.items()):
        ref = profile.credential
        if ref is None or ref.file is None or creds is None:
            continue
        if not (creds / ref.file).is_file():
            report.problems.append(
                Problem(
                    str(profile.path),
                    0,
                    "credential.file",
                    f"{creds / ref.file} does not exist (provider {name}'s token)",
                    "put the token there (0600), or fix [paths] credentials_dir",
                )
            )


def _keys(cfg: Config, report: Report) -> None:
    if cfg.keys_dir is None and not os.environ.get("CREDENTIALS_DIRECTORY"):
        report.found["keys"] = {"dir": None}
        report.warnings.append(
            "keys not checked: no [paths] keys_dir, and no $CREDENTIALS_DIRECTORY here; under "
            "systemd they come from LoadCredential= at start (outside it, set keys_dir)"
        )
        return
    try:
        keys_dir = keys_directory(cfg.keys_dir)
    except EventLogError as exc:
        report.problems.append(_at(cfg, ("paths",), str(exc)))
        return
    found: dict[str, Any] = {"dir": str(keys_dir)}
    report.found["keys"] = found
    fmt = log_format(cfg.log_dir)
    checks: list[tuple[str, Any]] = [
        ("data key", lambda: load_keyring(keys_dir)),
        ("verify key", lambda: load_verify_key(keys_dir / VERIFY_KEY)),
    ]
    enrolled = report.enrolled_node
    if (
        (keys_dir / SIGNING_KEY).exists()
        or (fmt is None and not enrolled)
        or not cfg.log.forward_secure
    ):
        # a new log is certified by the root key once; a single-key log signs with it
        checks.append(("signing key", lambda: load_signer(keys_dir)))
    elif enrolled:
        found["signing_key"] = "offline (an enrolled node signs with its own node key)"
    else:
        found["signing_key"] = "offline (the log exists and signs with its epoch keys)"
    key = ("paths", "keys_dir") if cfg.keys_dir is not None else ("paths",)
    for what, load in checks:
        try:
            loaded = load()
        except (EventLogError, ValueError) as exc:
            report.problems.append(_at(cfg, key, f"{what}: {exc}"))
            continue
        if what == "data key":
            found["data_keys"] = len(loaded.keys)
        elif what == "signing key":
            found["signing_key"] = "ok"
            if enrolled:
                report.warnings.append(
                    f"the root signing key {keys_dir / SIGNING_KEY} is readable on this node: "
                    f"an enrolled node never needs it (only `bide node enroll` does): move it "
                    f"offline (keep verify.pub)"
                )
            elif fmt is not None and cfg.log.forward_secure:
                report.warnings.append(
                    f"the root signing key {keys_dir / SIGNING_KEY} is readable on this host, "
                    f"and the log exists: move it offline (keep verify.pub)"
                )
        else:
            found["verify_key"] = "ok"


def _store(cfg: Config, report: Report, timeout: float) -> None:
    if cfg.postgres is None:
        exists = cfg.log_dir.is_dir()
        report.found["store"] = {
            "kind": "files",
            "path": str(cfg.log_dir),
            "log": log_identity(cfg.log_dir) if exists else None,
        }
        return
    found: dict[str, Any] = {"kind": "postgresql", "reachable": False}
    report.found["store"] = found
    key = ("log", "store") if ("log", "store") in cfg.lines else ("postgres", "dsn")
    try:
        from daemon.pgconfig import config_settings
        from eventlog import pgstore
    except ImportError as exc:
        report.problems.append(
            _at(cfg, key, f"the log is in PostgreSQL but {exc}", "pip install 'bide[postgres]'")
        )
        return
    settings = config_settings(cfg)
    assert settings is not None
    settings = dataclasses.replace(settings, connect_timeout=timeout, link_timeout=timeout)
    found["database"] = _database(settings.dsn)
    try:
        conn = pgstore.connect(settings, read_only=True)
    except EventLogError as exc:
        report.problems.append(
            _at(
                cfg,
                key,
                str(exc),
                "check that the server runs and the DSN's host, port and database are right",
            )
        )
        return
    try:
        found["reachable"] = True
        from eventlog.shards import read_layout

        layout = read_layout(conn)
        if layout.sharded:
            _shards(cfg, report, settings, layout, found, key)
            return
        pgstore.require_schema(conn)
        lease = pgstore.lease_row(conn)
        found["lease"] = {"holder": lease.holder, "epoch": lease.epoch}
    except EventLogError as exc:
        report.problems.append(_at(cfg, key, str(exc)))
    finally:
        conn.close()


def _shards(
    cfg: Config,
    report: Report,
    settings: PgSettings,
    layout: Layout,
    found: dict[str, Any],
    key: tuple[str, str],
) -> None:
    """A sharded log: every shard's schema this version knows, and how many leases are held
    now (``bide run`` divides the shards among the live nodes)."""
    from eventlog import pgstore

    found["shards"] = layout.count
    held = 0
    for k in range(layout.count):
        try:
            conn = pgstore.connect(layout.settings(settings, k), read_only=True)
        except EventLogError as exc:
            report.problems.append(_at(cfg, key, f"shard {k} ({layout.schema(k)}): {exc}"))
            continue
        try:
            pgstore.require_schema(conn)
            lease = pgstore.lease_row(conn)
            held += lease.remaining > 0
        except EventLogError as exc:
            report.problems.append(
                _at(
                    cfg,
                    key,
                    f"shard {k} ({layout.schema(k)}): {exc}",
                    "rerun `bide log init --dsn DSN --shards N` as the log's owner",
                )
            )
        finally:
            conn.close()
    found["shards_held"] = held


def _database(dsn: str) -> str:
    """The DSN's host, port and database for the report (a DSN holds no password: bide
    refuses one that does)."""
    import psycopg

    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(not a valid DSN)"
    host = params.get("host") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or ''}"


def _witness(cfg: Config, report: Report, timeout: float) -> None:
    from daemon.witness.remote import WitnessUnreachable, pinned_keys, shown, witnessed
    from daemon.witness.service import TrustError, read_token

    w = cfg.witness
    found: dict[str, Any] = {"file": None, "syslog": w.syslog, "urls": {}}
    report.found["witness"] = found
    if cfg.witness_file is not None:
        found["file"] = str(cfg.witness_file)
        if not cfg.witness_file.parent.is_dir():
            report.problems.append(
                _at(
                    cfg,
                    ("witness", "file"),
                    f"{cfg.witness_file.parent} is not a directory",
                    "mount or create it (a directory of another host's, ideally)",
                )
            )
    if w.urls and cfg.witness_token is None:
        report.problems.append(
            _at(
                cfg,
                ("witness", "urls"),
                "urls need token_file, the secret the witness knows this log's publisher by",
                "create it 0600 with `bide witness token --out FILE` and put the same file in "
                "the witness's trust directory",
            )
        )
    elif cfg.witness_token is not None:
        try:
            read_token(cfg.witness_token)
        except TrustError as exc:
            report.problems.append(_at(cfg, ("witness", "token_file"), str(exc)))
    try:
        pinned_keys(w.witness_keys)
    except ValueError as exc:
        report.problems.append(_at(cfg, ("witness", "witness_keys"), str(exc)))
    log_id = log_identity(cfg.log_dir) if cfg.postgres is None else None
    for n, url in enumerate(w.urls):
        try:
            witnessed(url, log_id or _NO_LOG, timeout=timeout, ca_file=cfg.witness_ca)
        except WitnessUnreachable as exc:
            # A witness being down does not stop the daemon (it retries): a warning.
            found["urls"][shown(url)] = "unreachable"
            report.warnings.append(
                f"{cfg.where('witness', 'urls', n)}: {exc}; the daemon would start and keep "
                f"retrying it (is `bide witness serve` running there?)"
            )
        else:
            found["urls"][shown(url)] = "reachable"


def render(report: Report) -> str:
    """The report for a person: what was found, then each problem on a line of its own."""
    f = report.found
    out = [f"config     {report.config}"]
    if "state_dir" in f:
        sd = f["state_dir"]
        out.append(
            f"state dir  {sd['path']}"
            + ("" if sd["exists"] else " (not created yet: `bide run` creates it)")
        )
    if "profiles" in f:
        names = f["profiles"]["names"]
        refused = f["profiles"]["refused"]
        out.append(
            f"profiles   {len(names)} valid in {f['profiles']['dir']}"
            + (f": {', '.join(names)}" if names else "")
            + (f" ({len(refused)} refused: {', '.join(refused)})" if refused else "")
        )
    if "keys" in f:
        k = f["keys"]
        parts = [f"{k['data_keys']} data key(s)"] if "data_keys" in k else []
        parts += [f"{what} {k[key]}" for what, key in (("verify key", "verify_key"),) if key in k]
        parts += [f"signing key {k['signing_key']}"] if "signing_key" in k else []
        if k["dir"] is None:
            out.append("keys       from $CREDENTIALS_DIRECTORY at start (not checked here)")
        else:
            out.append(f"keys       {k['dir']}: {', '.join(parts) or 'none loaded'}")
    if "node" in f:
        n = f["node"]
        out.append(
            f"node       {n['name']}: enrolled, at node key {n['key']} ({n['links']} used "
            f"since enrolment)"
        )
    if "store" in f:
        s = f["store"]
        if s["kind"] == "files":
            state = f"log {s['log']}" if s["log"] else "no log yet: `bide run` creates it"
            out.append(f"store      files in {s['path']} ({state})")
        else:
            reach = "reachable" if s["reachable"] else "NOT reachable"
            lease = s.get("lease")
            held = f", lease epoch {lease['epoch']} ({lease['holder'] or 'free'})" if lease else ""
            if "shards" in s:
                held = f", {s['shards']} shards ({s.get('shards_held', 0)} held now)"
            out.append(f"store      postgresql {s['database']}: {reach}{held}")
    if "api" in f:
        out.append(f"api        {f['api']['socket']}")
    if "witness" in f:
        w = f["witness"]
        parts = [f"file {w['file']}"] if w["file"] else []
        parts += ["syslog"] if w["syslog"] else []
        parts += [f"{url} {state}" for url, state in w["urls"].items()]
        out.append(f"witness    {', '.join(parts) or 'none configured'}")
    out += [f"warning: {w}" for w in report.warnings]
    if report.ok:
        out.append("ok: no problems found; `bide run` would start with this config")
    else:
        out += [f"problem: {p}" for p in report.problems]
        count = len(report.problems)
        out.append(f"{count} problem{'s' if count != 1 else ''} found; fix and check again")
    return "\n".join(out) + "\n"


def as_json(report: Report) -> bytes:
    """The report for a script: ``ok``, ``config``, ``found``, ``problems`` (each with file,
    line, key, message, fix) and ``warnings``."""
    return msgspec.json.encode(
        {
            "ok": report.ok,
            "config": report.config,
            "found": report.found,
            "problems": report.problems,
            "warnings": report.warnings,
        }
    )


def run_check(args: argparse.Namespace) -> int:
    """``bide run --check [--json]``: 0 when nothing is wrong, else :data:`EX_CONFIG`."""
    report = preflight(args.config)
    if getattr(args, "json", False):
        sys.stdout.write(as_json(report).decode() + "\n")
    else:
        sys.stdout.write(render(report))
    return 0 if report.ok else EX_CONFIG
