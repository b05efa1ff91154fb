"""A real workspace for end-to-end tests: keys, a profile, a config, the simulator, the daemon.

Everything runs for real: the simulator on 127.0.0.1 in a background thread, ``bide run`` as
a subprocess, every other command through the CLI as a subprocess. Waits are bounded polls of
real state (a log line, a receipt, the simulator's request log), never sleep-and-hope.

The log is in either store (``workspace(..., store=...)``): the embedded segment files, or a
real PostgreSQL (a schema of the workspace's own, from :mod:`tests.pgsupport`), where
``bide run`` is a node that takes the lease before it acts and keeps a copy of the segment
files in the state dir, so the readers here (``Workspace.log``) read the same log either way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

import msgspec

from daemon.config import load_config
from daemon.readers import LoadedLog, load_log, open_keyring
from daemon.signing import snapshot_keys
from daemon.simulator import RequestRecord, SimulatorHandle, run_in_thread, script_from_dict
from daemon.snapshots import load_snapshot, replay_log
from daemon.spool import RegistrationFile, Spool, new_request_id
from eventlog import keys
from eventlog.segments import list_segments
from replay.events import (
    PollScheduled,
    ResponseClassified,
    StatusRequestIntended,
    TransportFailed,
)
from replay.observations import Registration
from tests.pgsupport import schema_dsn

TOKEN = "e2e-s3cret-token-7f1d"
BIDE = [sys.executable, "-m", "daemon.cli"]
#: Where the log can be: ``[log] store``'s default, or PostgreSQL (``[postgres]``).
STORES = ("files", "postgres")
TOOK_LEASE = 'msg="took the log\'s lease"'

DEFAULT_CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
next_check_at_pointer = "/next_check_at"
poll_after_seconds_pointer = "/poll_after_seconds"
expires_at_pointer = "/expires_at"
error_pointer = "/error"
backoff_base_seconds = 0.2
backoff_cap_seconds = 0.4
rate_limited_delay_seconds = 1.0
min_hint_seconds = 0.05
not_found_grace_seconds = 5
"""

STATES = """\
[contract.states]
pending = ["queued", "running"]
success = ["succeeded"]
failure = ["failed"]
canceled = ["canceled"]
expired = ["expired"]
"""


def until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    """Poll real state until ``predicate()`` is truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def verify_dsn(root: Path, dsn: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``bide verify --dsn DSN`` as an auditor runs it: ``root``'s ``keys/verify.pub`` alone."""
    return subprocess.run(
        [
            *BIDE,
            "verify",
            "--dsn",
            dsn,
            *options,
            "--verify-key",
            str(root / "keys" / "verify.pub"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.output()}")
            return "msg=ready" in self.output()

        until(ready, timeout, "the daemon to be ready")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@dataclass
class Workspace:
    root: Path
    sim: SimulatorHandle
    dsn: str | None = None  # the log's database; None: the log is in files
    daemons: list[Daemon] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def config(self) -> Path:
        return self.root / "bide.toml"

    def write_profile(
        self, name: str = "sim", contract: str = DEFAULT_CONTRACT, extra: str = ""
    ) -> Path:
        path = self.root / "profiles" / f"{name}.toml"
        path.write_text(
            f'[status]\nurl = "{self.sim.base_url}/jobs/{{job_id}}"\ntimeout_seconds = 2\n'
            f'max_body_bytes = 65536\n\n[credential]\nfile = "sim.token"\n\n{extra}\n'
            f"[contract]\n{contract}\n{STATES}"
        )
        return path

    def bide(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*BIDE, *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def start_daemon(
        self,
        env: dict[str, str] | None = None,
        *,
        ready: bool = True,
        listen: socket.socket | None = None,
        args: Sequence[str] = (),
    ) -> Daemon:
        """Start ``bide run`` (with ``args``); with ``listen``, as systemd's socket activation
        would: the socket as fd 3, ``LISTEN_FDS=1`` and ``LISTEN_PID`` the daemon's own pid.
        Its output goes to :meth:`next_log_path`."""
        log_path = self.next_log_path()
        command = [*BIDE, "run", "--config", str(self.config), *args]
        extra = dict(env or {})
        activation: dict[str, object] = {}
        if listen is not None:
            fd = listen.fileno()
            command = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", *command]
            extra["LISTEN_FDS"] = "1"
            activation = {"pass_fds": (3,), "preexec_fn": lambda: os.dup2(fd, 3)}
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdout=out,  # type: ignore[call-overload]
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, **extra},
                **activation,
            )
        daemon = Daemon(proc, log_path)
        self.daemons.append(daemon)
        if ready:
            daemon.wait_ready()
        return daemon

    def next_log_path(self) -> Path:
        """Where the next daemon's stdout and stderr go (a file made beforehand keeps its
        inode, so a test can name it in ``$JOURNAL_STREAM``)."""
        return self.root / f"daemon-{len(self.daemons)}.log"

    def wait_writer(self, daemon: Daemon, timeout: float = 15.0) -> None:
        """Wait until ``daemon`` holds the log: at once with files; with PostgreSQL once it
        took the lease (before that it is a standby, following the log, not starting up)."""
        if self.dsn is None:
            return

        def took() -> bool:
            if daemon.proc.poll() is not None:
                raise AssertionError(f"daemon exited {daemon.proc.returncode}:\n{daemon.output()}")
            return TOOK_LEASE in daemon.output()

        until(took, timeout, "the node to take the lease")

    def watch(self, job: str, op: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return self.bide("watch", "--provider", "sim", "--job", job, "--operation", op, *flags)

    def log(self) -> LoadedLog:
        cfg = load_config(str(self.config))
        return load_log(cfg.log_dir, open_keyring(cfg))

    def committed_log(self) -> LoadedLog:
        """The log as far as it is acknowledged: with files, the state dir's; with PostgreSQL,
        the database's. A node's own copy runs ahead of the database by up to one round (a
        round is written there, then committed), and a node killed in between cuts that
        round on restart: what a test waits for before a kill must be committed."""
        cfg = load_config(str(self.config))
        if self.dsn is None:
            return load_log(cfg.log_dir, open_keyring(cfg))
        export = exported(self.dsn, self, f"committed-{time.monotonic_ns()}")
        return load_log(export, open_keyring(cfg))

    def assert_no_leak(self) -> None:
        """The credential is in its own file and nowhere else the run wrote."""
        needle = TOKEN.encode()
        for path in self.root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.name != "sim.token":
                assert not _contains(path, needle), f"credential leaked into {path}"
        for text in self.outputs:
            assert TOKEN not in text, "credential leaked into a command's output"
        for record in self.sim.requests():
            assert TOKEN not in repr(record), "credential in the simulator's request log"


def _contains(path: Path, needle: bytes) -> bool:
    """Whether ``path`` holds ``needle``, read in chunks: a test may leave a 10 GB sparse
    file behind (the hostile spool's), which must not be read into memory at once."""
    st = path.stat()
    if st.st_size > 64 * 1024 * 1024 and st.st_blocks * 512 < st.st_size // 16:
        return False  # sparse: nothing was ever written into it
    tail = b""
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


@dataclass(frozen=True)
class LeaseTimes:
    """A PostgreSQL node's ``[postgres]`` lease timings. A SIGKILLed node's successor waits out
    up to ``seconds``; a request is sent only with its status timeout plus ``margin`` left on
    the lease, so a profile's timeout must stay well under ``seconds - renew``."""

    seconds: float
    renew: float
    margin: float


#: For runs that kill nodes: a restart waits at most 2 s; status timeouts up to about 1 s.
SHORT_LEASE = LeaseTimes(seconds=2.0, renew=0.5, margin=0.2)


def config_text(
    *,
    state_dir: str = "state",
    log_extra: str = "",
    postgres: str = "",
    api: str = "allow_self_approval = true\n",
) -> str:
    """A ``bide.toml`` over the workspace's keys, profiles and credentials; ``postgres`` is
    the ``[postgres]`` table (:func:`postgres_table`), empty for the log in files."""
    if postgres:
        log_extra = "forward_secure = false\n" + log_extra  # required with PostgreSQL
    return (
        f'[paths]\nstate_dir = "{state_dir}"\nkeys_dir = "keys"\n'
        'profiles_dir = "profiles"\ncredentials_dir = "creds"\n\n[log]\n'
        "checkpoint_every = 50\ncheckpoint_interval_seconds = 5\n"
        f"{log_extra}\n{postgres}\n[api]\n{api}"
    )


def postgres_table(dsn: str, lease: LeaseTimes | None = None, node: str = "") -> str:
    """The config's ``[postgres]`` table; without ``lease``, the daemon's default timings."""
    text = f"[postgres]\ndsn = {_toml(dsn)}\n"
    if lease is not None:
        text += (
            f"lease_seconds = {lease.seconds}\nrenew_seconds = {lease.renew}\n"
            f"request_margin_seconds = {lease.margin}\n"
        )
    return text + (f"node = {_toml(node)}\n" if node else "")


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def init_log(dsn: str) -> None:
    """``bide log init``: the schema a daemon needs before it starts on ``dsn``."""
    out = subprocess.run(
        [*BIDE, "log", "init", "--dsn", dsn],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@contextmanager
def workspace(
    tmp: Path,
    jobs: Mapping[str, str | Sequence[object]] | None = None,
    server: dict[str, object] | None = None,
    config_extra: str = "",
    scenarios: dict[str, object] | None = None,
    api: str = "allow_self_approval = true\n",
    store: str = "files",
    lease: LeaseTimes | None = None,
) -> Iterator[Workspace]:
    """A workspace; ``api`` is the body of the config's ``[api]`` table (by default the one
    person running the tests may answer their own escalations); ``config_extra`` goes into
    ``[log]``. With ``store="postgres"`` the log is in a fresh schema (initialized, dropped
    after; the test skips where there is no server) and ``lease`` sets the node's timings."""
    assert store in STORES, store
    script = script_from_dict(
        {
            "server": server or {},
            "scenarios": scenarios or {},
            "jobs": {k: {"steps": v} for k, v in (jobs or {}).items()},
        }
    )
    (tmp / "profiles").mkdir()
    (tmp / "creds").mkdir(mode=0o700)
    token = tmp / "creds" / "sim.token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    keys.generate(tmp / "keys")
    with ExitStack() as stack:
        dsn = None
        if store == "postgres":
            dsn = stack.enter_context(contextmanager(schema_dsn)())
            init_log(dsn)
        postgres = postgres_table(dsn, lease) if dsn is not None else ""
        (tmp / "bide.toml").write_text(
            config_text(log_extra=config_extra, postgres=postgres, api=api)
        )
        sim = stack.enter_context(run_in_thread(script, token=TOKEN))
        ws = Workspace(tmp, sim, dsn)
        ws.write_profile()
        try:
            yield ws
        finally:
            for d in ws.daemons:
                d.kill()
        ws.assert_no_leak()


# -- helpers for the behaviour and crash suites (additive) ---------------------------------


def write_status_profile(
    ws: Workspace,
    name: str,
    *,
    contract: str = DEFAULT_CONTRACT,
    timeout_seconds: float = 2.0,
    max_body_bytes: int = 65536,
    extra: str = "",
) -> Path:
    """Like :meth:`Workspace.write_profile`, with the ``[status]`` timeout and size cap chosen."""
    path = ws.root / "profiles" / f"{name}.toml"
    path.write_text(
        f'[status]\nurl = "{ws.sim.base_url}/jobs/{{job_id}}"\n'
        f"timeout_seconds = {timeout_seconds}\nmax_body_bytes = {max_body_bytes}\n\n"
        f'[credential]\nfile = "sim.token"\n\n{extra}\n[contract]\n{contract}\n{STATES}'
    )
    return path


class RegistrationFields(TypedDict, total=False):
    """The :class:`~replay.observations.Registration` fields :func:`drop_registration` takes
    as keywords (all but the operation, provider and job ids, which it takes by name)."""

    account_context: str
    request_fingerprint: str
    expected_terminal_state: str | None
    idempotency_key: str | None
    status_location: str | None
    started_at: float | None
    deadline_at: float | None
    business_deadline_at: float | None
    max_status_requests: int | None
    max_transport_failures: int | None
    max_rate_limited: int | None
    first_poll_after_seconds: float | None


def drop_registration(
    ws: Workspace,
    op: str,
    job: str,
    *,
    provider: str = "sim",
    spool: Spool | None = None,
    **fields: Unpack[RegistrationFields],
) -> str:
    """Register a job through the spool, as ``bide watch`` does, without a subprocess.

    ``fields`` are any other :class:`~replay.observations.Registration` fields (absolute times
    such as ``deadline_at``, budgets such as ``max_status_requests``). Returns the request id
    whose receipt the daemon writes. The daemon must have created the spool (started once);
    ``spool`` is another node's (default: the workspace config's).
    """
    rid = new_request_id()
    reg = msgspec.convert(
        {"operation_id": op, "provider": provider, "provider_job_id": job, **fields}, Registration
    )
    spool = spool or Spool(load_config(str(ws.config)).spool_dir)
    spool.drop(spool.incoming, rid, msgspec.json.encode(RegistrationFile(1, rid, reg)))
    return rid


def assert_provider_invariants(
    log: LoadedLog, received: list[RequestRecord], op: str, *, strict: bool = True
) -> list[StatusRequestIntended]:
    """What the provider saw is covered, request by request, by what bide recorded first.

    * The operation's intents are numbered 1..n in log order, each within the budget in force.
    * Every request the provider received is matched to its own intent: the latest intent
      written at or before the request arrived (``intent.at <= record.wall``), a different one
      for each request, in increasing order: no invisible extra request (S11, S13).
    * No request arrived after the deadline its intent was made under (S9, S13, S16).
    * No request arrived before a Retry-After or any scheduled ``next_poll_at`` that preceded
      its intent (S8, S20, S21).

    With ``strict`` (no crash in the run) every intent reached the provider and the request
    numbers are exactly the arrival order: request k is intent k. Without it (SIGKILL runs) an
    intent may have died before its request left, so only ``received <= intents`` holds.

    Returns the intents, in log order.
    """
    intents: list[StatusRequestIntended] = []
    unsent: set[int] = set()  # request numbers recorded as never sent
    guidance: list[float] = []  # per intent: the latest time bide had promised not to poll before
    promised = float("-inf")
    for _, ev in log.events:
        if ev.operation_id != op:
            continue
        if isinstance(ev, PollScheduled):
            promised = max(promised, ev.next_poll_at)
        elif isinstance(ev, ResponseClassified) and ev.retry_after_at is not None:
            promised = max(promised, ev.retry_after_at)
        elif isinstance(ev, StatusRequestIntended):
            intents.append(ev)
            guidance.append(promised)
            promised = float("-inf")
        elif isinstance(ev, TransportFailed) and ev.detail.startswith("not sent"):
            unsent.add(ev.request_number)  # recorded as never sent (S13: too near the deadline)
    numbers = [i.request_number for i in intents]
    assert numbers == list(range(1, len(intents) + 1)), f"{op}: intents numbered {numbers}"
    for intent in intents:
        assert intent.request_number <= intent.max_status_requests, (
            f"{op}: intent {intent.request_number} beyond the budget {intent.max_status_requests}"
        )
    # An intent recorded as never sent (too near its deadline once durable) has no request.
    sent = [
        (i, g) for i, g in zip(intents, guidance, strict=True) if i.request_number not in unsent
    ]
    assert len(received) <= len(sent), (
        f"{op}: the provider received {len(received)} requests, bide intended {len(sent)}"
    )
    if strict:
        assert len(received) == len(sent), (
            f"{op}: {len(sent)} intents sent but {len(received)} requests arrived (no crash)"
        )
    last = -1
    for arrival, record in enumerate(received):
        candidates = [k for k, (i, _) in enumerate(sent) if i.at <= record.wall]
        assert candidates, f"{op}: request {arrival + 1} arrived before any intent was written"
        k = candidates[-1]
        assert k > last, (
            f"{op}: request {arrival + 1} (at {record.wall:.3f}) has no intent of its own; "
            f"intent {k + 1} already covers an earlier request"
        )
        if strict:
            assert k == arrival, f"{op}: request {arrival + 1} arrived as intent {k + 1}"
        last = k
        intent, promised_before = sent[k]
        assert record.wall <= intent.deadline_at, (
            f"{op}: request {intent.request_number} arrived {record.wall - intent.deadline_at:.3f}"
            " s after the deadline"
        )
        assert record.wall >= promised_before, (
            f"{op}: request {intent.request_number} arrived {promised_before - record.wall:.3f} s "
            "before the time bide had scheduled (Retry-After, hint or backoff)"
        )
    return intents


def assert_snapshot_is_the_full_fold(ws: Workspace) -> int:
    """The snapshot on disk holds exactly what folding the whole log gives; its event count."""
    cfg = load_config(str(ws.config))
    keyring = open_keyring(cfg)
    snap = load_snapshot(
        cfg.snapshot_path, keyring, snapshot_keys(cfg, keys.keys_directory(cfg.keys_dir))
    )
    assert snap is not None
    full = replay_log(cfg.log_dir, keyring)
    assert snap.ledger.ops == full.ops
    assert snap.ledger.actions == full.actions
    assert snap.ledger.undecided == full.undecided
    assert snap.ledger.ended == full.ended
    assert snap.ledger.tombstones == full.tombstones
    assert snap.ledger.events == full.events
    return full.events


def exported(dsn: str, ws: Workspace, name: str) -> Path:
    """The database's log written as segment files (as ``bide log export`` does), read-only."""
    from eventlog import pgstore
    from eventlog.store import write_segments

    out = ws.root / f"export-{name}"
    with pgstore.connect(pgstore.PgSettings(dsn), read_only=True) as conn:
        write_segments(pgstore.iter_all(conn), out)
    return out


def verify_database(ws: Workspace, dsn: str) -> None:
    """The auditor's check of the chain in the database, with ``verify.pub`` alone."""
    out = subprocess.run(
        [*BIDE, "verify", "--dsn", dsn, "--verify-key", str(ws.root / "keys" / "verify.pub")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def assert_log_verifies(ws: Workspace) -> None:
    """``bide verify`` on the state dir's log. With PostgreSQL also the database's chain
    (``bide verify --dsn``), and the state dir's copy, which every other check here reads,
    holds exactly the database's records (the daemon is stopped)."""
    verified = ws.bide("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    if ws.dsn is None:
        return
    verify_database(ws, ws.dsn)
    export = exported(ws.dsn, ws, "final")
    assert _segments(load_config(str(ws.config)).log_dir) == _segments(export), (
        "the state dir's copy of the log is not the database's"
    )


def _segments(log_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for _, path in list_segments(log_dir)}
