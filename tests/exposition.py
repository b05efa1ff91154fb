"""A strict parser of the Prometheus text format (0.0.4), for tests that read ``/metrics``."""

from __future__ import annotations

import re

SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>[^}]*)\})?"
    r" (?P<value>[^ ]+)$"
)
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(?:,|$)')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


def parse_exposition(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Strictly parse a Prometheus text page (format 0.0.4): every sample's family declared
    by a ``# TYPE`` before it, each family declared once, no series twice, labels and values
    well formed. Returns the samples by name, then by their labels."""
    assert text.endswith("\n"), "the page must end with a newline"
    families: dict[str, str] = {}
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if line.startswith("# HELP "):
            assert len(line.split(" ", 3)) == 4, where
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in TYPES, where
            assert name not in families, f"{where}: {name} declared twice"
            families[name] = kind
            continue
        assert line, where
        assert not line.startswith("#"), where
        m = SAMPLE.match(line)
        assert m, where
        name, value = m["name"], m["value"]
        family = next(
            (
                f
                for f, kind in families.items()
                for suffix in SUFFIXES.get(kind, ("",))
                if name == f + suffix
            ),
            None,
        )
        assert family is not None, f"{where}: no # TYPE declares {name}'s family"
        labels: list[tuple[str, str]] = []
        if m["labels"]:
            consumed = 0
            for lm in LABEL.finditer(m["labels"]):
                assert lm.start() == consumed, f"{where}: bad labels"
                labels.append((lm[1], lm[2]))
                consumed = lm.end()
            assert consumed == len(m["labels"]), f"{where}: bad labels"
        assert len({k for k, _ in labels}) == len(labels), f"{where}: a label twice"
        key = tuple(sorted(labels))
        series = samples.setdefault(name, {})
        assert key not in series, f"{where}: series twice"
        series[key] = float(value)  # raises on a malformed value (NaN and +Inf parse)
    return samples
