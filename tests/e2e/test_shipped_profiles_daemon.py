"""The real daemon, waiting with each shipped profile (deploy/profiles/) on a simulator that
serves the provider's documented status bodies (tests/providers/fixtures/PROFILE/*.json).

One daemon run per profile registers one operation per fixture, each job answering its
fixture forever, and checks how the daemon ends every one: a success succeeds with the
results the profile requires, each failure kind stops as ``provider_failure`` with the
provider's error, cancel and expiry states stop as ``canceled`` and ``expired``, a state no
rule matches stops as ``unknown_state``, and a pending state keeps being polled. Only the
profile's address (the simulator's), its credential (the simulator's Bearer token; AWS keys
for the signed read) and its waiting times and quota differ from the shipped file; its URL
template and static headers are kept and checked on every request: Google's ``{+job_id}``
sends resource names with their slashes, Databricks' ``?run_id={job_id}`` the id in a query.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from daemon.profile import Profile, load_profile
from daemon.sample import read_sample
from replay.events import OperationStopped, OperationSucceeded
from tests.e2e.harness import Workspace, drop_registration, until, workspace
from tests.e2e.test_aws_step_functions import AWS_JSON, KEY_ID, SECRET
from tests.providers.test_shipped_profiles import CASES

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "deploy" / "profiles"
FIXTURES = ROOT / "tests" / "providers" / "fixtures"

#: How the daemon stops a wait on a job that ended without success, by category.
REASONS = {
    "failure": "provider_failure",
    "canceled": "canceled",
    "expired": "expired",
    "unknown": "unknown_state",
}


@dataclass(frozen=True)
class Api:
    """Where a shipped profile points, and what the simulator needs to answer it there."""

    address: str  # the status URL's fixed prefix, replaced by the simulator's ``path``
    credential: str | None  # the bearer token's file (the workspace's instead); None: AWS keys
    server: dict[str, object]  # the simulator's [server] table
    target: str = "/jobs/{id}"  # the request target the template gives for job ``id``
    path: str = "/jobs"


APIS = {
    "github-actions": Api(
        "https://api.github.com/repos/OWNER/REPO/actions/runs", "github.token", {}
    ),
    # {+job_id}: the resource name's slashes reach the provider as slashes.
    "google-lro": Api("https://SERVICE.googleapis.com/v1", "google.token", {"path_ids": True}),
    "databricks-runs": Api(
        "https://WORKSPACE.cloud.databricks.com/api/2.1/jobs/runs/get",
        "databricks.token",
        {"job_query": "run_id"},
        target="/jobs?run_id={id}",
    ),
    "kubernetes-job": Api(
        "https://APISERVER:6443/apis/batch/v1/namespaces/NAMESPACE/jobs", "kubernetes.token", {}
    ),
    "openai-batch": Api("https://api.openai.com/v1/batches", "openai.token", {}),
    "anthropic-batch": Api("https://api.anthropic.com/v1/messages/batches", "anthropic.key", {}),
    "azure-operation": Api(
        "https://RESOURCE.cognitiveservices.azure.com/operations",
        "azure.token",
        {},
        target="/jobs/{id}?api-version=2024-11-30",
    ),
    "replicate-prediction": Api("https://api.replicate.com/v1/predictions", "replicate.token", {}),
    # A signed POST read (AWS's JSON protocol), the signature verified by the simulator.
    "aws-step-functions": Api(
        "https://states.us-east-1.amazonaws.com/",
        None,
        {"aws_json": AWS_JSON},
        target="/",
        path="/",
    ),
}

#: Seconds, not minutes; a quota that lets one run poll a few dozen jobs at once.
TIMINGS = {
    "backoff_base_seconds": "0.2",
    "backoff_cap_seconds": "0.4",
    "rate_limited_delay_seconds": "1.0",
    "not_found_grace_seconds": "5",
    "requests_per_second": "200",
    "burst": "50",
}


def profile_for(name: str, base_url: str) -> str:
    """The shipped profile, its URL template, rules, results and headers untouched."""
    api = APIS[name]
    text = (PROFILES / f"{name}.toml").read_text()
    assert api.address in text, api.address
    text = text.replace(api.address, base_url + api.path)
    if api.credential is not None:
        text = text.replace(f'file = "{api.credential}"', 'file = "sim.token"')
    # The simulator takes the token as a Bearer credential only (Anthropic's is x-api-key).
    if 'header = "x-api-key"' in text:
        text, n = re.subn(r'header = "x-api-key"\nscheme = ""', 'header = "Authorization"', text)
        assert n == 1, "anthropic's credential header"
    for key, value in TIMINGS.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    return text


def pointer_parts(pointer: str) -> list[str]:
    return pointer.split("/")[1:]


def at(doc: Any, pointer: str) -> Any:
    for part in pointer_parts(pointer):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def with_job_id(doc: dict[str, Any], pointer: str, index: int) -> tuple[str, dict[str, Any]]:
    """A job id of the fixture's own (its id plus ``index``), written where the profile checks
    identity, so every fixture is a job of its own in one run."""
    *parents, last = pointer_parts(pointer)
    holder = at(doc, "/" + "/".join(parents)) if parents else doc
    original = holder[last]
    holder[last] = original + index if isinstance(original, int) else f"{original}-{index}"
    return str(holder[last]), doc


@dataclass(frozen=True)
class Case:
    """One fixture as one job: what the reference means by it, and the body served."""

    fixture: str
    state: str | None
    category: str
    op: str
    job_id: str
    body: str = field(repr=False)


def cases_of(profile: str) -> list[Case]:
    pointer = load_profile(PROFILES / f"{profile}.toml").contract.job_id_pointer
    assert pointer, profile
    out = []
    rows = [(f, s, c) for p, f, s, c in CASES if p == profile]
    for index, (fixture, state, category) in enumerate(rows, start=1):
        doc = json.loads((FIXTURES / profile / f"{fixture}.json").read_text())
        job_id, doc = with_job_id(doc, pointer, index)
        out.append(Case(fixture, state, category, f"{profile}-{index}", job_id, json.dumps(doc)))
    return out


def ended(ws: Workspace, cases: list[Case]) -> bool:
    """Every terminal fixture's operation has ended; every pending one was polled twice."""
    ops = ws.log().ops
    for case in cases:
        op = ops.get(case.op)
        if op is None:
            return False
        if case.category == "pending":
            if op.status_requests_used < 2 or op.in_flight is not None:
                return False
        elif op.phase == "live":
            return False
    return True


Ending = OperationSucceeded | OperationStopped


def assert_ended_as_documented(
    profile: Profile, case: Case, ending: Ending | None, shown: dict[str, Any]
) -> None:
    """How the daemon ended (or kept waiting on) one fixture's job, in its log and in
    ``bide status --json``."""
    what = f"{case.op}: {case.fixture}.json"
    assert shown["done"] is (case.category != "pending"), (what, shown)
    if case.category == "pending":
        assert ending is None, (what, ending)
        assert shown["phase"] == "live", (what, shown)
        return
    if case.category == "success":
        assert isinstance(ending, OperationSucceeded), (what, ending)
        for result in profile.contract.results:
            if result.required:
                assert ending.results.get(result.name), (what, result.name, ending.results)
        # The same results check-profile --sample reads from the same body.
        assert ending.results == read_sample(profile, case.body.encode())["results"], what
        assert shown["phase"] == "succeeded", (what, shown)
        return
    assert isinstance(ending, OperationStopped), (what, ending)
    assert ending.reason == REASONS[case.category], (what, ending)
    assert shown["stop_reason"] == ending.reason, (what, shown)
    assert shown["provider_error"] == ending.provider_error, (what, shown)
    if case.category == "failure":
        pointer = profile.contract.error_pointer
        assert pointer, profile
        assert ending.provider_error, (what, ending)
        # The provider's error, verbatim: a string as it is, anything else as JSON.
        value = at(json.loads(case.body), pointer)
        error = ending.provider_error
        assert (error if isinstance(value, str) else json.loads(error)) == value, what


@pytest.mark.parametrize("profile", sorted(APIS))
def test_s3_the_daemon_ends_every_documented_state_as_the_reference_means_it(
    tmp_path: Path, profile: str
) -> None:
    cases = cases_of(profile)
    jobs: dict[str, list[object]] = {c.job_id: [{"body": c.body}] for c in cases}
    with workspace(tmp_path, jobs, server=APIS[profile].server) as ws:
        (ws.root / "profiles" / f"{profile}.toml").write_text(profile_for(profile, ws.sim.base_url))
        if APIS[profile].credential is None:
            keys = ws.root / "creds" / f"{profile}.json"
            keys.write_text(json.dumps({"access_key_id": KEY_ID, "secret_access_key": SECRET}))
            keys.chmod(0o600)
        ws.start_daemon()
        for case in cases:
            drop_registration(ws, case.op, case.job_id, provider=profile)
        until(lambda: ended(ws, cases), 60, f"every {profile} fixture to be read")

        log = ws.log()
        listed = ws.bide("status", "--json")
        told = min(
            (c for c in cases if c.category in ("failure", "success")),
            key=lambda c: c.category != "failure",  # a failure's story if there is one
        )
        story = ws.bide("story", told.op).stdout
        check = ws.bide("replay", "--check")

    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 mismatch" in check.stdout
    assert listed.returncode == 0, listed.stdout + listed.stderr
    shown = {op["operation_id"]: op for op in json.loads(listed.stdout)}
    ends_as = "succeeded" if told.category == "success" else "stopped: provider_failure"
    assert f"state {told.state}, {ends_as}" in story, story
    print(f"--- {profile}/{told.fixture}.json\n{story}")

    endings: dict[str, Ending] = {}
    for _, event in log.events:
        if isinstance(event, Ending):
            assert event.operation_id not in endings, f"{event.operation_id} ended twice"
            endings[event.operation_id] = event
    loaded = load_profile(PROFILES / f"{profile}.toml")
    for case in cases:
        reads = ws.sim.requests(kind="status", job_id=case.job_id)
        assert reads, case
        assert {r.status for r in reads} == {200}, case
        assert len(reads) >= (2 if case.category == "pending" else 1), case
        # The shipped URL template and static headers reached the provider as they are.
        target = APIS[profile].target.format(id=case.job_id)
        assert {r.target for r in reads} == {target}, case
        for r in reads:
            sent = {name.lower(): value for name, value in r.headers}
            for name, value in loaded.status.headers.items():
                assert sent.get(name.lower()) == value, (case, name)
        if case.state is not None:
            assert log.ops[case.op].last_state == case.state, case
        assert_ended_as_documented(loaded, case, endings.get(case.op), shown[case.op])
