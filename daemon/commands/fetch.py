"""``bide fetch``: download a succeeded operation's result, recorded, to a file."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import msgspec

from daemon.api.client import CALL_TIMEOUT
from daemon.commands.apicall import ApiCallError, ApiClient, connect
from daemon.commands.watch import EXIT_QUEUED, wait_receipt
from daemon.config import add_config_flag, load_config
from daemon.errors import UsageError
from daemon.inputs import seconds_arg
from daemon.spool import FetchFile, Spool, new_request_id
from eventlog.lock import writer_alive

EPILOG = """\
examples:
  bide fetch nightly --to /srv/exports/nightly.csv
  bide fetch nightly --result result_url --to out.bin --json

Only an operation that succeeded with a validated result reference can be fetched (S1, S14).
Only the operation's own registrant (or an operator) may fetch it; each user is limited to
[fetch] per_principal_per_minute. The daemon records the intent (and who asked), downloads
under the profile's size cap and timeout, and records the size and SHA-256; this command then
receives the bytes over the daemon's API (or, with the API off, copies them from its results
directory) and writes PATH atomically with mode 0600 after checking the SHA-256. A failed or
partial download leaves no file at PATH.
exit status: 0 written; 1 refused or failed (prints why); 2 usage; 75 daemon not running.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "fetch",
        help="download a succeeded operation's result to a file",
        description="Fetch the result of a succeeded operation through the "
        "daemon, as its own recorded action, and write it to PATH.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("operation", metavar="OP")
    p.add_argument("--to", required=True, metavar="PATH", help="where to write the result")
    p.add_argument("--result", help="which result field, when there are several URLs")
    p.add_argument("--wait-seconds", type=seconds_arg(0, 86400, allow_zero=True), default=600.0)
    p.add_argument("--json", action="store_true")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    target = Path(args.to)
    if not target.parent.is_dir():
        raise UsageError(f"--to {target}: directory {target.parent} does not exist")
    client = connect(cfg)
    if client is not None:
        with client:
            return _through_api(client, args, target)
    if writer_alive(cfg.log_dir) is False:
        print("the daemon is not running; fetch needs it (it holds the credentials)")
        return EXIT_QUEUED
    rid = new_request_id()
    spool = Spool(cfg.spool_dir)
    data = FetchFile(1, rid, "fetch", args.operation, args.result)
    spool.request(spool.incoming, rid, msgspec.json.encode(data))
    receipt = anyio.run(wait_receipt, spool, rid, args.wait_seconds)
    if receipt is None:
        print(f"no answer from the daemon within {args.wait_seconds:g}s")
        return EXIT_QUEUED
    if receipt.status != "fetched" or receipt.stored_as is None or receipt.sha256 is None:
        print(f"fetch {receipt.status}: {receipt.reason}")
        return 1
    source = cfg.state_dir / "results" / receipt.stored_as
    size = _copy_verified(source, target, receipt.sha256)
    out = {
        "operation_id": args.operation,
        "action_id": receipt.action_id,
        "path": str(target),
        "size": size,
        "sha256": receipt.sha256,
    }
    print(
        json.dumps(out) if args.json else f"wrote {target} ({size} bytes, sha256 {receipt.sha256})"
    )
    return 0


def _through_api(client: ApiClient, args: argparse.Namespace, target: Path) -> int:
    """Ask the daemon over its API, wait for the download, then stream the bytes from it
    (the caller needs no access to the daemon's results directory)."""
    op_id = args.operation
    give_up = time.monotonic() + args.wait_seconds
    try:
        answer = client.call(
            "POST",
            f"/v1/operations/{quote(op_id, safe='')}/fetch",
            body={"result": args.result},
            params={"wait": _wait(give_up)},
            timeout=_wait_s(give_up) + CALL_TIMEOUT,
        )
        while not answer["done"] and time.monotonic() < give_up:
            answer = client.call(
                "GET",
                f"/v1/fetches/{quote(answer['action_id'], safe='')}",
                params={"wait": _wait(give_up)},
                timeout=_wait_s(give_up) + CALL_TIMEOUT,
            )
        if not answer["done"]:
            print(
                f"the fetch {answer['action_id']} was not done within "
                f"{args.wait_seconds:g}s; run the same command again later"
            )
            return EXIT_QUEUED
        if answer["status"] != "fetched":
            print(f"fetch {answer['status']}: {answer.get('reason')}: {answer.get('detail')}")
            return 1
        sha256 = str(answer["sha256"])
        size = _write_verified(
            target,
            sha256,
            f"the daemon ({client.socket_path})",
            lambda write: client.download(str(answer["content_path"]), write, timeout=600.0),
        )
    except ApiCallError as exc:
        print(f"fetch refused: {exc.detail}")
        return 1
    out = {
        "operation_id": op_id,
        "action_id": answer["action_id"],
        "path": str(target),
        "size": size,
        "sha256": sha256,
    }
    print(json.dumps(out) if args.json else f"wrote {target} ({size} bytes, sha256 {sha256})")
    return 0


def _wait_s(give_up: float) -> float:
    return max(0.0, min(55.0, give_up - time.monotonic()))


def _wait(give_up: float) -> str:
    return f"{_wait_s(give_up):.3f}s"


def _copy_verified(source: Path, target: Path, sha256: str) -> int:
    """Copy the daemon's stored result (the spool's way) to ``target``, verified."""

    def read(write: Callable[[bytes], None]) -> None:
        with source.open("rb") as src:
            while chunk := src.read(1 << 20):
                write(chunk)

    return _write_verified(target, sha256, str(source), read)


def _write_verified(
    target: Path, sha256: str, source: str, produce: Callable[[Callable[[bytes], None]], object]
) -> int:
    """Write what ``produce`` gives to a temporary file beside ``target`` (0600), check the
    hash, fsync, rename: a partial or altered result never lands at ``target``."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    digest = hashlib.sha256()
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)

    def write(chunk: bytes) -> None:
        nonlocal size
        digest.update(chunk)
        size += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]

    try:
        produce(write)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot copy the result from {source}: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise UsageError(
            f"the result from {source} does not match the recorded SHA-256; "
            f"nothing was written to {target}"
        )
    os.rename(tmp, target)
    dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return size
