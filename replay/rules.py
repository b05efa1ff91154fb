"""State rules: a job's state derived from several fields of the status body (S3, S15).

Real APIs do not always keep a job's state in one string: GitHub Actions says ``status`` =
``completed`` and then ``conclusion`` = ``failure``; Databricks ``life_cycle_state`` =
``TERMINATED`` and ``result_state`` = ``FAILED``; a Google long-running operation has ``done``
and either ``response`` or ``error``; a Kubernetes Job a ``conditions`` array. A contract may
therefore give ordered :class:`StateRule` s instead of one state pointer and a state table.

Each rule is a conjunction of :class:`Condition` s on JSON pointers (RFC 6901, arrays indexed
by number). The first rule whose conditions all hold gives the job's state name (what the
story shows) and its category; no rule holding is ``unknown``, exactly as a state in no list
of a state table (S15). Values are compared by JSON type: the string ``"1"`` is not the number
``1``, ``true`` is not ``"true"``, and ``1`` is the number ``1.0``.

:func:`rule_problems` finds, without any body, the rules that can never match (contradictory
conditions), a rule no body can reach because an earlier one matches every body it matches
(shadowed), two rules of different categories that can both match one body without the later
one saying so (``fallback``), and documented provider states no rule classifies. The analysis
is sound: "can never match" and "shadowed" are claimed only when certain; "can both match" is
claimed whenever it cannot be ruled out. Pure, like all of ``replay``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from replay.signals import resolve_pointer
from replay.text import json_text

__all__ = [
    "Category",
    "Condition",
    "Scalar",
    "StateRule",
    "first_match",
    "holds",
    "rule_problems",
    "same_value",
    "unmatched_state",
]

#: A JSON scalar a condition compares with (TOML has no null: "null" is its own test).
Scalar = str | bool | int | float
#: What a matching rule means (the categories of a state table, S3).
Category = Literal["pending", "success", "failure", "canceled", "expired"]
#: The tests a condition can make on the value at its pointer.
Test = Literal["equals", "present", "absent", "null", "range", "some"]

_Pointer = Annotated[str, Meta(pattern=r"^(/([^~/]|~[01])*)*$", max_length=512)]
_StateName = Annotated[str, Meta(min_length=1, max_length=128)]


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """One test on the value at ``pointer``.

    Attributes:
        pointer: Where the value is (RFC 6901; inside ``some``, relative to the element).
        test: ``equals`` one of ``values``; ``present`` (there and not null); ``absent``
            (not there); ``null`` (there and null); ``range`` (a number, not a boolean, within
            ``minimum``..``maximum``, both inclusive); ``some`` (an array with an element on
            which every condition of ``where`` holds).
        values: For ``equals``: the accepted values, compared by JSON type.
        minimum: For ``range``: the lowest accepted number, if any.
        maximum: For ``range``: the highest accepted number, if any.
        where: For ``some``: the conditions on one element.
    """

    pointer: _Pointer
    test: Test
    values: Annotated[tuple[Scalar, ...], Meta(max_length=64)] = ()
    minimum: float | None = None
    maximum: float | None = None
    where: Annotated[tuple[Condition, ...], Meta(max_length=16)] = ()

    def __post_init__(self) -> None:
        if (self.test == "equals") != bool(self.values):
            raise ValueError("an equals condition (and only it) has values")
        if (self.test == "range") != (self.minimum is not None or self.maximum is not None):
            raise ValueError("a range condition (and only it) has a minimum or a maximum")
        if (self.test == "some") != bool(self.where):
            raise ValueError("a some condition (and only it) has where conditions")
        for bound in (self.minimum, self.maximum):
            if bound is not None and not math.isfinite(bound):
                raise ValueError("a range's bounds are finite numbers")


class StateRule(msgspec.Struct, frozen=True, kw_only=True):
    """One ordered rule: when every condition holds, the job is in ``state`` (``category``).

    Attributes:
        state: The state's name, as the story shows it.
        category: What it means (S3).
        when: The conditions, all of which must hold.
        fallback: The rule is meant for bodies no earlier rule matched: it may overlap an
            earlier rule of another category (the order decides, on purpose).
    """

    state: _StateName
    category: Category
    when: Annotated[tuple[Condition, ...], Meta(min_length=1, max_length=16)]
    fallback: bool = False


def same_value(a: object, b: object) -> bool:
    """Equal as JSON values of the same type: strings, booleans and numbers never mix."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _in_range(value: float, cond: Condition) -> bool:
    return (cond.minimum is None or value >= cond.minimum) and (
        cond.maximum is None or value <= cond.maximum
    )


def holds(cond: Condition, document: object) -> bool:
    """Whether ``cond`` holds on ``document``; never raises on what a provider sends."""
    found, value = resolve_pointer(document, cond.pointer)
    if cond.test == "absent":
        return not found
    if not found:
        return False
    if cond.test == "null":
        return value is None
    if cond.test == "present":
        return value is not None
    if cond.test == "equals":
        return any(same_value(value, v) for v in cond.values)
    if cond.test == "range":
        return _is_number(value) and _in_range(float(value), cond)  # type: ignore[arg-type]
    return isinstance(value, list) and any(
        all(holds(sub, element) for sub in cond.where) for element in value
    )


def first_match(rules: Sequence[StateRule], document: object) -> StateRule | None:
    """The first rule whose conditions all hold, or None (the state is then unknown, S15)."""
    for rule in rules:
        if all(holds(cond, document) for cond in rule.when):
            return rule
    return None


def unmatched_state(rules: Sequence[StateRule], document: object, limit: int = 128) -> str:
    """What the story shows when no rule matched: the values the rules look at."""
    seen: dict[str, str] = {}
    for rule in rules:
        for cond in rule.when:
            if cond.pointer in seen:
                continue
            found, value = resolve_pointer(document, cond.pointer)
            if cond.test == "some":
                shown = "an array" if isinstance(value, list) else "no array"
                seen[cond.pointer] = shown if found else "absent"
            else:
                seen[cond.pointer] = json_text(value) if found else "absent"
    text = "no rule matched: " + ", ".join(f"{p}={v}" for p, v in seen.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- analysis ------------------------------------------------------------------------------------


def _parent(pointer: str, child: str) -> bool:
    """Whether ``pointer`` is a strict ancestor of ``child``."""
    return child.startswith(pointer + "/")


def _needs_found(cond: Condition) -> bool:
    return cond.test != "absent"


def _pair_contradicts(a: Condition, b: Condition) -> bool:
    """Whether two conditions can never hold together (sound: True only when certain)."""
    if a.pointer != b.pointer:
        # A value found under a pointer needs that pointer to be a container.
        for upper, lower in ((a, b), (b, a)):
            if (
                _parent(upper.pointer, lower.pointer)
                and _needs_found(lower)
                and upper.test in ("absent", "null", "equals", "range")
            ):
                return True
        return False
    tests = {a.test, b.test}
    if "absent" in tests:
        return tests != {"absent"}
    if "null" in tests:
        return tests != {"null"}
    if a.test == "equals" and b.test == "equals":
        return not any(same_value(x, y) for x in a.values for y in b.values)
    for eq, other in ((a, b), (b, a)):
        if eq.test == "equals" and other.test == "range":
            return not any(_is_number(v) and _in_range(float(v), other) for v in eq.values)
        if eq.test == "equals" and other.test == "some":
            return True
    if tests == {"range"}:
        low = max((c.minimum for c in (a, b) if c.minimum is not None), default=-math.inf)
        high = min((c.maximum for c in (a, b) if c.maximum is not None), default=math.inf)
        return low > high
    return tests == {"range", "some"}


def _self_contradiction(conditions: Sequence[Condition]) -> tuple[Condition, Condition] | None:
    """Two conditions of one conjunction that cannot both hold (or one that cannot hold)."""
    for i, a in enumerate(conditions):
        if a.test == "range" and _pair_contradicts(a, a):
            return a, a
        if a.test == "some":
            inner = _self_contradiction(a.where)
            if inner is not None:
                return inner
        for b in conditions[i + 1 :]:
            if _pair_contradicts(a, b):
                return a, b
    return None


def _implies(conds: Sequence[Condition], target: Condition) -> bool:
    """Whether ``conds`` (a conjunction) guarantee ``target`` (sound: True only when certain)."""
    same = [c for c in conds if c.pointer == target.pointer]
    if target.test == "present":
        return any(c.test in ("equals", "present", "range", "some") for c in same) or any(
            _parent(target.pointer, c.pointer) and _needs_found(c) for c in conds
        )
    if target.test in ("absent", "null"):
        return any(c.test == target.test for c in same)
    if target.test == "equals":
        return any(
            c.test == "equals"
            and all(any(same_value(v, w) for w in target.values) for v in c.values)
            for c in same
        )
    if target.test == "range":
        return any(
            (
                c.test == "equals"
                and all(_is_number(v) and _in_range(float(v), target) for v in c.values)
            )
            or (
                c.test == "range"
                and (
                    target.minimum is None
                    or (c.minimum is not None and c.minimum >= target.minimum)
                )
                and (
                    target.maximum is None
                    or (c.maximum is not None and c.maximum <= target.maximum)
                )
            )
            for c in same
        )
    return any(
        c.test == "some" and all(_implies(c.where, sub) for sub in target.where) for c in same
    )


def _describe(cond: Condition) -> str:
    if cond.test == "equals":
        shown = ", ".join(json_text(v) for v in cond.values)
        verb = "equals" if len(cond.values) == 1 else "is one of"
        return f"{cond.pointer} {verb} {shown}"
    if cond.test == "range":
        return f"{cond.pointer} is a number in [{cond.minimum}, {cond.maximum}]"
    if cond.test == "some":
        return f"{cond.pointer} has an element where ..."
    return f"{cond.pointer} is {cond.test}"


def rule_problems(
    rules: Sequence[StateRule], documented: Iterable[tuple[str, Sequence[Scalar]]] = ()
) -> list[str]:
    """Every reason these rules are unsound, as sentences naming the rules (1-based).

    Args:
        rules: The ordered rules.
        documented: The provider's documented values per pointer: each must be classified
            (some rule's condition on that pointer accepts it).

    Returns:
        The problems; empty when the rules are sound.
    """
    problems: list[str] = []
    label = [f"rule {n} ({r.state!r}, {r.category})" for n, r in enumerate(rules, start=1)]
    live: list[int] = []
    for j, rule in enumerate(rules):
        clash = _self_contradiction(rule.when)
        if clash is not None:
            a, b = clash
            why = _describe(a) if a is b else f"{_describe(a)} and {_describe(b)}"
            problems.append(f"{label[j]} can never match: {why} cannot both hold")
            continue
        shadow = next((i for i in live if all(_implies(rule.when, c) for c in rules[i].when)), None)
        if shadow is not None:
            problems.append(
                f"{label[j]} can never be chosen: {label[shadow]} comes first and matches "
                f"every body it matches; remove it or move it before {label[shadow]}"
            )
            continue
        for i in live:
            earlier = rules[i]
            if earlier.category == rule.category or rule.fallback:
                continue
            both = (*earlier.when, *rule.when)
            if _self_contradiction(both) is None:
                problems.append(
                    f"{label[j]} and {label[i]} can both match one body but mean different "
                    f"things; make them exclusive (e.g. a condition one has and the other "
                    f"cannot meet), or mark {label[j]} fallback = true if the order is meant"
                )
                break
        live.append(j)
    for pointer, values in documented:
        for value in values:
            if not any(_accepts(c, value) for r in rules for c in _conditions_on(r.when, pointer)):
                problems.append(
                    f"documented state {json_text(value)} at {pointer} is classified by no rule"
                )
    return problems


def _conditions_on(conds: Sequence[Condition], pointer: str) -> Iterable[Condition]:
    """The conditions on ``pointer``, including those inside ``some`` (relative pointers are
    written ``/array/*/field`` in a documented list: an element's field)."""
    for c in conds:
        if c.pointer == pointer:
            yield c
        if c.test == "some" and pointer.startswith(c.pointer + "/*"):
            yield from _conditions_on(c.where, pointer[len(c.pointer) + 2 :])


def _accepts(cond: Condition, value: Scalar) -> bool:
    """Whether ``value`` at the condition's pointer satisfies it."""
    probe = Condition(pointer=cond.pointer, test="equals", values=(value,))
    return cond.test in ("equals", "range", "present") and _implies((probe,), cond)
