"""``bide`` under ``tracemalloc``, for finding what the real daemon keeps (issue 38).

``python -m tests.bench.traced_daemon DIR run --config bide.toml``

Imports the daemon's command line, starts ``tracemalloc`` (8 frames: 25 slowed the daemon
to about 4 registrations a second), then runs it. Each ``SIGUSR2`` collects garbage and writes a
snapshot to ``DIR/trace-N.snap`` (N counting from 0), then ``DIR/trace-N.done`` once it is whole.
Compare two with :mod:`tests.bench.trace_retention`. Kept out of the daemon: production code
knows nothing of it.
"""

from __future__ import annotations

import gc
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    from daemon.cli import main as bide

    tracemalloc.start(8)
    taken = 0

    def dump(signum: int, frame: FrameType | None) -> None:
        nonlocal taken
        gc.collect()
        tracemalloc.take_snapshot().dump(str(out / f"trace-{taken}.snap"))
        (out / f"trace-{taken}.done").touch()
        taken += 1

    signal.signal(signal.SIGUSR2, dump)
    return bide(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
