"""bide's I/O shell: everything with a side effect lives here (the model is in ``replay``).

Modules, one job each (`accepting` is the accept loop the metrics listener and the API share):

* ``engine/`` is the middle: the log and its fold, the polls, the quotas, the one door for
  every request, the projections, the lifecycle (``daemon/ARCHITECTURE.md`` maps it);
  ``supervisor`` composes it with the local API; ``actions`` runs submit, fetch and cancel
  through narrow ``ActionPorts``; ``http`` turns one request into one recorded fact;
  ``spool`` is the file intake; ``snapshots`` the state snapshot; ``timers`` the timer heap
  and the GCRA quota; ``faults`` a test-only seam.
* ``config``, ``profile`` and ``inputs`` read and check what people write (config, provider
  profiles, command-line numbers); ``readers`` loads the log for the offline readers.
* ``metrics``, ``logfmt``, ``systemd`` and ``outbox`` are how the daemon speaks to operators.
* ``cli`` and ``commands/`` are the ``bide`` command, ``completion`` its shell completion
  (made from the parser); ``interpreter_access`` tells whether other users can run this
  Python; ``simulator/`` the scripted provider; ``demo`` runs every scenario end to end.

The local API is in ``daemon/api/`` (its guide: ``daemon/api/README.md``), the MCP server in
``daemon/mcp.py``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bide")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
