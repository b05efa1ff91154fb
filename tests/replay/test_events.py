"""Event encoding: stable tags, round trips, versioning, forward compatibility."""

from __future__ import annotations

import json

import msgspec
import pytest

from replay import (
    EventDecodeError,
    NewerSchemaError,
    ReplayError,
    decode_event,
    encode_event,
)
from replay.errors import InvalidEventError
from replay.events import (
    EVENT_TYPES,
    SCHEMA_MAJOR,
    ResponseHeaders,
    StatusResponseReceived,
    decode_log_event,
    encode_checked,
)

from .helpers import T0, Daemon, body

#: Tags are stored in logs: changing one is a breaking change. This table is the contract.
STABLE_TAGS = {
    "OperationRegistered": "operation_registered",
    "RegistrationRejected": "registration_rejected",
    "StatusResponseReceived": "status_response_received",
    "TransportFailed": "transport_failed",
    "RequestOutcomeUnknown": "request_outcome_unknown",
    "StatusRequestIntended": "status_request_intended",
    "ResponseClassified": "response_classified",
    "HintRejected": "hint_rejected",
    "PollScheduled": "poll_scheduled",
    "OperationSucceeded": "operation_succeeded",
    "OperationStopped": "operation_stopped",
    "EscalationRaised": "escalation_raised",
    "DecisionRecorded": "decision_recorded",
    "DecisionRejected": "decision_rejected",
    "OperationWithdrawn": "operation_withdrawn",
    "NodeTookOver": "node_took_over",
}


def test_tags_are_explicit_and_stable() -> None:
    assert {t.__name__: t.__struct_config__.tag for t in EVENT_TYPES} == STABLE_TAGS


def test_events_are_frozen_and_do_not_forbid_unknown_fields() -> None:
    for t in EVENT_TYPES:
        assert t.__struct_config__.frozen, t
        assert not t.__struct_config__.forbid_unknown_fields, t


def _full_log() -> list[object]:
    d = Daemon.start(business_deadline_at=T0 + 2000, max_transport_failures=5)
    d.poll_and_respond(content=body("running", poll_after_seconds=-1), request_id="r")
    d.poll_and_respond(status=503, retry_after="30")
    now = d.op.next_poll_at
    d.poll(now)
    d.fail(now + 1, "read_timeout")
    now = d.op.next_poll_at
    d.poll(now)
    d.outcome_unknown(now + 5)
    d.poll_and_respond(content=body("paused"))
    d.decision(d.op.next_poll_at + 10, "nope")
    d.decision(d.op.next_poll_at + 10, "extend")
    d.poll_and_respond(content=body("succeeded", result={"url": "https://x.example/f"}))
    return list(d.log)


def test_every_event_type_round_trips() -> None:
    log = _full_log()
    seen = {type(e) for e in log}
    from replay import RegistrationRejected

    log.append(RegistrationRejected(operation_id="x", at=T0, reason="empty_job_id"))
    seen.add(RegistrationRejected)
    from replay import OperationWithdrawn

    log.append(OperationWithdrawn(operation_id="x", at=T0, by="alice", by_uid=1001, note="n"))
    seen.add(OperationWithdrawn)
    from replay import NodeTookOver

    log.append(NodeTookOver(operation_id="x", at=T0, node="b", holder="b/7/abc", epoch=3))
    seen.add(NodeTookOver)
    assert seen == set(EVENT_TYPES), set(EVENT_TYPES) - seen
    for event in log:
        data = encode_event(event)  # type: ignore[arg-type]
        assert json.loads(data)["schema"] == SCHEMA_MAJOR
        assert decode_event(data) == event


def test_newer_major_schema_fails_with_upgrade_message() -> None:
    data = json.loads(encode_event(_full_log()[0]))  # type: ignore[arg-type]
    data["schema"] = SCHEMA_MAJOR + 1
    with pytest.raises(NewerSchemaError) as info:
        decode_event(json.dumps(data).encode())
    message = str(info.value)
    assert f"newer bide (schema {SCHEMA_MAJOR + 1}); upgrade bide" in message
    assert isinstance(info.value, ReplayError)


def test_unknown_event_type_fails_with_upgrade_message() -> None:
    payload = {"schema": 1, "minor": 3, "event": {"type": "job_teleported", "operation_id": "o"}}
    with pytest.raises(NewerSchemaError, match="upgrade bide"):
        decode_event(json.dumps(payload).encode())


def test_newer_minor_with_unknown_fields_still_decodes() -> None:
    event = _full_log()[1]
    data = json.loads(encode_event(event))  # type: ignore[arg-type]
    data["minor"] = 7
    data["event"]["field_from_the_future"] = {"x": 1}
    data["future_envelope_field"] = True
    assert decode_event(json.dumps(data).encode()) == event


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"[]",
        b'{"schema": 1}',
        b'{"schema": 0, "event": {}}',
        b'{"schema": 1, "event": {"type": "poll_scheduled"}}',
        b'{"schema": 1, "event": {"type": "transport_failed", "operation_id": "o", "at": 1,'
        b' "request_number": 0, "kind": "dns"}}',
        b'{"schema": 1, "event": {"type": "transport_failed", "operation_id": "o", "at": 1,'
        b' "request_number": 1, "kind": "cosmic_ray"}}',
    ],
)
def test_garbage_is_a_decode_error_not_a_misread(payload: bytes) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_event(payload)
    assert not isinstance(info.value, NewerSchemaError)


def test_old_payload_without_new_defaulted_fields_decodes() -> None:
    # A minor-version-0 payload written before optional fields existed (defaults fill them).
    payload = {
        "schema": 1,
        "event": {
            "type": "poll_scheduled",
            "operation_id": "o",
            "at": 1.0,
            "next_poll_at": 2.0,
            "delay_source": "local_backoff",
            "raw_delay": 1.0,
            "delay": 1.0,
        },
    }
    event = decode_event(json.dumps(payload).encode())
    assert msgspec.structs.asdict(event)["draw"] is None


def test_an_event_that_would_not_read_back_is_never_encoded_for_the_log() -> None:
    """Issue 20: a status code of 999 was appended and then failed every reader."""
    good = StatusResponseReceived(
        operation_id="op",
        at=1.0,
        request_number=1,
        status_code=200,
        headers=ResponseHeaders(),
        body=b"{}",
    )
    assert decode_log_event(encode_checked(good)) == good
    bad = msgspec.structs.replace(good, status_code=999)
    with pytest.raises(InvalidEventError, match="StatusResponseReceived"):
        encode_checked(bad)
    with pytest.raises(InvalidEventError):
        encode_checked(msgspec.structs.replace(good, at=float("nan")))
