"""``bide simulate``: serve a simulator script on loopback until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio

from daemon.errors import UsageError
from daemon.inputs import count_arg
from daemon.simulator import FORMAT_HELP, Script, Simulator, is_loopback, load_script

DESCRIPTION = """\
Serve scripted jobs over HTTP/1.1, as a misbehaving provider would, for tests and for
trying out a provider profile. Prints `listening on http://HOST:PORT` on its first line of
stdout, then one line per job, and runs until SIGINT or SIGTERM (exit 0). Every request is
logged (headers with credentials redacted); --request-log also appends each one as a JSON
line. Admin endpoints: POST /_sim/jobs adds a job, GET /_sim/requests returns the log.

Exit status: 0 stopped by a signal; 2 a bad script, token file or address.

The script format
=================

"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="serve scripted provider jobs on 127.0.0.1 (the built-in simulator)",
        description=DESCRIPTION + FORMAT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--script", required=True, type=Path, metavar="FILE", help="TOML script")
    p.add_argument(
        "--host",
        default=None,
        help="address to bind (default 127.0.0.1; anything but loopback only when given here)",
    )
    p.add_argument(
        "--port", type=count_arg(0, 65535), default=0, help="port (default 0: a free one)"
    )
    p.add_argument(
        "--request-log",
        type=Path,
        metavar="FILE",
        help="append every request, secrets redacted, as a JSON line to FILE",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="require `Authorization: Bearer <token>` with the token read from FILE",
    )
    p.set_defaults(func=run)


def _read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"{path}: cannot read the token file: {reason}") from None
    if not token or any(c.isspace() for c in token) or not token.isascii():
        raise UsageError(f"{path}: the token file must hold one ASCII token on one line")
    return token


def run(args: argparse.Namespace) -> int:
    script = load_script(args.script)
    token = _read_token(args.token_file) if args.token_file is not None else None
    host: str = args.host if args.host is not None else "127.0.0.1"
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: pick a port from 0 to 65535")
    if args.request_log is not None and not args.request_log.parent.is_dir():
        raise UsageError(f"{args.request_log}: its directory does not exist; create it first")
    if args.host is not None and not is_loopback(host):
        print(f"bide simulate: serving on {host}, not loopback, as asked", file=sys.stderr)
    simulator = Simulator(
        script,
        host=host,
        port=args.port,
        token=token,
        request_log=args.request_log,
        allow_remote=args.host is not None,
    )
    try:
        anyio.run(_serve, simulator, script)
    except (OSError, BaseExceptionGroup) as exc:
        cause = _os_error(exc)
        if cause is None:
            raise
        raise UsageError(
            f"cannot listen on {host} port {args.port} or open the request log: "
            f"{cause.strerror or cause}; pick another --host/--port"
        ) from None
    return 0


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failure to start, if that is all it is (task groups wrap it)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


async def _serve(simulator: Simulator, script: Script) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            await tg.start(simulator.serve)
            base = simulator.base_url
            lines = [f"listening on {base}"]
            lines += [
                f"job {job_id}: GET {base}/jobs/{quote(job_id, safe='')}" for job_id in script.jobs
            ]
            lines += [
                f'scenario {name}: POST {base}/jobs {{"scenario": "{name}"}}'
                for name in script.scenarios
            ]
            print("\n".join(lines), flush=True)
            async for _ in signals:
                break
            tg.cancel_scope.cancel()
