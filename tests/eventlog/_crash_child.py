"""Child process of the crash suite: append concurrently, print each acknowledged append.

Usage: python _crash_child.py LOGDIR KEYSDIR TASKS TAG

Prints ``ready`` once the log is open, then for every append that returned
``SEQ:HASH:PAYLOAD`` (flushed at once), until it is killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from eventlog.keys import load_keyring, load_signer
from eventlog.writer import LogWriter


async def main(log_dir: Path, keys_dir: Path, tasks: int, tag: str) -> None:
    out = sys.stdout
    async with LogWriter(
        log_dir,
        load_keyring(keys_dir),
        load_signer(keys_dir),
        segment_bytes=4096,
        checkpoint_every=8,
        checkpoint_interval=0.02,
    ) as log:
        out.write("ready\n")
        out.flush()

        async def appender(task: int) -> None:
            i = 0
            while True:
                if i % 5 == 4:  # now and then a batch of three
                    payloads = [f"{tag}:{task}:{i + k}".encode() for k in range(3)]
                    done = await log.append_many(payloads)
                    i += 3
                else:
                    payloads = [f"{tag}:{task}:{i}".encode()]
                    done = [await log.append(payloads[0])]
                    i += 1
                out.write(
                    "".join(
                        f"{a.seq}:{a.hash}:{p.decode()}\n"
                        for a, p in zip(done, payloads, strict=True)
                    )
                )
                out.flush()

        async with anyio.create_task_group() as tg:
            for task in range(tasks):
                tg.start_soon(appender, task)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
