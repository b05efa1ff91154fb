"""replay/CONTRACT.md holds every rule the code cites, and every rule names tests that hold it
(issue 13). A rule number in the code with no entry, an entry with no test, a named test that
does not exist or does not mention its rule: each fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCUMENT = ROOT / "replay" / "CONTRACT.md"
CITED = re.compile(r"\bS([1-9][0-9]?)\b")
ENTRY = re.compile(r"^\*\*S([0-9]+)\. ", re.M)
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:::(\w+))?`")


def entries() -> dict[int, str]:
    """Rule number -> its text, in the document's order."""
    text = DOCUMENT.read_text(encoding="utf-8")
    found = list(ENTRY.finditer(text))
    out: dict[int, str] = {}
    for here, after in zip(found, [*found[1:], None], strict=True):
        end = after.start() if after else text.find("\n## ", here.end())
        out[int(here[1])] = text[here.start() : end if end != -1 else len(text)]
    return out


def test_the_rules_are_s1_to_s40_in_order_each_once() -> None:
    numbers = [int(m[1]) for m in ENTRY.finditer(DOCUMENT.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, 41))


def test_every_rule_cited_in_code_or_tests_has_an_entry() -> None:
    documented = set(entries())
    for package in ("daemon", "replay", "eventlog", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            for number in CITED.findall(path.read_text(encoding="utf-8")):
                assert int(number) in documented, (
                    f"{path.relative_to(ROOT)} cites S{number}, which replay/CONTRACT.md lacks"
                )


def _function(path: Path, name: str, method: str | None) -> str:
    """The source of a test function (decorators included), or '' if there is none."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    scope: list[ast.stmt] = tree.body
    if method is not None:
        classes = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name]
        if not classes:
            return ""
        scope, name = classes[0].body, method
    for node in scope:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            end = node.end_lineno or node.lineno
            return "\n".join(source.splitlines()[first - 1 : end])
    return ""


def test_every_rule_names_tests_that_exist_and_mention_it() -> None:
    for number, text in entries().items():
        nodes = NODE.findall(text)
        assert nodes, f"S{number} names no test"
        for file, name, method in nodes:
            source = _function(ROOT / file, name, method or None)
            assert source, f"S{number}: {file}::{name} does not exist"
            named = re.search(rf"(^|_)s{number}(_|$)", (method or name)) or re.search(
                rf"\bS{number}\b", source
            )
            assert named, f"S{number}: {file}::{name} does not mention S{number}"
