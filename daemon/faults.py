"""A fault-injection seam for the barrier's tests, off unless the environment names it.

``BIDE_FAULT_INJECT=STAGE:KEY[,STAGE:KEY...]`` makes the daemon raise a ``RuntimeError`` at
that stage for that key, every time it gets there: stages ``poll`` (before the intent),
``request`` (the intent durable, before the request), ``decide`` (the answer in, before its
decision), ``action`` (an action id) and ``ingest`` (a spool file name). The end-to-end tests
use it to prove that a bug in one operation stops that operation alone; a daemon that reads it
says so loudly at start. Nothing else reads the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from daemon import logfmt

ENV = "BIDE_FAULT_INJECT"
STAGES = ("poll", "request", "decide", "action", "ingest")


class InjectedFault(RuntimeError):
    """Raised where ``BIDE_FAULT_INJECT`` asked for it."""


@dataclass(frozen=True)
class FaultInjection:
    points: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    @classmethod
    def from_environment(cls) -> FaultInjection:
        spec = os.environ.get(ENV, "")
        points = set()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            stage, _, key = item.partition(":")
            if stage in STAGES and key:
                points.add((stage, key))
        if points:
            logfmt.warn(f"FAULT INJECTION ENABLED by {ENV}: this daemon will fail on purpose",
                        points=",".join(f"{s}:{k}" for s, k in sorted(points)))
        return cls(frozenset(points))

    def fire(self, stage: str, key: str) -> None:
        if self.points and (stage, key) in self.points:
            raise InjectedFault(f"injected at {stage}")
