"""A scripted HTTP provider on loopback, for tests, the demo and people writing a profile.

Jobs follow scripts (:mod:`daemon.simulator.script`), the provider's logic is I/O-free
(:mod:`daemon.simulator.provider`), the server is anyio + h11
(:mod:`daemon.simulator.server`), and every request is logged with secrets redacted
(:mod:`daemon.simulator.requestlog`). ``bide simulate --script FILE`` serves a script file.
"""

from __future__ import annotations

from daemon.simulator.provider import Provider, Reply, Request, Stream
from daemon.simulator.requestlog import (
    REDACTED,
    RequestLog,
    RequestRecord,
    read_request_log,
    redact_headers,
    redact_target,
)
from daemon.simulator.script import (
    FORMAT_HELP,
    Job,
    NewJob,
    Script,
    ScriptError,
    ServerConfig,
    Step,
    load_script,
    parse_script,
    parse_steps,
    script_from_dict,
)
from daemon.simulator.server import (
    Limits,
    Simulator,
    SimulatorHandle,
    is_loopback,
    run_in_thread,
)

__all__ = [
    "FORMAT_HELP",
    "REDACTED",
    "Job",
    "Limits",
    "NewJob",
    "Provider",
    "Reply",
    "Request",
    "RequestLog",
    "RequestRecord",
    "Script",
    "ScriptError",
    "ServerConfig",
    "Simulator",
    "SimulatorHandle",
    "Step",
    "Stream",
    "is_loopback",
    "load_script",
    "parse_script",
    "parse_steps",
    "read_request_log",
    "redact_headers",
    "redact_target",
    "run_in_thread",
    "script_from_dict",
]
