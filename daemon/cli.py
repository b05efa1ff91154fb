"""The ``bide`` command line.

Each subcommand lives in its own module under :mod:`daemon.commands` and exposes
``add_parser(subparsers)``, which registers the subcommand and sets ``func`` on its
namespace to a callable ``(argparse.Namespace) -> int`` returning the exit status.

Exit statuses shared by every command: 0 success, 1 the command ran and found a
problem (damage, mismatch, failure), 2 usage or I/O error (a missing file, a bad
flag). Commands document any other status in their own ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from daemon import __version__
from daemon.errors import DaemonError, UsageError
from daemon.logfmt import journal_prefix
from eventlog.errors import EventLogError

#: Subcommand modules, in the order ``bide --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "run",
    "submit",
    "watch",
    "wait",
    "status",
    "story",
    "escalations",
    "decide",
    "withdraw",
    "mcp",
    "fetch",
    "replay",
    "check-profile",
    "demo",
    "simulate",
    "keygen",
    "verify",
    "witness",
    "log",
    "node",
    "completion",
)

EXAMPLES = """\
examples:
  bide demo                      run every scenario against the built-in simulator
  bide keygen /etc/bide/keys     create data.key, signing.key (0600) and verify.pub
  bide verify /var/lib/bide/log --verify-key verify.pub
  bide completion bash > ~/.local/share/bash-completion/completions/bide
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (fast start-up:
    `bide verify` need not load httpx, the supervisor or the simulator)."""
    parser = argparse.ArgumentParser(
        prog="bide",
        description="Wait on external jobs under a contract: deadlines, budgets, "
        "backoff, and an encrypted, hash-chained audit log.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bide {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"daemon.commands.{name.replace('-', '_')}")
        module.add_parser(sub)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_in(given))
    args = parser.parse_args(given)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        try:
            status: int = args.func(args)
        except BaseExceptionGroup as group:  # the daemon's task groups wrap what they raise
            raise _alone(group) from None
    except UsageError as exc:
        print(f"{journal_prefix('error', sys.stderr)}bide {args.command}: {exc}", file=sys.stderr)
        return 2
    except (DaemonError, EventLogError) as exc:
        print(f"{journal_prefix('error', sys.stderr)}bide {args.command}: {exc}", file=sys.stderr)
        return getattr(exc, "exit_status", 2)
    except KeyboardInterrupt:
        return 130
    return status


def _alone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a group (of groups) holds, when it holds exactly one, so a refusal
    (a damaged or rolled-back log, a bad key) is one line naming the fix, not a traceback;
    the group itself otherwise."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner


if __name__ == "__main__":
    sys.exit(main())
