"""Builders and a fake daemon that follows the replay protocol (a fake, not a mock)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import msgspec

from replay import (
    Contract,
    DecisionSubmitted,
    Event,
    Operation,
    QuotaDeferred,
    Registration,
    RequestOutcomeUnknown,
    ResponseHeaders,
    StateTable,
    StatusResponseReceived,
    TransportFailed,
    WakeUp,
    decide,
    evolve,
    register,
)
from replay.events import TransportKind

T0 = 1_744_970_400.0  # 2025-04-18T10:00:00Z
HOUR = 3600.0


def contract(**overrides: object) -> Contract:
    """The article's export provider, with overrides."""
    base: dict[str, object] = {
        "provider": "acme",
        "states": {
            "pending": ["queued", "running", "processing"],
            "success": ["succeeded"],
            "failure": ["failed"],
            "canceled": ["canceled"],
            "expired": ["expired"],
        },
        "state_pointer": "/state",
        "job_id_pointer": "/job_id",
        "results": [{"name": "url", "pointer": "/result/url", "kind": "https_url"}],
        "next_check_at_pointer": "/next_check_at",
        "poll_after_seconds_pointer": "/poll_after_seconds",
        "expires_at_pointer": "/expires_at",
        "error_pointer": "/error",
        "not_found_grace_seconds": 30.0,
        "backoff_base_seconds": 5.0,
        "backoff_cap_seconds": 120.0,
        "rate_limited_delay_seconds": 300.0,
        "default_deadline_seconds": 2400.0,
        "default_max_status_requests": 12,
        "default_max_transport_failures": 3,
        "default_max_rate_limited": 3,
    }
    base.update(overrides)
    return msgspec.convert(base, Contract)


def simple_contract(**overrides: object) -> Contract:
    """A contract without the optional pointers (no id check, no results, no hints)."""
    return Contract(
        provider="acme",
        states=StateTable(pending=("running",), success=("done",), failure=("failed",)),
        state_pointer="/state",
        **overrides,  # type: ignore[arg-type]
    )


def registration(**overrides: object) -> Registration:
    base: dict[str, object] = {
        "operation_id": "report-export-2025-04-18-01",
        "provider": "acme",
        "provider_job_id": "exp_71c",
        "account_context": "acme/reports",
        "request_fingerprint": "sha256:abc",
    }
    base.update(overrides)
    return msgspec.convert(base, Registration)


def body(state: str | None = "running", **fields: object) -> bytes:
    doc: dict[str, object] = {"job_id": "exp_71c"}
    if state is not None:
        doc["state"] = state
    doc.update(fields)
    return json.dumps(doc).encode()


OK_RESULT = {"url": "https://files.example.com/exp_71c.csv?sig=SECRET"}


@dataclass
class Daemon:
    """Follows the protocol of replay/__init__.py: fact -> evolve -> decide -> append."""

    op: Operation
    log: list[Event] = field(default_factory=list)

    @classmethod
    def start(cls, c: Contract | None = None, now: float = T0, **reg: object) -> Daemon:
        events = register(registration(**reg), c or contract(), now)
        op = evolve(None, events[0])
        return cls(op=op, log=list(events))

    def _append(self, events: list[Event]) -> list[Event]:
        for e in events:
            self.op = evolve(self.op, e)
            self.log.append(e)
        return events

    def wake(self, now: float) -> list[Event]:
        return self._append(decide(self.op, WakeUp(), now, 0.0))

    def poll(self, now: float) -> int:
        """Wake at ``now`` and return the request number intended (asserts one was)."""
        events = self.wake(now)
        assert len(events) == 1, events
        assert events[0].__struct_config__.tag == "status_request_intended"
        return self.op.status_requests_used

    def respond(
        self,
        now: float,
        status: int = 200,
        content: bytes = b"",
        draw: float = 0.5,
        truncated: bool = False,
        headers: dict[str, str] | None = None,
    ) -> list[Event]:
        fact = StatusResponseReceived(
            operation_id=self.op.operation_id,
            at=now,
            request_number=self.op.status_requests_used,
            status_code=status,
            headers=msgspec.convert(headers or {}, ResponseHeaders),
            body=content,
            body_truncated=truncated,
        )
        self._append([fact])
        return self._append(decide(self.op, fact, now, draw))

    def fail(self, now: float, kind: TransportKind, draw: float = 0.5) -> list[Event]:
        fact = TransportFailed(
            operation_id=self.op.operation_id,
            at=now,
            request_number=self.op.status_requests_used,
            kind=kind,
            detail="simulated",
        )
        self._append([fact])
        return self._append(decide(self.op, fact, now, draw))

    def outcome_unknown(self, now: float, draw: float = 0.5) -> list[Event]:
        fact = RequestOutcomeUnknown(
            operation_id=self.op.operation_id,
            at=now,
            request_number=self.op.status_requests_used,
        )
        self._append([fact])
        return self._append(decide(self.op, fact, now, draw))

    def quota(self, now: float, until: float) -> list[Event]:
        return self._append(decide(self.op, QuotaDeferred(until=until), now, 0.0))

    def decision(
        self, now: float, option: str, approver: str = "alice", note: str = ""
    ) -> list[Event]:
        d = DecisionSubmitted(option=option, approver=approver, note=note)
        return self._append(decide(self.op, d, now, 0.0))

    def poll_and_respond(
        self,
        status: int = 200,
        content: bytes | None = None,
        draw: float = 0.5,
        headers: dict[str, str] | None = None,
        **h: str,
    ) -> list[Event]:
        """Poll when due and answer at the same instant; ``h`` are header fields."""
        now = self.op.next_poll_at
        self.poll(now)
        content = body() if content is None else content
        return self.respond(now, status, content, draw, headers={**(headers or {}), **h})


def tags(events: list[Event]) -> list[str]:
    return [str(e.__struct_config__.tag) for e in events]
