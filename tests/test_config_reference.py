"""The configuration reference (deploy/CONFIG.md) is the generator's output, and every key of
every section of bide.toml has its meaning written: a key added to the code without a word, or
a word left for a key that is gone, fails here."""

from __future__ import annotations

from pathlib import Path

from daemon.config_reference import MEANINGS, SECTIONS, reference, sections

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
REGENERATE = "python -m daemon.config_reference > deploy/CONFIG.md"


def test_the_reference_is_what_the_code_generates() -> None:
    assert (DEPLOY / "CONFIG.md").read_text(encoding="utf-8") == reference(), (
        f"deploy/CONFIG.md is stale: {REGENERATE}"
    )


def test_every_section_and_key_is_documented_and_nothing_else() -> None:
    tables = {name: {f.name for f in info.fields} for name, info, _ in sections()}
    assert set(SECTIONS) == set(tables), (
        f"daemon/config_reference.py SECTIONS: add a line for {sorted(set(tables) - set(SECTIONS))}"
        f", remove {sorted(set(SECTIONS) - set(tables))}"
    )
    assert set(MEANINGS) == set(tables)
    for name, keys in tables.items():
        undocumented = sorted(keys - set(MEANINGS[name]))
        gone = sorted(set(MEANINGS[name]) - keys)
        assert not undocumented, (
            f"[{name}] {undocumented}: add a one-line meaning to MEANINGS[{name!r}] in "
            f"daemon/config_reference.py, then {REGENERATE}"
        )
        assert not gone, f"MEANINGS[{name!r}] documents {gone}, which [{name}] does not have"
        assert all(MEANINGS[name].values()), f"[{name}]: an empty meaning"


def test_every_key_appears_in_the_document_in_its_section() -> None:
    text = reference()
    for name, info, _ in sections():
        section = text.split(f"## [{name}]", 1)[1].split("\n## ", 1)[0]
        for f in info.fields:
            assert f"| `{f.name}` |" in section, f"[{name}] {f.name}"


def test_the_operators_guide_links_the_reference() -> None:
    assert "(CONFIG.md)" in (DEPLOY / "README.md").read_text(encoding="utf-8")


def test_every_pattern_is_said_in_words() -> None:
    assert "matches `" not in reference(), "add the pattern's words to daemon.config.PATTERN_WORDS"
