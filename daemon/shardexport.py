"""A sharded log written out as files: one directory of segment files per shard, and
``shards.json`` saying which directory is which shard.

``bide log export`` writes it from the database; ``bide verify DIR`` and ``bide replay --check``
read it. Each ``shard-NNN/`` is byte for byte what the file store writes, so the one verifier
checks it alone too (``bide verify DIR/shard-007 --verify-key verify.pub``). ``shards.json`` is
a convenience for the tools, not evidence: every claim that matters is in the shards' own
signed chains.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.errors import UsageError

if TYPE_CHECKING:
    from eventlog.pgstore import PgSettings
    from eventlog.shards import Layout

SHARDS_FILE = "shards.json"
EXPORT_FORMAT = 1


def shard_dir_name(shard: int) -> str:
    return f"shard-{shard:03d}"


@dataclasses.dataclass(frozen=True)
class ShardExport:
    """An export directory's shards: the layout it came from and each exported shard's
    directory (all of them, unless the export was cut to some)."""

    root: Path
    base: str
    count: int
    dirs: dict[int, Path]


def export_shards(
    settings: PgSettings, layout: Layout, shards: list[int], out: Path
) -> dict[int, int]:
    """Write each of ``shards`` to ``out/shard-NNN/`` and then ``out/shards.json`` (written
    last: an interrupted export has no index, and the tools refuse it). Returns each shard's
    record count."""
    from daemon.pgconfig import naming_shard
    from eventlog.pgstore import PgLogStore

    if (out / SHARDS_FILE).exists():
        raise UsageError(f"{out} already holds an export ({SHARDS_FILE}); give an empty directory")
    counts: dict[int, int] = {}
    for shard in shards:
        with (
            naming_shard(layout, shard),
            PgLogStore(layout.settings(settings, shard), read_only=True) as store,
        ):
            store.require()
            counts[shard] = store.export(out / shard_dir_name(shard))
    index = {
        "format": EXPORT_FORMAT,
        "base": layout.base,
        "count": layout.count,
        "shards": {str(k): shard_dir_name(k) for k in shards},
        "records": {str(k): n for k, n in counts.items()},
    }
    tmp = out / f".{SHARDS_FILE}.tmp"
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    tmp.replace(out / SHARDS_FILE)
    return counts


def read_export(root: Path) -> ShardExport | None:
    """The sharded export at ``root``, or None when ``root`` holds no ``shards.json`` (a log
    directory of its own). A malformed index, one naming a directory that is missing or
    outside ``root``, or shard directories without an index (an interrupted export) is a
    usage error."""
    index = root / SHARDS_FILE
    if not index.is_file():
        children = [p.name for p in root.iterdir()] if root.is_dir() else []
        if any(re.fullmatch(r"shard-\d{3,4}", n) for n in children) and not any(
            n.startswith("seg-") for n in children
        ):
            raise UsageError(
                f"{root} holds shard directories but no {SHARDS_FILE}: an export that did not "
                f"finish (it is written last); export again into an empty directory"
            )
        return None
    try:
        data = json.loads(index.read_text())
        count = int(data["count"])
        base = str(data["base"])
        named = {int(k): str(v) for k, v in dict(data["shards"]).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{index} is not an export index bide wrote: {exc}") from None
    dirs: dict[int, Path] = {}
    for shard, name in sorted(named.items()):
        path = root / name
        if not 0 <= shard < count or "/" in name or name in ("", ".", "..") or not path.is_dir():
            raise UsageError(
                f"{index} names shard {shard} in {name!r}, which is not a directory of this "
                f"export (or not a shard of {count})"
            )
        dirs[shard] = path
    return ShardExport(root, base, count, dirs)


def chosen_exported(export: ShardExport, text: str | None) -> dict[int, Path]:
    """The exported shards ``--shard`` names (all by default), or a usage error."""
    from daemon.pgconfig import chosen_shards, one_shard
    from eventlog.shards import Layout

    wanted = chosen_shards(Layout(export.base, export.count), text)
    missing = [k for k in wanted if k not in export.dirs]
    if one_shard(text) and missing:
        raise UsageError(
            f"--shard {text}: this export holds shard(s) "
            f"{', '.join(str(k) for k in sorted(export.dirs))} only"
        )
    return {k: export.dirs[k] for k in wanted if k in export.dirs}
