"""``bide mcp``: serve bide's calls as MCP tools over stdio, as the calling user."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from daemon.config import add_config_flag, load_config

INSTALL_HINT = "pip install 'bide[mcp]'"

EPILOG = """\
example: an MCP client (an agent's harness) starts it as the agent's own user with:

  {"mcpServers": {"bide": {"command": "bide", "args": ["mcp"],
                           "env": {"BIDE_CONFIG": "/etc/bide/bide.toml"}}}}

It talks to the running daemon through its local API socket only: no key, no credential,
no file of the daemon's. Tools: watch_job, submit_job, get_operation, list_my_operations,
wait_for_operation (at most 60 s a call), operation_story, my_escalations; resource
bide://operations/{id}/story. No tool answers an escalation: a person does, with bide decide.
exit status: 0 the client closed the session; 2 the MCP SDK is not installed (install it
with: pip install 'bide[mcp]'), or usage error
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve bide as MCP tools over stdio (for an agent)",
        description="Serve bide's local API as MCP tools over stdio, running as "
        "the agent's own user.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    try:
        from daemon.mcp import serve
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("mcp", "mcp_types", "pydantic"):
            raise  # not a missing extra: a real error, shown as one
        print(
            f"bide mcp: the MCP SDK is not installed; install it with: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    anyio.run(serve, cfg.socket_path, cfg.api.daemon_user)
    return 0
