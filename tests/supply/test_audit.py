"""The lock files pin what pyproject.toml asks for, with hashes, and the audit fails on a known
vulnerability however the registry reports it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.supply.audit import Advisory, ProjectPage, canonical, judge, pins

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
LOCKS = {
    "deploy/requirements.lock": (),
    "deploy/requirements-extras.lock": ("mcp", "postgres", "aws"),
}


@pytest.mark.parametrize(("lock", "extras"), LOCKS.items())
def test_lock_pins_every_declared_dependency_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    pinned = pins((ROOT / lock).read_text(encoding="utf-8"))
    declared = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        declared += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    for req in declared:
        name = canonical(req.name)
        assert name in pinned, f"{lock} does not pin {req.name}: regenerate it (see its header)"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock} pins {name}=={pinned[name]}, outside {req}"
        )


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_carries_a_hash(lock: str) -> None:
    text = (ROOT / lock).read_text(encoding="utf-8")
    blocks = re.split(
        r"\n(?=[A-Za-z0-9])", text.split("\n", 1)[1] if text.startswith("#") else text
    )
    for block in blocks:
        if "==" in block.split("\n", 1)[0]:
            assert "--hash=sha256:" in block, f"{lock}: {block.split()[0]} has no hash"


def _page(latest: str, *ids: str, withdrawn: bool = False) -> ProjectPage:
    return ProjectPage(latest, () if withdrawn else tuple(Advisory(i, ("9.9",)) for i in ids))


def test_a_vulnerability_pip_audit_reports_fails_the_audit() -> None:
    report = {
        "dependencies": [
            {
                "name": "Jinja2",
                "version": "2.10",
                "vulns": [{"id": "PYSEC-2019-217", "fix_versions": ["2.10.1"], "aliases": []}],
            },
            {"name": "httpx", "version": "0.28.1", "vulns": []},
        ]
    }
    verdict = judge({"jinja2": "2.10", "httpx": "0.28.1"}, report, lambda _: None)
    assert verdict.exit_code == 1
    assert [(n, [a.id for a in v]) for n, _, v in verdict.vulnerable] == [
        ("jinja2", ["PYSEC-2019-217"])
    ]
    assert verdict.audited == [("httpx", "0.28.1")]


def test_where_pip_audit_is_refused_the_project_page_audits_the_newest_release() -> None:
    skipped = {
        "dependencies": [
            {"name": n, "skip_reason": "Dependency not found on PyPI"} for n in ("a", "b", "c")
        ]
    }
    pages = {"a": _page("1.0", "GHSA-xxxx"), "b": _page("2.0"), "c": _page("3.1", "GHSA-old")}
    verdict = judge({"a": "1.0", "b": "2.0", "c": "3.0"}, skipped, pages.get)
    assert [n for n, _, _ in verdict.vulnerable] == ["a"]
    assert verdict.audited == [("b", "2.0")]
    assert [(n, "3.1" in why) for n, _, why in verdict.unaudited] == [("c", True)]
    assert verdict.exit_code == 1


def test_withdrawn_advisories_do_not_fail_and_an_unreachable_registry_is_no_pass() -> None:
    assert judge({"a": "1.0"}, {}, lambda _: _page("1.0", withdrawn=True)).exit_code == 0
    nothing = judge({"a": "1.0", "b": "2.0"}, {}, lambda _: None)
    assert nothing.exit_code == 3
    assert len(nothing.unaudited) == 2
