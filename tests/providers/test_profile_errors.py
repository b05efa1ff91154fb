"""`bide check-profile` errors name the file, the line of the key itself (inside the N-th
``[[contract.state_rules]]``, inside an inline table, in a multi-line array), and for an
unknown key or value the nearest valid one; pointers and patterns are explained in words."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from msgspec import inspect

from daemon.awssign import AwsSigning
from daemon.profile import _PATTERN_WORDS, ProfileFile
from replay.contract import Contract
from replay.rules import Condition, StateRule
from tests.e2e.harness import BIDE

PROFILE = """\
[status]
url = "https://api.example.com/v1/runs/{job_id}"
timeout_seconds = 10

[contract]
job_id_pointer = "/id"
results = [
  { name = "output", pointer = "/output", kind = "https_url" },
  { name = "size", pointer = "/size", kind = "present" },
]

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
when = { "/status" = "done", "/ok" = true }
"""


def check(tmp_path: Path, old: str, new: str, count: int = 1) -> tuple[Path, int, str]:
    """Write PROFILE with ``old`` replaced by ``new`` (its last ``count`` occurrences' first);
    return the file, the line the mistake is on, and check-profile's output."""
    text = PROFILE
    assert old in text
    cut = text.rindex(old) if count == -1 else text.index(old)
    text = text[:cut] + new + text[cut + len(old) :]
    line = text[:cut].count("\n") + 1
    path = tmp_path / "prov.toml"
    path.write_text(text)
    out = subprocess.run(
        [*BIDE, "check-profile", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return path, line, out.stdout + out.stderr


def test_the_shared_profile_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "prov.toml"
    path.write_text(PROFILE)
    out = subprocess.run(
        [*BIDE, "check-profile", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_wrong_category_in_the_third_rule(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'category = "success"', 'category = "sucess"')
    assert line == 24
    assert f"{path}:24: contract.state_rules[3].category: " in out
    assert "did you mean 'success'?" in out


def test_an_unknown_key_inside_a_rule(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'state = "failed"', 'stat = "failed"')
    assert f"{path}:{line}: contract.state_rules[2].stat: unknown key" in out
    assert "did you mean 'state'?" in out


def test_a_bad_pointer_in_when_is_explained_on_the_line_of_when(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, '{ "/status" = "done", "/ok" = true }', '{ "status" = "x" }')
    assert f'{path}:{line}: contract.state_rules[3].when."status": ' in out
    assert 'must start with "/"' in out
    assert 'write "/status"' in out


def test_a_tilde_in_a_pointer_is_explained_in_words(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, '"/ok" = false', '"/o~k" = false')
    assert f"{path}:{line}: " in out
    assert '"~" is written "~0"' in out


def test_an_unknown_result_kind_on_its_line_in_a_multiline_array(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'kind = "present"', 'kind = "presnt"')
    assert line == 9
    assert f"{path}:9: contract.results[2].kind: 'presnt' is not valid" in out
    assert "did you mean 'present'?" in out


def test_a_result_pointer_is_explained_in_words_not_a_regex(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'pointer = "/size"', 'pointer = "size"')
    assert f"{path}:{line}: contract.results[2].pointer: 'size' is not a JSON pointer: " in out
    assert 'it must start with "/" (write "/size"' in out
    assert "regex" not in out


def test_a_state_pointer_without_its_slash_is_explained_on_its_own_line(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'job_id_pointer = "/id"', 'job_id_pointer = "status/state"')
    assert line == 6
    assert f"{path}:6: contract.job_id_pointer: 'status/state' is not a JSON pointer: " in out
    assert 'write "/status/state"' in out


def test_a_header_name_with_a_space_is_explained_in_words(tmp_path: Path) -> None:
    path, line, out = check(
        tmp_path,
        'job_id_pointer = "/id"',
        'job_id_pointer = "/id"\nrate_limit_remaining_header = "x remaining"\n'
        'rate_limit_reset_header = "x-reset"',
    )
    assert f"{path}:{line + 1}: contract.rate_limit_remaining_header: must be an HTTP header" in out
    assert "got 'x remaining'" in out
    assert "regex" not in out


def test_a_status_url_without_a_scheme_says_what_it_must_be(tmp_path: Path) -> None:
    path, line, out = check(
        tmp_path, "https://api.example.com/v1/runs/{job_id}", "api.example.com/v1/runs/{job_id}"
    )
    assert line == 2
    assert (
        f"{path}:2: status.url: must be an http:// or https:// URL with a host, "
        f"got 'api.example.com/v1/runs/{{job_id}}'"
    ) in out


def test_a_url_is_shown_without_its_query_or_userinfo(tmp_path: Path) -> None:
    path, _line, out = check(
        tmp_path,
        "https://api.example.com/v1/runs/{job_id}",
        "ftp://user:hunter2@api.example.com/v1/runs/{job_id}?key=s3cret",
    )
    assert f"{path}:2: status.url: must be an http:// or https:// URL with a host" in out
    assert "ftp://api.example.com/v1/runs/{job_id}?..." in out
    assert "hunter2" not in out
    assert "s3cret" not in out


def test_a_check_between_two_keys_points_at_the_first_key_it_names(tmp_path: Path) -> None:
    path, line, out = check(
        tmp_path, 'job_id_pointer = "/id"', 'job_id_pointer = "/id"\nbackoff_cap_seconds = 1'
    )
    assert f"{path}:{line + 1}: contract.backoff_cap_seconds: backoff_cap_seconds must be" in out


def test_invalid_toml_names_its_line(tmp_path: Path) -> None:
    path, _line, out = check(tmp_path, "timeout_seconds = 10", "timeout_seconds = ")
    assert f"{path}:3: not valid TOML: " in out


def test_an_unknown_top_level_table(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, "[contract]\n", "[qouta]\nburst = 2\n\n[contract]\n")
    assert f"{path}:{line}: qouta: unknown key" in out
    assert "did you mean 'quota'?" in out


def test_a_misspelt_key_in_status(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, "timeout_seconds = 10", "timeout_second = 10")
    assert line == 3
    assert f"{path}:3: status.timeout_second: unknown key" in out
    assert "did you mean 'timeout_seconds'?" in out


def test_an_unknown_contract_key(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'job_id_pointer = "/id"', 'job_id_pointr = "/id"')
    assert f"{path}:{line}: contract.job_id_pointr: unknown key" in out
    assert "did you mean 'job_id_pointer'?" in out


def test_a_value_out_of_range_points_at_its_key(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, "timeout_seconds = 10", "timeout_seconds = 0")
    assert f"{path}:{line}: status.timeout_seconds: must be a number > 0.0, got 0" in out


def test_an_unknown_condition_operator(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, '"/ok" = true', '"/ok" = { presnt = true }')
    assert f'{path}:{line}: contract.state_rules[3].when."/ok".presnt: unknown condition' in out
    assert "did you mean 'present'?" in out


def test_an_unknown_key_in_a_result_is_refused_not_dropped(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'kind = "present"', 'knd = "present"')
    assert f"{path}:{line}: contract.results[2].knd: unknown key; did you mean 'kind'?" in out


def test_a_misspelt_state_category_is_refused_not_dropped(tmp_path: Path) -> None:
    text = PROFILE.split("[[contract.state_rules]]")[0] + (
        'state_pointer = "/status"\n\n[contract.states]\n'
        'success = ["done"]\ncanceld = ["cancelled"]\n'
    )
    path = tmp_path / "prov.toml"
    path.write_text(text)
    out = subprocess.run(
        [*BIDE, "check-profile", str(path)], capture_output=True, text=True, timeout=30
    )
    line = text.splitlines().index('canceld = ["cancelled"]') + 1
    assert f"{path}:{line}: contract.states.canceld: unknown key; did you mean 'canceled'?" in (
        out.stdout + out.stderr
    )


def test_overlapping_rules_point_at_the_rule_named_first(tmp_path: Path) -> None:
    # Rule 3 now matches every "done" body, as rule 2 (a failure) does.
    path, _, out = check(tmp_path, '"/status" = "done", "/ok" = true', '"/status" = "done"')
    assert f"{path}:22: contract.state_rules: rule 3 ('succeeded', success) and rule 2" in out


def test_a_cancel_documented_without_cancel_points_at_its_key(tmp_path: Path) -> None:
    path, line, out = check(tmp_path, 'job_id_pointer = "/id"', "cancel_documented = true")
    assert f"{path}:{line}: contract.cancel_documented is true but the profile has no" in out


def test_a_body_job_id_without_pointer_points_at_job_id_from(tmp_path: Path) -> None:
    submit = '[submit]\nurl = "https://api.example.com/v1/runs"\njob_id_from = "body"\n\n'
    path, line, out = check(tmp_path, "[contract]\n", submit + "[contract]\n")
    assert f'{path}:{line + 2}: submit.job_id_from is "body"' in out


def test_a_state_of_the_wrong_type_is_said_in_words(tmp_path: Path) -> None:
    text = PROFILE.split("[[contract.state_rules]]")[0] + (
        'state_pointer = "/status"\n\n[contract.states]\nsuccess = ["done"]\nfailure = [1]\n'
    )
    path = tmp_path / "prov.toml"
    path.write_text(text)
    out = subprocess.run(
        [*BIDE, "check-profile", str(path)], capture_output=True, text=True, timeout=30
    )
    line = text.count("\n")
    assert (
        f"{path}:{line}: contract.states.failure[1]: must be a string in quotes, got a whole number"
    ) in out.stdout + out.stderr


def test_a_documented_state_pointer_is_explained_on_its_key(tmp_path: Path) -> None:
    path, line, out = check(
        tmp_path,
        'job_id_pointer = "/id"',
        'job_id_pointer = "/id"\ndocumented_states = { "status" = ["running", "done"] }',
    )
    assert (
        f"{path}:{line + 1}: contract.documented_states: 'status' is not a JSON pointer: it must "
        f'start with "/"'
    ) in out
    assert "regex" not in out


def test_a_documented_state_no_rule_reads_is_on_the_documented_line(tmp_path: Path) -> None:
    path, line, out = check(
        tmp_path,
        'job_id_pointer = "/id"',
        'job_id_pointer = "/id"\ndocumented_states = { "/status" = ["running", "done", "lost"] }',
    )
    assert (
        f'{path}:{line + 1}: contract.documented_states: documented state "lost" at /status is '
        f"classified by no rule"
    ) in out


def _patterns(tp: object, done: set[type]) -> set[str]:
    if isinstance(tp, inspect.StructType):
        if tp.cls in done:
            return set()
        done.add(tp.cls)
        return set().union(*(_patterns(f.type, done) for f in tp.fields))
    found = {tp.pattern} if isinstance(tp, inspect.StrType) and tp.pattern else set()
    for attr in ("types", "item_type", "key_type", "value_type"):
        inner = getattr(tp, attr, None)
        for t in inner if isinstance(inner, tuple) else (inner,) if inner is not None else ():
            found |= _patterns(t, done)
    return found


def test_every_pattern_a_profile_is_checked_against_has_words() -> None:
    """No profile error shows a regex: each pattern in the structs that read a profile is
    explained in daemon/profile.py's _PATTERN_WORDS."""
    done: set[type] = set()
    patterns = set().union(
        *(
            _patterns(inspect.type_info(cls), done)
            for cls in (ProfileFile, Contract, StateRule, Condition, AwsSigning)
        )
    )
    assert patterns - set(_PATTERN_WORDS) == set()


def test_a_bad_aws_region_is_said_in_words(tmp_path: Path) -> None:
    pytest.importorskip("botocore")
    path, line, out = check(
        tmp_path,
        "[contract]\n",
        '[aws]\nregion = "useast1"\nservice = "states"\n\n[contract]\n',
    )
    assert f'{path}:{line + 1}: aws.region: must be an AWS region, e.g. "us-east-1"' in out
    assert "got 'useast1'" in out
