"""The documents stay where issue 35 put them: a short README that is the front page, and a
guide next to what it describes for each reader, linked from the README; a link into a
document names a heading it has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"

#: Each guide and its reader, as the README's "Where to go next" lists them.
GUIDES = {
    "deploy/README.md": "operator",
    "daemon/api/README.md": "agent developer",
    "eventlog/AUDIT.md": "auditor",
    "tests/bench/RESULTS.md": "benchmark",
    "daemon/ARCHITECTURE.md": "maintainer",
}
DOCUMENTS = ["README.md", "CHANGELOG.md", *GUIDES]

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(document: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings."""
    anchors = set()
    for line in document.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^#+\s+(.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; move detail into a guide"
    top = "\n".join(lines[:40])
    assert "make demo" in top
    assert "make test" in top


@pytest.mark.parametrize("guide", sorted(GUIDES))
def test_readme_links_each_guide_with_its_reader(guide: str) -> None:
    assert (ROOT / guide).is_file()
    rows = [
        line
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| [{guide}]({guide})")
    ]
    assert rows, f"README.md's 'Where to go next' lacks {guide}"
    assert GUIDES[guide] in rows[0]


def test_the_threat_model_is_the_auditors() -> None:
    audit = (ROOT / "eventlog" / "AUDIT.md").read_text(encoding="utf-8")
    assert "## Threat model" in audit
    assert "## Threat model" not in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_links_name_headings_that_exist(document: str) -> None:
    source = ROOT / document
    for link in _LINK.findall(source.read_text(encoding="utf-8")):
        if "://" in link:
            continue
        path, _, fragment = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        if fragment and target.suffix == ".md" and target.is_file():
            assert fragment in _anchors(target), f"{document}: {link} names no heading"
