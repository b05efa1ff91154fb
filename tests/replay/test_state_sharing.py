"""evolve shares what repeats across operations (issue 8), and the sharing changes no value."""

from __future__ import annotations

import gc

import msgspec

from replay import Operation, decode_event, encode_event, evolve, fold
from replay.state import compact

from .helpers import Daemon, body


def _two() -> tuple[Daemon, Daemon]:
    a = Daemon.start(operation_id="a", provider_job_id="exp_a")
    b = Daemon.start(operation_id="b", provider_job_id="exp_b")
    for d in (a, b):
        d.poll_and_respond(content=body("running", job_id=d.op.provider_job_id))
        d.poll_and_respond(status=503)
    return a, b


def _replayed(d: Daemon) -> Operation:
    """The state folded from the decoded log, as the daemon does after a restart."""
    [op] = fold(decode_event(encode_event(e)) for e in d.log).values()
    return op


def test_operations_polled_alike_share_contract_histogram_and_strings() -> None:
    a, b = (_replayed(d) for d in _two())
    assert a.histogram == b.histogram
    assert a.histogram.status_codes == {"200": 1, "503": 1}
    assert a.histogram.job_states == {"running": 1}
    assert a.histogram is b.histogram
    assert a.contract is b.contract
    assert a.contract_digest is b.contract_digest
    assert a.provider is b.provider
    assert a.account_context is b.account_context
    assert a.last_state is b.last_state
    assert a.results is b.results
    assert a.results == {}


def test_sharing_changes_no_value_and_no_encoding() -> None:
    for d in _two():
        op = _replayed(d)
        assert op == d.op
        assert msgspec.json.encode(op) == msgspec.json.encode(d.op)
        assert compact(op) == op
        assert msgspec.json.encode(compact(op)) == msgspec.json.encode(op)


def test_compact_shares_a_state_built_another_way() -> None:
    a, b = _two()
    rebuilt = msgspec.json.decode(msgspec.json.encode(a.op), type=Operation)
    assert rebuilt == a.op
    assert rebuilt.histogram is not b.op.histogram
    shared = compact(rebuilt)
    assert shared == a.op
    assert shared.histogram is b.op.histogram
    assert shared.contract is b.op.contract


def test_a_new_count_gets_its_own_histogram() -> None:
    a, b = _two()
    a.poll_and_respond(content=body("running", job_id="exp_a"))
    assert a.op.histogram.status_codes == {"200": 2, "503": 1}
    assert b.op.histogram.status_codes == {"200": 1, "503": 1}


def test_same_instants_share_one_float() -> None:
    d = Daemon.start()
    d.poll_and_respond(content=body("running"))
    op = _replayed(d)
    assert op.last_state_at == op.last_http_at
    assert op.last_state_at is op.last_http_at
    assert op.started_at is op.registered_at


def test_operation_is_not_tracked_by_the_collector() -> None:
    d = Daemon.start()
    d.poll_and_respond(content=body("running"))
    assert not gc.is_tracked(d.op)
    assert evolve(d.op, d.log[-1]) is not None
