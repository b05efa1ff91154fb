"""The daemon's local API: HTTP/1.1 + JSON over a Unix socket (the agent developer's guide is
``daemon/api/README.md``).

* ``schema`` defines every request and answer; ``openapi`` the document built from them;
* ``peer`` says who is connected (SO_PEERCRED); the roles their groups give them are the
  engine's rules (``daemon.engine.intake.Authority``);
* ``server`` is the bounded HTTP/1.1 loop (h11); ``listener`` the socket (systemd's or ours);
* ``service`` the endpoints, answered from the engine's memory, written through its intake;
* ``client`` what the CLI (and ``bide mcp``) use to call it.
"""
