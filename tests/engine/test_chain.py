"""The chain feeds every follower each durable event, with its operation's state before and
after, and tells it when a batch ends; ``handle`` decides and records in one path."""

from __future__ import annotations

from pathlib import Path

from daemon.engine.intake import Register, Withdraw
from daemon.engine.supervisor import Supervisor
from replay.events import LogEvent, OperationRegistered, OperationWithdrawn, PollScheduled
from replay.ledger import Ledger
from replay.observations import Withdrawal
from replay.state import Operation
from tests.engine.test_intake import ALICE, registration, run_engine


class Recorder:
    """A follower that keeps what it was told."""

    def __init__(self) -> None:
        self.seen: list[tuple[type[LogEvent], str | None, str | None]] = []
        self.batches = 0

    def replayed(self, ledger: Ledger, head_seq: int) -> None:
        pass

    def event(
        self, ev: LogEvent, payload: bytes, before: Operation | None, after: Operation | None
    ) -> None:
        self.seen.append(
            (type(ev), before.phase if before else None, after.phase if after else None)
        )

    def batch_done(self) -> None:
        self.batches += 1


def test_a_follower_sees_each_event_with_the_state_before_and_after(tmp_path: Path) -> None:
    recorder = Recorder()

    async def scenario(engine: Supervisor) -> None:
        engine.chain.follow(recorder)
        await engine.intake.register(Register(registration("nightly"), ALICE))
        assert recorder.batches == 1
        events = await engine.chain.handle(
            engine.ops["nightly"], Withdrawal(by="alice", by_uid=ALICE)
        )
        assert [type(e) for e in events] == [OperationWithdrawn]
        assert recorder.batches == 2
        # Nothing left to decide: nothing recorded, no batch.
        assert await engine.intake.withdraw(Withdraw("nightly", Withdrawal(by="alice"))) is False
        assert recorder.batches == 2

    run_engine(tmp_path, scenario)
    assert recorder.seen[0] == (OperationRegistered, None, "live")
    assert recorder.seen[-1] == (OperationWithdrawn, "live", "closed")
    assert all(kind is not PollScheduled or after == "live" for kind, _, after in recorder.seen)
