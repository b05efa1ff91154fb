"""``bide fetch``: download a succeeded operation's result, recorded, to a file."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import anyio
import msgspec

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
The daemon records the intent, downloads under the profile's size cap and timeout, and records
the size and SHA-256; this command then writes PATH atomically with mode 0600 after checking
the SHA-256. A failed or partial download leaves no file at PATH.
exit status: 0 written; 1 refused or failed (prints why); 2 usage; 75 daemon not running.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fetch", help="download a succeeded operation's result to a file",
                       description="Fetch the result of a succeeded operation through the "
                       "daemon, as its own recorded action, and write it to PATH.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    out = {"operation_id": args.operation, "action_id": receipt.action_id, "path": str(target),
           "size": size, "sha256": receipt.sha256}
    print(json.dumps(out) if args.json else f"wrote {target} ({size} bytes, sha256 "
                                            f"{receipt.sha256})")
    return 0


def _copy_verified(source: Path, target: Path, sha256: str) -> int:
    """Copy to a temporary file beside ``target`` (0600), check the hash, fsync, rename."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    digest = hashlib.sha256()
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with source.open("rb") as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot copy the result from {source}: {exc.strerror}") from None
    os.close(fd)
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"the stored result {source} does not match the recorded SHA-256; "
                         f"nothing was written to {target}")
    os.rename(tmp, target)
    dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return size
