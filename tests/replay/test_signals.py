"""Pure parsers: Retry-After vectors (S20), RateLimit headers, hint times, JSON pointers."""

from __future__ import annotations

import json
import pathlib

import pytest

from replay.signals import (
    Rejected,
    parse_instant,
    parse_ratelimit,
    parse_ratelimit_policy,
    parse_retry_after,
    parse_seconds,
    resolve_pointer,
)

VECTORS = pathlib.Path(__file__).parent.parent / "vectors"


def _retry_after_vectors() -> list[object]:
    doc = json.loads((VECTORS / "retry_after.json").read_text(encoding="utf-8"))
    return [pytest.param(doc["now"], v["value"], v["until"], id=v["id"]) for v in doc["vectors"]]


@pytest.mark.parametrize(("now", "value", "until"), _retry_after_vectors())
def test_s20_retry_after_vectors(now: float, value: str, until: float | None) -> None:
    got = parse_retry_after(value, now)
    if until is None:
        assert isinstance(got, Rejected)
    else:
        assert got == until


@pytest.mark.parametrize(
    ("value", "pacing"),
    [
        ('"default";r=0;t=30', 30.0),
        ('"default";r=10;t=30', 3.0),
        ('"a";r=10;t=30, "b";r=1;t=60', 60.0),
        ('"default";r=5', None),
        ("limit=100, remaining=50, reset=25", 0.5),
        ("limit=100, remaining=0, reset=25", 25.0),
    ],
)
def test_ratelimit_pacing(value: str, pacing: float | None) -> None:
    assert parse_ratelimit(value) == pacing


@pytest.mark.parametrize(
    ("value", "pacing"),
    [
        ('"default";q=100;w=60', 0.6),
        ("100;w=60", 0.6),
        ('"burst";q=10;w=1, "day";q=1000;w=86400', 86.4),
        ('"default";q=100', None),
    ],
)
def test_ratelimit_policy_pacing(value: str, pacing: float | None) -> None:
    got = parse_ratelimit_policy(value)
    if pacing is None:
        assert got is None
    else:
        assert got == pytest.approx(pacing)


@pytest.mark.parametrize(
    "value",
    ['"d";r=-1;t=3', '"d";r=x;t=3', '"d";t=3', '"unterminated;r=1', ",", "", "r=1;;"],
)
def test_malformed_ratelimit_rejected(value: str) -> None:
    assert isinstance(parse_ratelimit(value), Rejected)


@pytest.mark.parametrize("value", ['"d";q=0;w=1', '"d";w=1', '"d";q=-3;w=1', "x;w=1"])
def test_malformed_ratelimit_policy_rejected(value: str) -> None:
    assert isinstance(parse_ratelimit_policy(value), Rejected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-04-18T10:24:00Z", 1744971840.0),
        ("2025-04-18T12:24:00+02:00", 1744971840.0),
        (1744971840, 1744971840.0),
        (1744971840.5, 1744971840.5),
    ],
)
def test_s8_hint_instants(value: object, expected: float) -> None:
    assert parse_instant(value) == expected


@pytest.mark.parametrize("value", ["2025-04-18T10:24:00", "soon", True, None, [], -1, float("nan")])
def test_s8_bad_hint_instants(value: object) -> None:
    assert isinstance(parse_instant(value), Rejected)


@pytest.mark.parametrize(
    ("value", "expected"), [(30, 30.0), ("30", 30.0), ("2.5", 2.5), (-4, -4.0)]
)
def test_s8_hint_seconds(value: object, expected: float) -> None:
    assert parse_seconds(value) == expected


@pytest.mark.parametrize("value", ["", "1e9", "inf", True, None, {}, float("inf")])
def test_s8_bad_hint_seconds(value: object) -> None:
    assert isinstance(parse_seconds(value), Rejected)


# RFC 6901 §5 examples.
RFC6901_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("", RFC6901_DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_json_pointer_rfc6901_examples(pointer: str, value: object) -> None:
    assert resolve_pointer(RFC6901_DOC, pointer) == (True, value)


@pytest.mark.parametrize("pointer", ["/missing", "/foo/2", "/foo/01", "/foo/-", "/foo/0/x"])
def test_json_pointer_misses(pointer: str) -> None:
    assert resolve_pointer(RFC6901_DOC, pointer) == (False, None)
