"""``bide verify``'s archive side: a live log from its archive boundary, and ``--archive``.

Kept apart from :mod:`daemon.commands.verify` so the auditor's command stays one place for
everything else; it calls :func:`verified` where it used to verify the directory alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from daemon.errors import UsageError
from eventlog.archive import ArchiveError, verify_chain
from eventlog.boundary import verify_live
from eventlog.keys import VerifyKey
from eventlog.verify import Progress, Report


def add_archive_flag(p: Any) -> None:
    p.add_argument(
        "--archive",
        metavar="DEST",
        action="append",
        default=[],
        help="an archive `bide log archive` wrote (repeatable, any order): verify the "
        "archives and the live log as one chain, from record 0 (without it, a log whose "
        "first segments were archived is verified from its boundary checkpoint)",
    )


def verified(
    args: argparse.Namespace,
    log_dir: Path,
    verify_key: VerifyKey,
    anchor: tuple[int, str] | None,
    progress: Progress | None = None,
) -> Report:
    """The report on ``log_dir``: with ``--archive``, archives and live log as one chain;
    else the live log, from its archive boundary when it has one (``progress`` shown)."""
    archives = [Path(d) for d in getattr(args, "archive", [])]
    if not archives:
        return verify_live(log_dir, verify_key, anchor=anchor, jobs=args.jobs, progress=progress)
    for dest in archives:
        if not dest.is_dir():
            raise UsageError(f"--archive {dest}: no such directory")
    try:
        return verify_chain(archives, log_dir, verify_key, anchor=anchor, jobs=args.jobs)
    except ArchiveError as exc:
        raise UsageError(f"--archive: {exc}") from None
