"""Cost per checkpoint of forward-secure key evolution, and of a witness round trip.

Each checkpoint here is one durable write (its own fdatasync), so the baseline is a format-2
checkpoint (one key, no evolution) written the same way in the same run. Measured:

    single_key     format 2: sign, write, fdatasync
    epoch          format 3 within an epoch: the same, signed by the epoch key
    rotating       format 3 with a new epoch at *every* checkpoint (the worst case): also
                   generate a key pair, write it (fsync + directory fsync), and destroy the
                   old one (overwrite, fsync, unlink, directory fsync)
    witness        one head POSTed to `bide witness serve` on 127.0.0.1 (its state file
                   append + fsync, the countersignature), with the checkpoint record that
                   links it to the previous head

Reported as milliseconds per checkpoint and as ratios to single_key. The default epoch is an
hour and checkpoints come every 1000 records or 60 s, so the rotating figure is paid about
once an hour, not per checkpoint.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from pathlib import Path

import anyio
import httpx
import msgspec

from eventlog import keys
from eventlog.epochs import EpochPolicy, EpochSigning
from eventlog.heads import HeadStore, read_heads
from eventlog.writer import LogWriter


async def _checkpoints(
    log_dir: Path, key_dir: Path, mode: str, n: int, heads: HeadStore | None = None
) -> float:
    signer: keys.Signer | EpochSigning = keys.load_signer(key_dir)
    if mode != "single_key":
        policy = EpochPolicy(every_checkpoints=1 if mode == "rotating" else 0, every_seconds=0)
        signer = EpochSigning(
            keys.load_verify_key(key_dir / "verify.pub"),
            log_dir.parent / "epochs",
            policy=policy,
            root=keys.load_signer(key_dir),
        )
    async with LogWriter(
        log_dir, keys.load_keyring(key_dir), signer, heads=heads, checkpoint_interval=3600
    ) as w:
        await w.append(b"x" * 256)
        started = time.perf_counter()
        for _ in range(n):
            await w.checkpoint()
        return (time.perf_counter() - started) / n


def checkpoint_cost(work: Path, mode: str, n: int) -> float:
    root = Path(tempfile.mkdtemp(prefix=f"cp-{mode}-", dir=work))
    keys.generate(root / "keys")
    return anyio.run(_checkpoints, root / "log", root / "keys", mode, n)


def witness_round_trip(work: Path, n: int) -> float:
    """Seconds per head POSTed to a witness on 127.0.0.1 (heads of a real log), each checked
    from the log's verify.pub through its epoch key, by an authenticated publisher."""
    from daemon.witness.service import (
        Trusted,
        WitnessState,
        load_or_create_key,
        make_server,
    )
    from eventlog.headchain import Proof, genesis_line

    root = Path(tempfile.mkdtemp(prefix="witness-", dir=work))
    keys.generate(root / "keys")
    store = HeadStore(root / "heads.jsonl")
    anyio.run(_checkpoints, root / "log", root / "keys", "epoch", n, store)
    heads = read_heads(root / "heads.jsonl")
    token = "bench-token-0123456789abcdef"
    trust = {
        heads[0].log: Trusted(
            keys.load_verify_key(root / "keys" / "verify.pub").raw,
            hashlib.sha256(token.encode()).digest(),
        )
    }
    state = WitnessState(root / "witness.jsonl", load_or_create_key(root / "witness.key"), trust)
    server = make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/heads"
    proof = Proof(genesis_line(root / "log") or "")
    try:
        with httpx.Client(headers={"authorization": f"Bearer {token}"}) as client:
            started = time.perf_counter()
            for i in range(len(heads)):
                chain = heads[max(i - 1, 0) : i + 1]
                body: dict[str, object] = {"heads": chain}
                if i == 0:
                    body["proof"] = proof
                r = client.post(url, content=msgspec.json.encode(body))
                assert r.status_code == 200, r.text
            return (time.perf_counter() - started) / len(heads)
    finally:
        server.shutdown()
        server.server_close()


def run(work: Path, n: int = 200) -> dict[str, float]:
    single = checkpoint_cost(work, "single_key", n)
    epoch = checkpoint_cost(work, "epoch", n)
    rotating = checkpoint_cost(work, "rotating", n)
    witness = witness_round_trip(work, n)
    return {
        "checkpoints": n,
        "single_key_ms": single * 1e3,
        "epoch_ms": epoch * 1e3,
        "rotating_ms": rotating * 1e3,
        "witness_ms": witness * 1e3,
        "epoch_vs_single_key": epoch / single,
        "rotating_vs_single_key": rotating / single,
        "witness_vs_single_key": witness / single,
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        for k, v in run(Path(d)).items():
            print(f"{k:24} {v:10.3f}")
