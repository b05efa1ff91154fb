"""The profile reference (deploy/profiles/REFERENCE.md) is the generator's output, and every
key of every table has its meaning written: a key added to the code without a word fails here."""

from __future__ import annotations

from pathlib import Path

import msgspec

from daemon.profile_reference import MEANINGS, TABLES, docstring_attributes, reference
from replay.contract import Contract, ResultField
from replay.rules import Condition, StateRule

DOC = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "REFERENCE.md"


def test_the_reference_is_what_the_code_generates() -> None:
    assert DOC.read_text(encoding="utf-8") == reference(), (
        "deploy/profiles/REFERENCE.md is stale: python -m daemon.profile_reference > "
        "deploy/profiles/REFERENCE.md"
    )


def test_every_key_has_its_meaning() -> None:
    for name, cls in TABLES:
        keys = {f.name for f in msgspec.structs.fields(cls)}
        assert keys == set(MEANINGS[name]), f"[{name}]: {keys ^ set(MEANINGS[name])}"
    for cls in (Contract, ResultField, StateRule, Condition):
        keys = {f.name for f in msgspec.structs.fields(cls)}
        missing = keys - set(docstring_attributes(cls))
        assert not missing, f"{cls.__name__}'s docstring does not describe {sorted(missing)}"
