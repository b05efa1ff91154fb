"""The in-memory stories: bounded per operation and in number, told in log order."""

from __future__ import annotations

from daemon.history import Histories
from replay.events import OperationWithdrawn, encode_event


def _payload(op: str, n: int) -> bytes:
    return encode_event(OperationWithdrawn(operation_id=op, at=float(n), by=f"u{n}"))


def _numbers(histories: Histories, op: str) -> tuple[list[int], int, int]:
    kept = histories.events(op)
    assert kept is not None
    events, before_gap, dropped = kept
    return [int(e.at) for e in events], before_gap, dropped


def test_a_long_operation_keeps_its_beginning_and_its_latest_events() -> None:
    h = Histories(per_operation=16)  # 2 at the head, 14 at the tail
    for n in range(100):
        h.add("op", _payload("op", n), "live")
    numbers, before_gap, dropped = _numbers(h, "op")
    assert numbers == [0, 1, *range(86, 100)]
    assert (before_gap, dropped) == (2, 84)
    assert len(numbers) + dropped == 100


def test_events_loaded_after_a_restart_go_in_front_with_one_gap() -> None:
    h = Histories(per_operation=16)
    for n in range(50, 60):
        h.add("op", _payload("op", n), "live")
    earlier = Histories(per_operation=16)
    for n in range(50):
        earlier.add("op", _payload("op", n), "live")
    h.merge(earlier._events)
    numbers, before_gap, dropped = _numbers(h, "op")
    assert numbers == [0, 1, *range(46, 60)]
    assert (before_gap, dropped) == (2, 44)
    assert h.loaded


def test_only_the_most_recently_ended_operations_are_kept() -> None:
    h = Histories(closed_limit=2)
    for op in ("a", "b", "c"):
        h.add(op, _payload(op, 1), "closed")
    h.add("live", _payload("live", 1), "live")
    assert h.events("a") is None
    assert h.events("b") is not None
    assert h.events("c") is not None
    assert h.events("live") is not None
