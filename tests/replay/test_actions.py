"""Submit, fetch and cancel as pure actions: S22 (202 contract), S29 (ambiguous submits), S36."""

from __future__ import annotations

import pytest

from replay.actions import (
    SubmitSpec,
    decide_action,
    evolve_action,
    fetch_target,
    fingerprint,
    fold_actions,
    judge_answer,
    judge_download,
    judge_unanswered,
    origin,
)
from replay.events import (
    ActionDecided,
    ActionFailed,
    ActionIntended,
    ActionSucceeded,
    ResponseHeaders,
    decode_log_event,
    encode_event,
)
from replay.observations import DecisionSubmitted

NOW = 1_800_000_000.0
STATUS_ORIGIN = "https://api.example:443"


def intent(kind: str = "submit", key: str | None = "k-1", attempt: int = 1) -> ActionIntended:
    return ActionIntended(
        operation_id="op",
        at=NOW,
        action_id=f"op.{kind}",
        kind=kind,  # type: ignore[arg-type]
        provider="p",
        method="POST",
        url="https://api.example/v1/jobs",
        request_fingerprint="f",
        idempotency_key=key,
        attempt=attempt,
        timeout_seconds=10,
        body=b'{"x":1}',
    )


LOC = ResponseHeaders(location="/v1/jobs/job%2F42")


@pytest.mark.parametrize(
    ("spec", "status", "headers", "oploc", "body", "expect"),
    [
        pytest.param(SubmitSpec(), 202, LOC, None, b"", ("job/42", None), id="S22-location-id"),
        pytest.param(
            SubmitSpec(status_from="location"),
            202,
            LOC,
            None,
            b"",
            ("job/42", "https://api.example/v1/jobs/job%2F42"),
            id="S22-location-status",
        ),
        pytest.param(
            SubmitSpec(job_id_from="operation-location", status_from="operation-location"),
            202,
            ResponseHeaders(),
            "https://api.example/ops/77",
            b"",
            ("77", "https://api.example/ops/77"),
            id="S22-operation-location",
        ),
        pytest.param(
            SubmitSpec(job_id_from="body", job_id_pointer="/id"),
            202,
            ResponseHeaders(),
            None,
            b'{"id": "b-9"}',
            ("b-9", None),
            id="S22-body-id",
        ),
        pytest.param(
            SubmitSpec(job_id_from="body", job_id_pointer="/id"),
            202,
            ResponseHeaders(),
            None,
            b'{"job": "b-9"}',
            "no job id",
            id="S22-body-without-id-is-contradiction",
        ),
        pytest.param(
            SubmitSpec(),
            202,
            ResponseHeaders(),
            None,
            b'{"id": "x"}',
            "no job id",
            id="S22-never-guessed-from-submit-url",
        ),
        pytest.param(
            SubmitSpec(status_from="location"),
            202,
            ResponseHeaders(location="https://evil.example/jobs/1"),
            None,
            b"",
            "is not the provider's origin",
            id="S22-cross-origin-status-refused",
        ),
        pytest.param(
            SubmitSpec(status_from="location", status_path_prefix="/v1/jobs/"),
            202,
            ResponseHeaders(location="/admin/users?export=all"),
            None,
            b"",
            "not under the profile's prefix '/v1/jobs/'",
            id="S22-status-outside-the-prefix-refused",
        ),
        pytest.param(
            SubmitSpec(status_from="location", status_path_prefix="/v1/jobs/"),
            202,
            ResponseHeaders(location="/v1/jobs/%2e%2e/admin/x"),
            None,
            b"",
            "dot segment",
            id="S22-encoded-dot-segment-refused",
        ),
        pytest.param(
            SubmitSpec(status_from="location"),
            202,
            ResponseHeaders(location="https://api.example:99999/v1/jobs/1"),
            None,
            b"",
            "does not parse",
            id="S22-bad-port-is-a-reason-not-a-crash",
        ),
        pytest.param(
            SubmitSpec(status_from="location"),
            202,
            ResponseHeaders(location="https://[::1/v1/jobs/1"),
            None,
            b"",
            "not a URL",
            id="S22-broken-ipv6-is-a-reason-not-a-crash",
        ),
        pytest.param(
            SubmitSpec(job_id_from="body", job_id_pointer="/id"),
            202,
            ResponseHeaders(),
            None,
            b"[" * 5000 + b"]" * 5000,
            "nests deeper than 64",
            id="S22-deep-body-is-a-reason-not-a-crash",
        ),
        pytest.param(
            SubmitSpec(job_id_from="body", job_id_pointer="/id"),
            202,
            ResponseHeaders(),
            None,
            b'{"id": "a\\u0000b"}',
            "not a printable id",
            id="S22-job-id-with-a-nul-refused",
        ),
    ],
)
def test_s22_accepted_submit_names_the_job_as_the_profile_says(
    spec: SubmitSpec,
    status: int,
    headers: ResponseHeaders,
    oploc: str | None,
    body: bytes,
    expect: tuple[str, str | None] | str,
) -> None:
    [out] = judge_answer(intent(), status, headers, oploc, body, spec, STATUS_ORIGIN, NOW)
    if isinstance(expect, str):
        assert isinstance(out, ActionFailed)
        assert out.reason == "submit_contradiction"
        assert expect in out.detail
        assert [o.id for o in out.options] == ["inspect_provider_console", "abandon"]
    else:
        assert isinstance(out, ActionSucceeded)
        assert (out.provider_job_id, out.status_location) == expect
        assert not out.final_result


def test_s22_200_with_result_recorded_as_final() -> None:
    [out] = judge_answer(intent(), 201, LOC, None, b"", SubmitSpec(), STATUS_ORIGIN, NOW)
    assert isinstance(out, ActionSucceeded)
    assert out.final_result


def test_submit_4xx_is_rejected_and_never_retried() -> None:
    [out] = judge_answer(
        intent(), 400, ResponseHeaders(), None, b"", SubmitSpec(idempotent=True), STATUS_ORIGIN, NOW
    )
    assert isinstance(out, ActionFailed)
    assert out.reason == "submit_rejected"
    assert not out.retry_scheduled


@pytest.mark.parametrize(
    ("idempotent", "key", "attempt", "kind", "expect"),
    [
        pytest.param(
            False,
            None,
            1,
            "read_timeout",
            ["inspect_provider_console", "abandon"],
            id="S29-ambiguous-not-idempotent-escalates",
        ),
        pytest.param(
            True,
            None,
            1,
            "read_timeout",
            ["inspect_provider_console", "abandon"],
            id="S29-idempotent-but-no-key-recorded-escalates",
        ),
        pytest.param(
            True,
            "k",
            1,
            "connection_reset",
            "retry",
            id="S29-idempotent-with-key-retries-automatically",
        ),
        pytest.param(
            True,
            "k",
            3,
            "read_timeout",
            ["retry_same_idempotency_key", "inspect_provider_console", "abandon"],
            id="S29-automatic-retries-bounded",
        ),
        pytest.param(
            False,
            None,
            1,
            None,
            ["inspect_provider_console", "abandon"],
            id="S29-daemon-died-between-intent-and-outcome",
        ),
        pytest.param(
            False,
            None,
            1,
            "connect_refused",
            ["retry_submit", "abandon"],
            id="never-delivered-offers-a-retry",
        ),
    ],
)
def test_s29_ambiguous_submit(
    idempotent: bool, key: str | None, attempt: int, kind: str | None, expect: list[str] | str
) -> None:
    spec = SubmitSpec(idempotent=idempotent, max_attempts=3)
    out = judge_unanswered(intent(key=key, attempt=attempt), kind, "", spec, NOW)  # type: ignore[arg-type]
    failed = out[0]
    assert isinstance(failed, ActionFailed)
    if expect == "retry":
        assert failed.retry_scheduled
        again = out[1]
        assert isinstance(again, ActionIntended)
        assert again.attempt == attempt + 1
        assert again.idempotency_key == key
        assert again.body == intent().body
    else:
        assert len(out) == 1
        assert [o.id for o in failed.options] == expect


def test_s29_5xx_answer_to_submit_is_ambiguous() -> None:
    [out] = judge_answer(
        intent(key=None), 503, ResponseHeaders(), None, b"", SubmitSpec(), STATUS_ORIGIN, NOW
    )
    assert isinstance(out, ActionFailed)
    assert out.reason == "submit_outcome_unknown"
    assert out.ambiguous


@pytest.mark.parametrize(
    ("status", "reason"), [(200, None), (409, "cancel_rejected"), (502, "cancel_outcome_unknown")]
)
def test_cancel_outcomes(status: int, reason: str | None) -> None:
    [out] = judge_answer(
        intent("cancel"), status, ResponseHeaders(), None, b"", None, STATUS_ORIGIN, NOW
    )
    if reason is None:
        assert isinstance(out, ActionSucceeded)
    else:
        assert isinstance(out, ActionFailed)
        assert out.reason == reason
        assert out.options


def test_fetch_failure_has_no_options() -> None:
    [out] = judge_unanswered(intent("fetch"), "read_timeout", "cut short", None, NOW)
    assert isinstance(out, ActionFailed)
    assert out.reason == "fetch_failed"
    assert out.options == ()


def test_s36_decision_names_an_offered_option_or_changes_nothing() -> None:
    events = [
        intent(key=None),
        *judge_unanswered(intent(key=None), "read_timeout", "", SubmitSpec(), NOW),
    ]
    action = fold_actions(events)["op.submit"]
    assert action.phase == "escalated"
    [bogus] = decide_action(
        action, DecisionSubmitted(option="retry_same_idempotency_key", approver="alice"), NOW + 1
    )
    assert isinstance(bogus, ActionDecided)
    assert not bogus.accepted
    assert evolve_action(action, bogus) == action
    [ok] = decide_action(action, DecisionSubmitted(option="abandon", approver="alice"), NOW + 2)
    assert isinstance(ok, ActionDecided)
    assert ok.accepted
    assert evolve_action(action, ok).phase == "closed"


def test_retry_decision_records_a_new_attempt_with_the_same_request() -> None:
    events = [intent(), *judge_unanswered(intent(), "connect_refused", "", SubmitSpec(), NOW)]
    action = fold_actions(events)["op.submit"]
    decided, again = decide_action(
        action, DecisionSubmitted(option="retry_submit", approver="bob"), NOW + 5
    )
    assert isinstance(again, ActionIntended)
    assert again.attempt == 2
    assert again.idempotency_key == "k-1"
    assert evolve_action(evolve_action(action, decided), again).phase == "in_flight"


def test_action_events_round_trip_through_the_log_codec() -> None:
    for ev in [intent(), *judge_unanswered(intent(), "read_timeout", "", SubmitSpec(), NOW)]:
        assert decode_log_event(encode_event(ev)) == ev


def test_fingerprint_and_origin() -> None:
    assert fingerprint("POST", "https://a/x", b"1") != fingerprint("POST", "https://a/x", b"2")
    assert fingerprint("post", "https://a/x", b"1") == fingerprint("POST", "https://a/x", b"1")
    assert origin("https://API.example/x") == origin("https://api.example:443/y")
    assert origin("http://api.example/x") != origin("https://api.example/x")


RESULTS = {"result_url": "https://cdn.example/r/1", "checksum": "abc"}


@pytest.mark.parametrize(
    ("phase", "results", "wanted", "expect"),
    [
        pytest.param(
            "succeeded",
            RESULTS,
            None,
            ("result_url", RESULTS["result_url"]),
            id="S1-the-one-url-result",
        ),
        pytest.param(
            "succeeded", RESULTS, "result_url", ("result_url", RESULTS["result_url"]), id="named"
        ),
        pytest.param("live", RESULTS, None, "has not succeeded", id="S1-live-refused"),
        pytest.param("escalated", RESULTS, None, "has not succeeded", id="S1-escalated-refused"),
        pytest.param(
            "succeeded", RESULTS, "checksum", "URL results: result_url", id="not-a-url-refused"
        ),
        pytest.param(
            "succeeded",
            {"a": "https://x/1", "b": "http://y/2"},
            None,
            "URL results: a, b",
            id="several-need-a-name",
        ),
        pytest.param(
            "succeeded",
            {"a": "file:///etc/passwd", "b": "ftp://x/1"},
            None,
            "URL results: none",
            id="only-http-schemes",
        ),
    ],
)
def test_fetch_only_a_validated_url_result_of_a_succeeded_operation(
    phase: str, results: dict[str, str], wanted: str | None, expect: tuple[str, str] | str
) -> None:
    got = fetch_target(phase, results, wanted)
    if isinstance(expect, str):
        assert isinstance(got, str)
        assert expect in got
    else:
        assert got == expect


def fetch_intent() -> ActionIntended:
    return ActionIntended(
        operation_id="op",
        at=NOW,
        action_id="op.fetch.1",
        kind="fetch",
        provider="p",
        method="GET",
        url="https://cdn.example/r/1",
        timeout_seconds=10,
        max_bytes=1000,
        result_name="result_url",
    )


@pytest.mark.parametrize(
    ("status", "truncated", "expect"),
    [
        pytest.param(200, False, None, id="2xx-whole-body"),
        pytest.param(206, False, None, id="any-2xx"),
        pytest.param(200, True, "larger than the cap of 1000 bytes", id="cut-at-the-cap"),
        pytest.param(302, False, "HTTP 302", id="redirect-not-followed"),
        pytest.param(404, False, "HTTP 404", id="missing"),
        pytest.param(503, False, "HTTP 503", id="server-error-not-retried"),
    ],
)
def test_download_judged_by_status_and_cap(
    status: int, truncated: bool, expect: str | None
) -> None:
    [out] = judge_download(fetch_intent(), status, 1000, truncated, "d" * 64, "op.fetch.1", NOW)
    if expect is None:
        assert isinstance(out, ActionSucceeded)
        assert (out.size, out.sha256, out.stored_as) == (1000, "d" * 64, "op.fetch.1")
    else:
        assert isinstance(out, ActionFailed)
        assert (out.reason, out.detail, out.http_status) == ("fetch_failed", expect, status)
        assert out.options == ()  # fetching again is a new request, never automatic
        assert not out.retry_scheduled
