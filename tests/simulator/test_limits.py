"""A client cannot wedge the simulator: header and body caps, read timeouts."""

from __future__ import annotations

import socket
import time

import httpx

from daemon.simulator import Limits, Script, SimulatorHandle, run_in_thread

LIMITS = Limits(max_header_bytes=2048, max_body_bytes=1024, read_timeout=0.3)


def _exchange(sim: SimulatorHandle, data: bytes) -> bytes:
    """Send raw bytes and read until the simulator closes (bounded by the socket timeout)."""
    with socket.create_connection(sim.address, timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_oversized_headers_get_431(script: Script) -> None:
    with run_in_thread(script, limits=LIMITS) as sim:
        big = b"X-Big: " + b"a" * 4096 + b"\r\n"
        answer = _exchange(sim, b"GET /jobs/seq HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 431 ")
        assert httpx.get(sim.job_url("seq")).status_code == 200
        assert sim.requests(kind="status")[0].call == 1  # the refused request used no step
        assert sim.requests(kind="bad_request")[0].status == 431


def test_oversized_body_gets_413(script: Script) -> None:
    with run_in_thread(script, limits=LIMITS) as sim:
        response = httpx.post(sim.url("/jobs"), content=b"x" * 5000)
        assert response.status_code == 413
        [record] = sim.requests(kind="bad_request")
        assert (record.method, record.target, record.status) == ("POST", "/jobs", 413)
        assert sim.requests(kind="submit") == []


def test_garbage_gets_400(script: Script) -> None:
    with run_in_thread(script, limits=LIMITS) as sim:
        assert _exchange(sim, b"\x16\x03\x01 not http\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_silent_and_half_sent_requests_are_dropped_after_the_read_timeout(script: Script) -> None:
    with run_in_thread(script, limits=LIMITS) as sim:
        started = time.monotonic()
        assert _exchange(sim, b"") == b""
        assert _exchange(sim, b"GET /jobs/seq HTTP/1.1\r\nHost: x\r\n") == b""
        assert time.monotonic() - started < 4
        assert sim.requests() == []
        assert httpx.get(sim.job_url("seq")).status_code == 200


def test_keep_alive_serves_several_requests_on_one_connection(script: Script) -> None:
    with run_in_thread(script) as sim, httpx.Client() as client:
        for _ in range(3):
            client.get(sim.job_url("seq"))
        ports = set()
        for record in sim.requests():
            assert record.status == 200
            ports.add(record.seq)
        assert len(ports) == 3
