"""Profiles with state rules: the TOML syntax, its errors (file, line, key, nearest valid
word), and the job id's place in the URL ({job_id} in a path or a query, {+job_id} a path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import ConfigError
from daemon.profile import encode_path_id, load_profile
from replay.signals import check_provider_url

HEAD = """\
[status]
url = "https://api.example.com/v1/runs/{job_id}"

[contract]
job_id_pointer = "/id"
"""

GOOD_RULES = """
[[contract.state_rules]]
state = "running"
category = "pending"
when = { "/status" = "running" }

[[contract.state_rules]]
state = "failed"
category = "failure"
when = { "/status" = "done", "/ok" = false }

[[contract.state_rules]]
state = "succeeded"
category = "success"
when = { "/status" = "done", "/ok" = true, "/output" = { present = true } }
"""


def write(tmp_path: Path, text: str, name: str = "prov") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_profile(write(tmp_path, text))
    return str(info.value)


def test_rules_load_and_name_their_states(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, HEAD + GOOD_RULES))
    assert [r.state for r in profile.contract.state_rules] == ["running", "failed", "succeeded"]
    assert profile.contract.success_states == ("succeeded",)


def test_an_unknown_category_names_the_nearest(tmp_path: Path) -> None:
    message = refused(tmp_path, HEAD + GOOD_RULES.replace('"failure"', '"failed"'))
    assert "prov.toml:14: contract.state_rules[2].category" in message  # the key, not [[...]]
    assert "did you mean 'failure'?" in message


def test_an_unknown_condition_names_the_nearest(tmp_path: Path) -> None:
    message = refused(tmp_path, HEAD + GOOD_RULES.replace("present = true", "presnt = true"))
    assert 'contract.state_rules[3].when."/output".presnt' in message
    assert "did you mean 'present'?" in message


def test_an_unknown_rule_key_names_the_nearest(tmp_path: Path) -> None:
    message = refused(tmp_path, HEAD + GOOD_RULES.replace('state = "running"', 'stat = "running"'))
    assert "contract.state_rules[1].stat: unknown key; did you mean 'state'?" in message


def test_a_rule_that_can_never_match_is_refused(tmp_path: Path) -> None:
    text = GOOD_RULES.replace('"/ok" = false }', '"/ok" = false, "/ok/x" = 1 }')
    assert "can never match" in refused(tmp_path, HEAD + text)


def test_overlapping_rules_of_different_categories_are_refused(tmp_path: Path) -> None:
    # The natural mistake: "done" read as success before the failure is ruled out.
    text = HEAD + GOOD_RULES.replace('"/status" = "done", "/ok" = true, ', '"/status" = "done", ')
    message = refused(tmp_path, text)
    assert "can both match one body" in message
    assert "fallback = true" in message


def test_rules_and_a_state_table_are_one_or_the_other(tmp_path: Path) -> None:
    text = HEAD + 'state_pointer = "/status"\n' + GOOD_RULES
    assert "give one form, not both" in refused(tmp_path, text)


def test_a_documented_state_left_unclassified_is_refused(tmp_path: Path) -> None:
    text = HEAD + '\n[contract.documented_states]\n"/status" = ["running", "done", "paused"]\n'
    message = refused(tmp_path, text + GOOD_RULES)
    assert 'documented state "paused" at /status is classified by no rule' in message


def test_a_query_template_carries_the_id_encoded(tmp_path: Path) -> None:
    text = HEAD.replace("/v1/runs/{job_id}", "/api/2.1/jobs/runs/get?run_id={job_id}")
    profile = load_profile(write(tmp_path, text + GOOD_RULES))
    url = profile.status_url("455644833")
    assert url == "https://api.example.com/api/2.1/jobs/runs/get?run_id=455644833"
    assert profile.status_url("1&x=2#f").endswith("?run_id=1%26x%3D2%23f")
    assert check_provider_url(url, profile.origin, profile.status_path_prefix) is None


def test_a_path_id_keeps_its_slashes_and_nothing_else(tmp_path: Path) -> None:
    text = HEAD.replace("/v1/runs/{job_id}", "/v1/{+job_id}")
    profile = load_profile(write(tmp_path, text + GOOD_RULES))
    name = "projects/p/locations/us-central1/operations/o-1"
    url = profile.status_url(name)
    assert url == f"https://api.example.com/v1/{name}"
    assert check_provider_url(url, profile.origin, profile.status_path_prefix) is None
    assert profile.status_url("a/b?c#d e%") == "https://api.example.com/v1/a/b%3Fc%23d%20e%25"


@pytest.mark.parametrize("job_id", ["../admin", "a/../../b", "a//b", "/a", "a/", "a/./b", ""])
def test_a_path_id_that_could_leave_the_prefix_is_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="empty or dot segment"):
        encode_path_id(job_id)


def test_a_path_placeholder_belongs_in_the_path(tmp_path: Path) -> None:
    text = HEAD.replace("/v1/runs/{job_id}", "/v1/runs?name={+job_id}")
    assert "belongs in the URL's path" in refused(tmp_path, text + GOOD_RULES)
