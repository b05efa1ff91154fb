"""Where a status request's CPU goes: a py-spy profile of the saturated daemon, by stage.

``BIDE_BENCH_PYSPY=FILE`` makes ``bench_scale`` record the daemon over its window with
``py-spy record --nonblocking --gil -f raw``; then

    python -m tests.bench.profile FILE --us-per-request 950

prints each stage's share of the samples and, scaled to the measured CPU per request, its
microseconds. Each sample counts for the innermost Python frame (a C call, such as the AEAD,
counts for the line that made it), and that frame's file names the stage.

Why ``--nonblocking``: without it py-spy stops the process for every sample, and a running
thread stops only where it next enters the kernel, so the samples pile up right after system
calls. On this machine that put 21% of the event loop's samples on one line, asyncio's
``get_running_loop`` (which calls ``getpid``), against 1.4% without the stop. Non-blocking
reads can tear a stack's outer frames; the innermost one, which is all this counts, is read
first.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

#: (stage, patterns of the innermost frame's file), first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "bide's HTTP wrapper: headers, credential, the deadline scope, the fact",
        ("daemon/http.py", "daemon/connections.py"),
    ),
    ("the log: framing, AEAD, hashing, writes, the kernel's fdatasync", ("eventlog/",)),
    ("the model: decide, evolve, encoding and checking events", ("replay/",)),
    ("the poll loop: supervisor, timers, quota, metrics", ("daemon/",)),
    (
        "httpx, httpcore, h11: the HTTP exchange",
        ("httpx/", "httpcore/", "h11/", "idna/", "urllib/"),
    ),
    ("anyio: tasks, cancel scopes, locks, semaphores", ("anyio/", "sniffio/")),
    ("asyncio: the event loop, transports, selectors", ("asyncio/", "selectors.py", "socket.py")),
)
OTHER = "the rest of the standard library (contextlib, abc, typing, ...)"
_FILE = re.compile(r"\(([^():]+):\d+\)\s*$")


def stages(lines: list[str]) -> tuple[int, Counter[str]]:
    """(samples, samples per stage) of a raw py-spy file's lines."""
    total, found = 0, Counter[str]()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        match = _FILE.search(stack.rsplit(";", 1)[-1])
        path = match.group(1) if match else ""
        found[
            next((name for name, patterns in STAGES if any(p in path for p in patterns)), OTHER)
        ] += n
    return total, found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", type=Path, help="raw output of py-spy record -f raw")
    p.add_argument(
        "--us-per-request",
        type=float,
        required=True,
        help="the measured CPU per request the samples are scaled to",
    )
    args = p.parse_args(argv)
    try:
        total, found = stages(args.file.read_text().splitlines())
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    if total == 0:
        print(
            f"{args.file} holds no samples (py-spy's raw format: 'frames;... count')",
            file=sys.stderr,
        )
        return 2
    print(f"{total} samples, scaled to {args.us_per_request:g} us per request")
    for name, n in found.most_common():
        print(f"{n / total * 100:6.1f}% {n / total * args.us_per_request:7.0f} us  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
