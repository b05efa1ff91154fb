"""replay: bide's pure polling model (sans-I/O). No clock, no randomness, no I/O.

The rules it enforces are numbered S1-S40 in ``replay/CONTRACT.md`` (what each does, why, what
it records, and the tests that hold it); the code and the tests cite those numbers.

Public API (everything below is re-exported here):

``replay.events``
    ``Event`` (the union of every stored event), ``encode_event(event) -> bytes``,
    ``decode_event(data: bytes) -> Event`` (raises ``NewerSchemaError`` for a newer log), the
    event classes, ``Option``, ``EscalationContext``, ``Histogram``, ``ResponseHeaders``.
``replay.contract``
    ``Contract``, ``StateTable``, ``ResultField``; ``contract_digest(contract) -> str``.
``replay.observations``
    ``Registration``; the transient observations ``WakeUp()``, ``QuotaDeferred(until=...)``,
    ``DecisionSubmitted(option=..., approver=..., note=..., escalation_id=None)``;
    ``Observation`` (those three plus the stored facts ``StatusResponseReceived``,
    ``TransportFailed``, ``RequestOutcomeUnknown``).
``replay.state``
    ``Operation`` (the S5/S12 record), ``evolve(state, event) -> Operation``,
    ``fold(events) -> dict[str, Operation]``.
``replay.decide``
    ``register(request, contract, now) -> list[Event]`` (``[OperationRegistered]`` or
    ``[RegistrationRejected]``), ``decide(op, observation, now, draw) -> list[Event]``.
``replay.story``
    ``story(events) -> str``, ``story_json(events) -> list[dict[str, object]]``.
``replay.check``
    ``check(events) -> list[Mismatch]``.
``replay.errors``
    ``ReplayError`` and its subclasses.

Deciding a response is two steps, each a module of its own (not re-exported here):
``replay.reading.read_response(op, response, now) -> Reading`` turns what came back into
facts (status, body, state, job identity, results, the provider's error, hints, each
validated), and ``replay.decide.decide_reading(op, reading, request_number, now, draw)``
applies the rules to them; ``decide`` does both. What an approved extension puts in force, by
the operation's recorded ``extend_rule``, and the label that states it, are
``replay.extension.extended`` and ``extension_label`` (not re-exported either).

The daemon's protocol: for a stored fact, evolve the operation with it and append the fact
followed by ``decide(op, fact, now, draw)`` (in one batch, or the fact first; a log that ends
between the two is completed by deciding the fact on restart); for a wake-up, a quota
deferral or a human decision, append ``decide(op, observation, now, draw)``. Make every
``StatusRequestIntended`` durable before the request is sent (S13). A log written this way
passes ``check``.
"""

from __future__ import annotations

from replay.check import Mismatch, check
from replay.contract import Contract, ResultField, StateTable, contract_digest
from replay.decide import decide, register
from replay.errors import (
    EventDecodeError,
    InvalidInputError,
    NewerSchemaError,
    ReplayError,
    ReplayOrderError,
)
from replay.events import (
    DecisionRecorded,
    DecisionRejected,
    EscalationContext,
    EscalationRaised,
    Event,
    HintRejected,
    Histogram,
    NodeTookOver,
    OperationRegistered,
    OperationStopped,
    OperationSucceeded,
    OperationWithdrawn,
    Option,
    PollScheduled,
    RegistrationRejected,
    RequestOutcomeUnknown,
    ResponseClassified,
    ResponseHeaders,
    StatusRequestIntended,
    StatusResponseReceived,
    TransportFailed,
    decode_event,
    encode_event,
)
from replay.observations import (
    DecisionSubmitted,
    Observation,
    QuotaDeferred,
    Registration,
    WakeUp,
)
from replay.state import Operation, evolve, fold
from replay.story import story, story_json

__all__ = [
    "Contract",
    "DecisionRecorded",
    "DecisionRejected",
    "DecisionSubmitted",
    "EscalationContext",
    "EscalationRaised",
    "Event",
    "EventDecodeError",
    "HintRejected",
    "Histogram",
    "InvalidInputError",
    "Mismatch",
    "NewerSchemaError",
    "NodeTookOver",
    "Observation",
    "Operation",
    "OperationRegistered",
    "OperationStopped",
    "OperationSucceeded",
    "OperationWithdrawn",
    "Option",
    "PollScheduled",
    "QuotaDeferred",
    "Registration",
    "RegistrationRejected",
    "ReplayError",
    "ReplayOrderError",
    "RequestOutcomeUnknown",
    "ResponseClassified",
    "ResponseHeaders",
    "ResultField",
    "StateTable",
    "StatusRequestIntended",
    "StatusResponseReceived",
    "TransportFailed",
    "WakeUp",
    "check",
    "contract_digest",
    "decide",
    "decode_event",
    "encode_event",
    "evolve",
    "fold",
    "register",
    "story",
    "story_json",
]
