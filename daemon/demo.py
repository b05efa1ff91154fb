"""``bide demo``: every polling path, end to end, in under 30 seconds.

The built-in simulator serves one scripted job per scenario on 127.0.0.1; the real supervisor
runs in this process on a fresh log with fresh keys; each scenario is registered through the
spool, exactly as ``bide watch`` does; durations are scaled down (backoff in fractions of a
second, deadlines in seconds). When every operation has ended, the demo prints one line per
scenario, each story, the offline verify summary and the ``replay --check`` result, and exits
0 only if every scenario ended as expected and both checks pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import msgspec

from daemon import logfmt
from daemon.config import load_config
from daemon.readers import load_log
from daemon.simulator import SimulatorHandle, run_in_thread, script_from_dict
from daemon.spool import FetchFile, RegistrationFile, Spool, SubmitFile, new_request_id
from daemon.supervisor import Supervisor
from eventlog import keys
from eventlog.verify import verify_log
from replay.actions import action_story
from replay.check import check
from replay.observations import Registration
from replay.state import Operation
from replay.story import for_people, story_json

DEMO_TOKEN_BYTES = 24
TIME_LIMIT = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    steps: Sequence[object]
    expect_phase: str
    expect_reason: str | None = None
    registration: dict[str, object] = field(default_factory=dict)
    submit: bool = False  # bide submits it (202 + Location), then fetches the result


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "quick-success", "quick success", "queued, running, succeeded with result", "succeeded"
    ),
    Scenario(
        "retry-after",
        "503 with Retry-After honoured",
        [
            {"status": 503, "retry_after": 1},
            {"status": 503, "retry_after_date": 2},
            "succeeded with result",
        ],
        "succeeded",
    ),
    Scenario(
        "rate-limited",
        "429 storm ending in rate_limited",
        [{"status": 429}],
        "escalated",
        "rate_limited",
    ),
    Scenario(
        "unknown-state",
        "a state never seen before",
        "queued, manual_review",
        "escalated",
        "unknown_state",
    ),
    Scenario(
        "auth-denied",
        "authorization denied",
        [{"status": 401}],
        "escalated",
        "authorization_denied",
    ),
    Scenario(
        "no-result",
        "success without the result reference",
        "queued, succeeded",
        "escalated",
        "contradiction",
    ),
    Scenario(
        "eventual-404",
        "404 right after submit, then success",
        [{"status": 404, "times": 2}, "succeeded with result"],
        "succeeded",
    ),
    Scenario(
        "deadline",
        "deadline exceeded while running",
        "running",
        "escalated",
        "deadline_exceeded",
        {"deadline_seconds": 3.0},
    ),
    Scenario(
        "budget",
        "request budget exhausted",
        "running",
        "escalated",
        "request_budget_exhausted",
        {"max_status_requests": 4},
    ),
    Scenario(
        "hints",
        "provider hints honoured, bogus ones rejected",
        [
            {"state": "running", "poll_after_seconds": 1},
            {"state": "running", "poll_after_seconds": -5},
            {"state": "running", "next_check_in": 86400 * 30},
            "succeeded with result",
        ],
        "succeeded",
    ),
    Scenario(
        "submit-fetch",
        "submitted by bide (202 + Location), polled, result fetched",
        "queued, running, succeeded with result",
        "succeeded",
        submit=True,
    ),
)

CONTRACT = """\
state_pointer = "/status"
job_id_pointer = "/id"
results = [{ name = "result_url", pointer = "/result_url", kind = "url" }]
next_check_at_pointer = "/next_check_at"
poll_after_seconds_pointer = "/poll_after_seconds"
expires_at_pointer = "/expires_at"
error_pointer = "/error"
backoff_base_seconds = 0.25
backoff_cap_seconds = 1.0
rate_limited_delay_seconds = 2.0
min_hint_seconds = 0.1
max_hint_horizon_seconds = 600
not_found_grace_seconds = 10
default_deadline_seconds = 25
default_max_status_requests = 10
default_max_rate_limited = 3

[contract.states]
pending = ["queued", "running"]
success = ["succeeded"]
failure = ["failed"]
canceled = ["canceled"]
expired = ["expired"]
"""


def _write_workspace(root: Path, sim: SimulatorHandle, token: str) -> Path:
    for sub in ("profiles", "creds"):
        (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    cred = root / "creds" / "demo.token"
    fd = os.open(cred, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    if not (root / "keys" / keys.DATA_KEY).exists():
        keys.generate(root / "keys")
    (root / "profiles" / "demo.toml").write_text(
        f'[status]\nurl = "{sim.base_url}/jobs/{{job_id}}"\ntimeout_seconds = 2\n\n'
        f'[submit]\nurl = "{sim.base_url}/jobs"\ntimeout_seconds = 2\n'
        f'idempotency_header = "Idempotency-Key"\n\n[fetch]\nmax_bytes = 1000000\n'
        f"timeout_seconds = 5\n\n"
        f'[credential]\nfile = "demo.token"\n\n[quota]\nrequests_per_second = 50\n'
        f"max_in_flight = 8\n\n[contract]\n{CONTRACT}"
    )
    config = root / "bide.toml"
    config.write_text(
        "# Written by `bide demo --keep`; every reader command works on it:\n"
        "#   bide status --config THIS   bide story OP --config THIS   bide verify --config THIS\n"
        '[paths]\nstate_dir = "state"\nkeys_dir = "keys"\nprofiles_dir = "profiles"\n'
        'credentials_dir = "creds"\n\n[log]\ncheckpoint_every = 100\n'
        "checkpoint_interval_seconds = 5\n\n"
        '[metrics]\nlisten = "127.0.0.1:0"   # the demo scrapes it once into metrics.txt\n'
    )
    return config


def _register(spool: Spool, scenario: Scenario, now: float) -> None:
    reg = dict(scenario.registration)
    deadline = reg.pop("deadline_seconds", None)
    if deadline is not None:
        reg["deadline_at"] = now + float(str(deadline))
    registration = msgspec.convert(
        {
            "operation_id": scenario.name,
            "provider": "demo",
            "provider_job_id": scenario.name,
            **reg,
        },
        Registration,
    )
    rid = new_request_id()
    request: RegistrationFile | SubmitFile = (
        SubmitFile(1, rid, "submit", registration, msgspec.json.encode({"scenario": scenario.name}))
        if scenario.submit
        else RegistrationFile(1, rid, registration)
    )
    spool.drop(spool.incoming, rid, msgspec.json.encode(request))


def _fetch(spool: Spool, operation_id: str) -> None:
    rid = new_request_id()
    spool.drop(spool.incoming, rid, msgspec.json.encode(FetchFile(1, rid, "fetch", operation_id)))


async def _drive(supervisor: Supervisor, spool: Spool, limit: float) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.run)
        now = time.time()
        for scenario in SCENARIOS:
            _register(spool, scenario, now)
        names = {s.name for s in SCENARIOS}

        def all_ended() -> bool:
            ops = supervisor.ops
            return names <= ops.keys() and all(ops[n].phase != "live" for n in names)

        def all_fetched() -> bool:
            done = {
                a.operation_id
                for a in supervisor.runner.actions.values()
                if a.kind == "fetch" and a.phase in ("succeeded", "failed")
            }
            return wanted <= done

        wanted: set[str] = set()
        with anyio.move_on_after(limit):
            await supervisor.wait_until(all_ended)
            wanted = {
                s.name
                for s in SCENARIOS
                if s.submit and supervisor.ops[s.name].phase == "succeeded"
            }
            for name in wanted:
                _fetch(spool, name)
            await supervisor.wait_until(all_fetched)
            if supervisor.metrics_url is not None:
                async with httpx.AsyncClient(trust_env=False) as client:
                    scraped = await client.get(supervisor.metrics_url, timeout=5)
                (supervisor.config.path.parent / "metrics.txt").write_text(scraped.text)
        supervisor.request_stop()


def _outcome(op: Operation | None, scenario: Scenario) -> tuple[bool, str]:
    if op is None:
        return False, "never registered"
    ok = op.phase == scenario.expect_phase and op.stop_reason == scenario.expect_reason
    return ok, op.phase + (f" {op.stop_reason}" if op.stop_reason else "")


def run_demo(keep: Path | None, *, show_stories: bool = True) -> int:
    root = keep if keep is not None else Path(tempfile.mkdtemp(prefix="bide-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    if (root / "state").exists():
        shutil.rmtree(root / "state")
    token = os.urandom(DEMO_TOKEN_BYTES).hex()
    script = script_from_dict(
        {
            "jobs": {s.name: {"steps": s.steps} for s in SCENARIOS if not s.submit},
            "scenarios": {s.name: {"steps": s.steps} for s in SCENARIOS if s.submit},
        }
    )
    started = time.monotonic()
    try:
        with run_in_thread(script, token=token) as sim:
            config_path = _write_workspace(root, sim, token)
            cfg = load_config(str(config_path))
            print(f"bide demo: simulator on {sim.base_url}, log in {cfg.log_dir}")
            keyring = keys.load_keyring(root / "keys")
            supervisor = Supervisor(cfg, keyring, keys.load_signer(root / "keys"))
            with (root / "daemon.log").open("w") as daemon_log:
                logfmt.set_stream(daemon_log)
                try:
                    anyio.run(_drive, supervisor, Spool(cfg.spool_dir), TIME_LIMIT)
                finally:
                    logfmt.set_stream(None)
            seen = {s.name: len(sim.requests(kind="status", job_id=s.name)) for s in SCENARIOS}
            submitted = [r.job_id for r in sim.requests(kind="submit")]
            for s in SCENARIOS:
                if s.submit:
                    seen[s.name] = len(
                        [r for r in sim.requests(kind="status") if r.job_id in submitted]
                    )
        return _report(root, cfg.log_dir, keyring, seen, time.monotonic() - started, show_stories)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _report(
    root: Path,
    log_dir: Path,
    keyring: keys.KeyRing,
    seen: dict[str, int],
    elapsed: float,
    show_stories: bool,
) -> int:
    log = load_log(log_dir, keyring)
    all_ok = True
    print(f"\n{'scenario':<15} {'result':<4} {'outcome':<34} {'requests':>9}  provider saw")
    for scenario in SCENARIOS:
        op = log.ops.get(scenario.name)
        ok, outcome = _outcome(op, scenario)
        if scenario.submit:
            fetched = [
                a
                for a in log.actions.values()
                if a.operation_id == scenario.name and a.kind == "fetch" and a.phase == "succeeded"
            ]
            ok = ok and len(fetched) == 1
            outcome += ", fetched" if fetched else ", NOT fetched"
        all_ok &= ok
        used = f"{op.status_requests_used}/{op.max_status_requests}" if op else "-"
        print(
            f"{scenario.name:<15} {'ok' if ok else 'FAIL':<4} {outcome:<34} {used:>9}  "
            f"{seen[scenario.name]}  ({scenario.title})"
        )
    if show_stories:
        for scenario in SCENARIOS:
            events = [e for _, e in log.events if e.operation_id == scenario.name]
            actions = [e for e in log.action_events if e.operation_id == scenario.name]
            lines = sorted(
                [*story_json(events), *action_story(actions)],
                key=lambda line: float(str(line["at"])),
            )
            print(f"\n== {scenario.name}: {scenario.title}")
            print(for_people(lines), end="")
    verify_key = keys.load_verify_key(root / "keys" / keys.VERIFY_KEY)
    report = verify_log(log_dir, verify_key)
    mismatches = check([e for _, e in log.events])
    print(f"\nverify (offline, verify.pub only): {report.summary()}")
    print(
        f"replay --check: {len(log.events)} events re-derived, {len(mismatches)} mismatch(es)"
        f" ({len(log.action_events)} action events recorded beside them)"
    )
    passed = all_ok and report.exit_status == 0 and not mismatches
    print(
        f"\nbide demo: {'all scenarios ended as expected' if all_ok else 'SCENARIO FAILED'}; "
        f"verify {report.verdict}; {elapsed:.1f}s"
    )
    return 0 if passed else 1
