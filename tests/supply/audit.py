"""The dependency audit CI runs: each release pinned in the lock files, checked against the
advisory database that PyPI serves, failing on a known vulnerability.

    python -m tests.supply.audit deploy/requirements.lock deploy/requirements-extras.lock

pip-audit asks first (its PyPI service reads each pinned release's advisories). Where the
registry answers only at the project level (the one this project's CI reaches serves
``/pypi/NAME/json`` but not ``/pypi/NAME/VERSION/json``, so pip-audit skips every package),
the project's page lists the advisories of its newest release: a pin that is the newest
release is audited from there; an older pin is reported as not audited, naming the newest
version, which says the lock is due for a refresh. Exit status: 0 no known vulnerability,
1 a known vulnerability (each printed with its advisory ids and fixed versions), 3 nothing
could be audited (the registry was not reachable).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PYPI = "https://pypi.org/pypi"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock_text: str) -> dict[str, str]:
    """``name -> version`` for every ``name==version`` line of a requirements lock."""
    return {canonical(m.group(1)): m.group(2) for m in _PIN.finditer(lock_text)}


@dataclass(frozen=True)
class Advisory:
    id: str
    fixed_in: tuple[str, ...]


@dataclass(frozen=True)
class ProjectPage:
    """What ``/pypi/NAME/json`` says: the newest release and its advisories."""

    latest: str
    advisories: tuple[Advisory, ...]


@dataclass
class Verdict:
    vulnerable: list[tuple[str, str, tuple[Advisory, ...]]] = field(default_factory=list)
    audited: list[tuple[str, str]] = field(default_factory=list)
    unaudited: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.vulnerable:
            return 1
        return 0 if self.audited else 3


def judge(
    pinned: Mapping[str, str],
    pip_audit_report: Mapping[str, object],
    project_page: Callable[[str], ProjectPage | None],
) -> Verdict:
    """Sort every pin into vulnerable, audited or not audited (with why)."""
    verdict = Verdict()
    reported: dict[str, Mapping[str, object]] = {}
    deps = pip_audit_report.get("dependencies", [])
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, dict) and isinstance(dep.get("name"), str):
            reported[canonical(str(dep["name"]))] = dep
    for name, version in sorted(pinned.items()):
        dep = reported.get(name)
        if dep is not None and "skip_reason" not in dep:
            vulns = _advisories(dep.get("vulns", []), id_key="id", fixed_key="fix_versions")
            _sort(verdict, name, version, vulns)
            continue
        page = project_page(name)
        if page is None:
            verdict.unaudited.append((name, version, "the registry did not answer"))
        elif page.latest != version:
            verdict.unaudited.append(
                (
                    name,
                    version,
                    f"the registry gives advisories for the newest release only "
                    f"({page.latest}): refresh the lock",
                )
            )
        else:
            _sort(verdict, name, version, page.advisories)
    return verdict


def _sort(verdict: Verdict, name: str, version: str, vulns: tuple[Advisory, ...]) -> None:
    if vulns:
        verdict.vulnerable.append((name, version, vulns))
    else:
        verdict.audited.append((name, version))


def _advisories(raw: object, *, id_key: str, fixed_key: str) -> tuple[Advisory, ...]:
    out = []
    for v in raw if isinstance(raw, list) else []:
        if not isinstance(v, dict) or v.get("withdrawn"):
            continue
        fixed = v.get(fixed_key) or []
        out.append(
            Advisory(
                str(v.get(id_key, "?")),
                tuple(str(f) for f in fixed) if isinstance(fixed, list) else (),
            )
        )
    return tuple(out)


def fetch_project_page(client: httpx.Client, name: str) -> ProjectPage | None:
    try:
        response = client.get(f"{PYPI}/{name}/json")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        data = response.json()
        latest = str(data["info"]["version"])
    except (ValueError, KeyError, TypeError):
        return None
    return ProjectPage(
        latest, _advisories(data.get("vulnerabilities", []), id_key="id", fixed_key="fixed_in")
    )


def run_pip_audit(locks: Iterable[Path]) -> Mapping[str, object]:
    """pip-audit's JSON report over ``locks``; an empty report when it could not run."""
    cmd = [
        sys.executable,
        "-m",
        "pip_audit",
        "--disable-pip",
        "--vulnerability-service",
        "pypi",
        "--format",
        "json",
        "--progress-spinner",
        "off",
    ]
    for lock in locks:
        cmd += ["--requirement", str(lock)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        print(
            f"pip-audit gave no report (exit {done.returncode}): {done.stderr.strip()[-500:]}",
            file=sys.stderr,
        )
        return {}
    return report if isinstance(report, dict) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.supply.audit",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("locks", nargs="+", type=Path, help="requirements lock files")
    args = parser.parse_args(argv)
    pinned: dict[str, str] = {}
    for lock in args.locks:
        pinned.update(pins(lock.read_text(encoding="utf-8")))
    report = run_pip_audit(args.locks)
    with httpx.Client(timeout=30, follow_redirects=False) as client:
        verdict = judge(pinned, report, lambda name: fetch_project_page(client, name))
    for name, version, vulns in verdict.vulnerable:
        for v in vulns:
            fixed = ", ".join(v.fixed_in) or "no fixed release yet"
            print(f"VULNERABLE {name}=={version}: {v.id} (fixed in {fixed})")
    for name, version, why in verdict.unaudited:
        print(f"not audited {name}=={version}: {why}")
    print(
        f"dependency audit: {len(pinned)} pinned, {len(verdict.audited)} audited clean, "
        f"{len(verdict.vulnerable)} vulnerable, {len(verdict.unaudited)} not audited"
    )
    if verdict.exit_code == 3:
        print(
            "dependency audit: nothing could be audited (the registry did not answer)",
            file=sys.stderr,
        )
    return verdict.exit_code


if __name__ == "__main__":
    sys.exit(main())
