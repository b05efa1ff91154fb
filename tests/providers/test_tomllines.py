"""The TOML key locator behind profile errors: every key of every shipped profile is found,
on a line that names it."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.tomllines import KeyPath, key_lines, line_of

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "deploy" / "profiles").glob("*.toml"))


def paths(value: object, at: KeyPath = ()) -> Iterator[KeyPath]:
    if at:
        yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from paths(inner, (*at, index))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_key_of_a_shipped_profile_is_found_on_its_line(profile: Path) -> None:
    text = profile.read_text()
    lines = key_lines(text)
    source = text.splitlines()
    for path in paths(tomllib.loads(text)):
        assert path in lines, path
        if isinstance(path[-1], str):  # an element has no name on its line
            assert path[-1] in source[lines[path] - 1], (path, lines[path])


def test_arrays_of_tables_strings_and_inline_tables() -> None:
    text = (
        'a.b = 1 # "not = a key"\n'
        "[[r]]\n"
        's = """x\n= y"""\n'
        "[[r]]\n"
        "[r.when]\n"
        '"/k" = [\n'
        "  1,\n"
        "  { min = 2 },\n"
        "]\n"
        "t = 'lit'\n"
    )
    tomllib.loads(text)
    lines = key_lines(text)
    assert lines[("a",)] == lines[("a", "b")] == 1
    assert lines[("r", 0, "s")] == 3
    assert lines[("r", 1)] == 5  # the string's "= y" line is no key
    assert lines[("r", 1, "when", "/k", 1, "min")] == 9
    assert lines[("r", 1, "when", "t")] == 11
    assert line_of(lines, ("r", 1, "when", "/k", 0, "nothing")) == 8
    assert line_of(lines, ("absent",)) == 0
