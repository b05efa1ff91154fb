"""Every number a user or an agent types is finite and in range, or an error naming the flag
(issue 14): never a silent default in place of a value that was given."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.errors import UsageError
from daemon.inputs import (
    MAX_DURATION_SECONDS,
    count_arg,
    parse_count,
    parse_duration,
    parse_time,
    seconds_arg,
)

BIDE = [sys.executable, "-m", "daemon.cli"]
HOSTILE = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "-0",
    "-1",
    "1e308",
    "1e3",
    "0x10",
    "1_000",
    " ",
    "",
    "1" * 10_000,
    "9" * 400,
    "1.5.2",
    "١٢",
    "5m-",
    "-5m",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_durations_are_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(UsageError, match="--deadline"):
        parse_duration(text, "--deadline")


@pytest.mark.parametrize("text", [*HOSTILE, "0", "1000001", "2.5"])
def test_hostile_counts_are_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(UsageError, match="--max-requests"):
        parse_count(text, "--max-requests")


@given(st.text(max_size=80) | st.floats().map(repr) | st.integers().map(str))
def test_duration_parser_returns_a_finite_in_range_value_or_refuses(text: str) -> None:
    try:
        value = parse_duration(text, "--deadline")
    except UsageError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert "--deadline" in message
        return
    assert math.isfinite(value)
    assert 0 < value <= MAX_DURATION_SECONDS
    assert math.copysign(1.0, value) == 1.0  # never -0.0


@given(st.text(max_size=80) | st.integers().map(str))
def test_count_parser_returns_an_in_range_integer_or_refuses(text: str) -> None:
    try:
        value = parse_count(text, "--max-requests", minimum=1, maximum=1000)
    except UsageError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert "--max-requests" in message
        return
    assert 1 <= value <= 1000


@given(st.text(max_size=80))
def test_time_parser_refuses_or_gives_a_plausible_time(text: str) -> None:
    try:
        value = parse_time(text, "--business-deadline", now=1_800_000_000.0)
    except UsageError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert "--business-deadline" in message
        return
    assert math.isfinite(value)
    assert 946_684_800 <= value <= 7_258_118_400 + MAX_DURATION_SECONDS


def test_durations_in_every_accepted_form() -> None:
    assert parse_duration("90", "--x") == 90
    assert parse_duration("1h30m", "--x") == 5400
    assert parse_duration("2d", "--x") == 172800
    assert parse_duration("0", "--timeout", allow_zero=True) == 0
    with pytest.raises(UsageError, match="more than zero"):
        parse_duration("0s", "--deadline")
    with pytest.raises(UsageError, match="out of range"):
        parse_duration("3651d", "--deadline")


def test_argparse_types_refuse_with_the_flag_and_range() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--max-requests", type=count_arg(1, 100))
    parser.add_argument("--wait-seconds", type=seconds_arg(0, 60, allow_zero=True))
    assert parser.parse_args(["--max-requests", "7", "--wait-seconds", "0"]).wait_seconds == 0
    for flag, value in (
        ("--max-requests", "101"),
        ("--max-requests", "nan"),
        ("--wait-seconds", "inf"),
        ("--wait-seconds", "61"),
    ):
        with pytest.raises(argparse.ArgumentError, match=flag):
            parser.parse_args([flag, value])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--deadline", "nan"),
        ("--deadline", "inf"),
        ("--deadline", "1e300"),
        ("--deadline", "-5m"),
        ("--max-requests", "nan"),
        ("--max-requests", "0"),
        ("--business-deadline", "+inf"),
        ("--wait-seconds", "nan"),
    ],
)
def test_bide_watch_refuses_a_non_finite_or_out_of_range_flag(
    tmp_path: Path, flag: str, value: str
) -> None:
    """``bide watch --deadline nan`` used to exit 0 and register with the profile's default."""
    config = tmp_path / "bide.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    run = subprocess.run(
        [*BIDE, "watch", "--provider", "p", "--job", "j", flag, value, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert flag in run.stderr
    assert not (tmp_path / "state" / "spool").exists() or not any(
        (tmp_path / "state" / "spool" / "incoming").iterdir()
    )
