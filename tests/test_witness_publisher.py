"""The daemon's publisher against a real `bide witness serve` (in a thread, on 127.0.0.1):
a log with more key certificates than one body should carry reaches a witness that has
never seen it, the proof sent ahead in parts; without the token nothing is taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx

from daemon.config import WitnessConfig
from daemon.witness.publisher import HeadPublisher
from daemon.witness.service import WitnessServer, WitnessState, make_server
from eventlog.headchain import chain_proof, log_lines
from eventlog.heads import HeadStore, read_heads
from tests.test_witness_state import TOKEN, _log, _state


@contextmanager
def _serving(state: WitnessState) -> Iterator[WitnessServer]:
    server = make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _publish(root: Path, url: str, token: bytes | None) -> HeadPublisher:
    config = WitnessConfig(urls=[url], retries=0, timeout_seconds=5)
    publisher = HeadPublisher(
        config,
        root / "state",
        HeadStore(root / "heads.jsonl"),
        None,
        token=token,
        certs_per_post=3,
        proof_for=lambda upto: chain_proof(log_lines(root / "log"), upto),
    )

    async def once() -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            await publisher.deliver_all(client)

    anyio.run(once)
    return publisher


def test_a_long_proof_goes_in_parts_and_only_with_the_token(tmp_path: Path) -> None:
    root = tmp_path / "a"
    heads, _ = _log(root, 40, rotate_every=2)
    lines = (root / "heads.jsonl").read_bytes().splitlines(keepends=True)
    (root / "heads.jsonl").write_bytes(b"".join(lines[-3:]))  # first contact mid-log
    first = read_heads(root / "heads.jsonl")[0]
    assert len(chain_proof(log_lines(root / "log"), first.seq).certs) > 3 * 3
    state = _state(tmp_path / "w", heads[0].log, root / "keys" / "verify.pub")
    with _serving(state) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/heads"
        _publish(root, url, None)
        _publish(root, url, b"not-the-token-0123456789")
        assert state.latest == {}
        publisher = _publish(root, url, TOKEN)
        assert publisher.delivered
    held = state.latest[heads[0].log]
    assert (held.seq, held.hash) == (heads[-1].seq, heads[-1].hash)
