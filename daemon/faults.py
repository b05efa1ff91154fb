"""A fault-injection seam for the barrier's tests, off unless the environment names it.

``BIDE_FAULT_INJECT=STAGE:KEY[,STAGE:KEY...]`` makes the daemon raise a ``RuntimeError`` at
that stage for that key, every time it gets there: stages ``poll`` (before the intent),
``request`` (the intent durable, before the request), ``send`` (the poller's own checks of
the deadline and the lease passed, just before the status client is asked to send),
``decide`` (the answer in, before its decision), ``action`` (an action id), ``ingest`` (a
spool file name) and ``archive`` (a stage
of ``bide log archive``: ``segments``, ``manifest``, ``boundary``, ``removing``). The
end-to-end tests use it to prove that a bug in one operation stops that operation alone (and
that an interrupted archive loses nothing); a daemon that reads it says so loudly at start.
Nothing else reads the variable.

``STAGE:KEY:stop`` instead stops the whole process there (SIGSTOP to itself), the first time
only: the multi-node tests pause a node exactly between a durable intent and its request
(``request``), or after the last check the poller makes before sending it (``send``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from daemon import logfmt

ENV = "BIDE_FAULT_INJECT"
STAGES = ("poll", "request", "send", "decide", "action", "ingest", "archive")


#: Stops taken in this process (a node builds a daemon, and its faults, once per term).
_STOPPED: set[tuple[str, str]] = set()


class InjectedFault(RuntimeError):
    """Raised where ``BIDE_FAULT_INJECT`` asked for it."""


@dataclass(frozen=True)
class FaultInjection:
    points: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    stops: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # once a process

    @classmethod
    def from_environment(cls) -> FaultInjection:
        spec = os.environ.get(ENV, "")
        points: set[tuple[str, str]] = set()
        stops: set[tuple[str, str]] = set()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            stage, _, rest = item.partition(":")
            key, _, how = rest.partition(":")
            if stage in STAGES and key:
                (stops if how == "stop" else points).add((stage, key))
        if points or stops:
            logfmt.warn(
                f"FAULT INJECTION ENABLED by {ENV}: this daemon will fail on purpose",
                points=",".join(f"{s}:{k}" for s, k in sorted(points)),
                stops=",".join(f"{s}:{k}" for s, k in sorted(stops)),
            )
        return cls(frozenset(points), frozenset(stops))

    def fire(self, stage: str, key: str) -> None:
        if self.stops and (stage, key) in self.stops - _STOPPED:
            _STOPPED.add((stage, key))
            logfmt.warn("FAULT INJECTION: stopping this process here", stage=stage, key=key)
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.points and (stage, key) in self.points:
            raise InjectedFault(f"injected at {stage}")
