"""The script format: the documented example parses, mistakes name their key and fix."""

from __future__ import annotations

import re
import textwrap

import pytest

from daemon.simulator import FORMAT_HELP, ScriptError, Step, parse_script, parse_steps


def test_the_documented_example_parses() -> None:
    match = re.search(r"Full example::\n\n(.*?)\n\nCompact", FORMAT_HELP, re.S)
    assert match is not None
    script = parse_script(textwrap.dedent(match[1]), source="FORMAT_HELP")
    assert set(script.jobs) == {"export-1", "throttled"}
    assert script.server.default_scenario == "quick"
    steps = script.jobs["export-1"].resolved_steps()
    assert [(s.state, s.times, s.result) for s in steps] == [
        ("queued", 2, False),
        ("running", 3, False),
        ("succeeded", 1, True),
    ]


@pytest.mark.parametrize(
    ("compact", "expected"),
    [
        ("queued", Step(state="queued")),
        ("queued x2", Step(state="queued", times=2)),
        ("404 x3", Step(status=404, times=3)),
        ("succeeded with result", Step(state="succeeded", result=True)),
        ("done x2 with result", Step(state="done", times=2, result=True)),
    ],
)
def test_compact_steps(compact: str, expected: Step) -> None:
    assert parse_steps([compact]) == (expected,)


def test_a_compact_string_of_steps() -> None:
    assert [s.label() for s in parse_steps("queued x2, 503, running")] == [
        "queued",
        "503",
        "running",
    ]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[jobs.a]\nsteps = [{ tims = 2 }]", ["`tims`", "jobs.a.steps[0]", "did you mean `times`"]),
        ('[jobs.a]\nstep = "queued"', ["`step`", "jobs.a", "did you mean `steps`"]),
        ('[server]\nsubmitt = "body"', ["`submitt`", "server", "did you mean `submit`"]),
        ("jobz = 1", ["`jobz`", "did you mean `jobs`"]),
        ("[jobs.a]\nsteps = [{ zzz = 1 }]", ["`zzz`", "valid step keys: times, state"]),
        ('[jobs.a]\nsteps = "queued xx2"', ["queued xx2", "jobs.a", "WORD [xN]"]),
        ("[jobs.a]\nsteps = []", ["at least one step", "jobs.a"]),
        ('[jobs.a]\nsteps = [{ delay = "x" }]', ["jobs.a.steps[0].delay", "float"]),
        ("[jobs.a]\nsteps = [{ times = 0 }]", ["`times` must be >= 1"]),
        ('[jobs.a]\nsteps = [{ redirect = "http://x/" , status = 200 }]', ["3xx"]),
        ('[jobs.a]\nsteps = [{ fault = "explode" }]', ["fault"]),
        ('[jobs.a]\nsteps = [{ headers = { "Bad Name" = "x" } }]', ["Bad Name"]),
        ('[server]\ndefault_scenario = "q"', ["default_scenario", "[scenarios]"]),
        ("[jobs.a\nsteps = 1", ["not valid TOML"]),
    ],
)
def test_mistakes_name_the_file_the_key_and_the_fix(text: str, needles: list[str]) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_script(text, source="my.toml")
    message = str(caught.value)
    assert message.startswith("my.toml: ")
    for needle in needles:
        assert needle in message
