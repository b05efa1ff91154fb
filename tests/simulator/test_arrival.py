"""A request's arrival time is when its bytes reached the host, not when the simulator read
them: the tests judge quotas and lease terms at the provider by it, and a busy test process
(or machine) makes the simulator read late."""

from __future__ import annotations

import socket
import time

import anyio
import pytest

from daemon.simulator import RequestRecord, Script, Simulator, stamped

HELD = 0.4  # seconds the simulator's event loop is kept from running


@pytest.mark.skipif(
    stamped._SO_TIMESTAMPNS is None,
    reason="the kernel's receive stamps (SO_TIMESTAMPNS) are read on Linux with the generic "
    "socket options only",
)
def test_a_request_read_late_is_stamped_when_its_bytes_arrived(script: Script) -> None:
    async def scenario() -> tuple[float, float, RequestRecord]:
        simulator = Simulator(script)
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(simulator.serve)
            with socket.create_connection((host, port), timeout=5) as sock:
                sent = time.time()
                sock.sendall(b"GET /jobs/seq HTTP/1.1\r\nHost: x\r\n\r\n")
                # The loop is held, as a busy process holds it: nothing is accepted or read.
                time.sleep(HELD)  # noqa: ASYNC251 (holding the loop is the point)
                held_until = time.time()
                answer = await anyio.to_thread.run_sync(sock.recv, 4096)
                assert answer.startswith(b"HTTP/1.1 200 ")
            tg.cancel_scope.cancel()
        [record] = simulator.requests()
        return sent, held_until, record

    sent, held_until, record = anyio.run(scenario)
    assert held_until - sent >= HELD
    assert sent <= record.wall < sent + 0.05, (record.wall - sent, held_until - sent)
    assert record.monotonic < time.monotonic() - HELD + 0.05
