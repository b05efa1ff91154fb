"""Can other users run this Python? bide's agents and its service user run the same install.

A venv made from an interpreter under a private home directory (pyenv, conda or uv under
``~``, a 0700 home) works for its owner and nobody else: every other user gets ``Permission
denied`` on a ``0755`` file, because a directory above the real interpreter (or its standard
library) is closed to them. The check reads permission bits only ("others" must be able to
enter each directory, list the last ones and run the interpreter); ACLs and group memberships
are not consulted, so a setup that relies on them may be warned about needlessly, never the
reverse for plain modes.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

__all__ = ["closed_to_others", "interpreter_paths", "interpreter_unreachable_by_others"]

FIX = (
    "make the venv from a system interpreter other users can run, e.g. "
    "`/usr/bin/python3 -m venv /opt/bide/venv`, and install bide into it "
    "(deploy/README.md, section 2)"
)


def interpreter_paths() -> list[Path]:
    """What another user needs to reach to run this bide: the interpreter as invoked (the
    venv's ``bin/python``, usually a symlink) and its real file, the venv, the standard
    library and the site-packages bide was installed into."""
    paths = [Path(sys.executable), Path(os.path.realpath(sys.executable)), Path(sys.prefix)]
    for name in ("stdlib", "purelib"):
        where = sysconfig.get_path(name)
        if where:
            paths.append(Path(where))
    return paths


def closed_to_others(paths: Iterable[Path]) -> str | None:
    """The first of ``paths`` (or a directory above one) that a user who is neither its owner
    nor in its group cannot reach, as a sentence naming it and its mode; None if all are
    open."""
    seen: set[Path] = set()
    for path in paths:
        if not path.is_absolute():
            path = Path.cwd() / path
        chain = [*reversed(path.parents), path]
        for i, step in enumerate(chain):
            if step in seen:
                continue
            seen.add(step)
            try:
                st = os.stat(step)
            except FileNotFoundError:
                break  # nothing there to reach (a site-packages directory never made)
            except OSError as exc:
                return f"{step}: cannot be examined ({exc.strerror})"
            mode = stat.S_IMODE(st.st_mode)
            last = i == len(chain) - 1
            if stat.S_ISDIR(st.st_mode):
                need, what = (stat.S_IXOTH | (stat.S_IROTH if last else 0)), "enter"
            else:
                need, what = stat.S_IXOTH, "run"
            if mode & need != need:
                return f"{step} is mode {mode:04o}: other users cannot {what} it"
    return None


def interpreter_unreachable_by_others() -> str | None:
    """Why other users (the service user, agents) cannot run the Python this process runs
    on, with the fix; None when they can. ``bide run`` warns with it at start."""
    problem = closed_to_others(interpreter_paths())
    if problem is None:
        return None
    return (
        f"other users cannot run this Python ({sys.executable}): {problem}; agents and the "
        f"service user will get `Permission denied`; {FIX}"
    )
