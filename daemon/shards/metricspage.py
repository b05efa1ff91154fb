"""The sharded node's ``/metrics``: every active shard's page, each sample labelled with its
shard, merged into one exposition (each family's HELP and TYPE once, its samples together),
plus the node's own series.

A shard's page is the engine's (:meth:`daemon.engine.supervisor.Supervisor.render_metrics`),
so the series names the alert rules use stay the same; what belongs to the process rather
than a shard (the build, the process's CPU and memory, whether the node is active) comes
once, from the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Families a shard's page carries that describe the process, not the shard: the node
#: serves them once.
NODE_FAMILIES = ("bide_build_info", "bide_node_active")
NODE_PREFIXES = ("process_",)


def _family_of(line: str) -> str:
    """The metric name a sample line starts with."""
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop)
        if at != -1:
            end = min(end, at)
    return line[:end]


def with_label(sample: str, label: str) -> str:
    """``sample`` with ``label`` (``shard="3"``) first among its labels."""
    name = _family_of(sample)
    rest = sample[len(name) :]
    if rest.startswith("{"):
        inner = rest[1:]
        return f"{name}{{{label}{',' if not inner.startswith('}') else ''}{inner}"
    return f"{name}{{{label}}}{rest}"


def _is_node_family(name: str) -> bool:
    return name in NODE_FAMILIES or name.startswith(NODE_PREFIXES)


def merge(pages: Mapping[int, str], node_lines: Iterable[str]) -> str:
    """One exposition: ``node_lines`` first, then every family of the shards' ``pages``
    (shard -> page) with ``shard="k"`` on each sample."""
    meta: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for shard, page in sorted(pages.items()):
        family = ""
        for line in page.splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    if not _is_node_family(family):
                        known = meta.setdefault(family, [])
                        if len(known) < 2 and line not in known:
                            known.append(line)
                        samples.setdefault(family, [])
                continue
            name = _family_of(line)
            owner = family if family and name.startswith(family) else name
            if _is_node_family(owner):
                continue
            samples.setdefault(owner, []).append(with_label(line, f'shard="{shard}"'))
    out = list(node_lines)
    for family, lines in samples.items():
        out += meta.get(family, [])
        out += lines
    return "\n".join(out) + "\n"
