"""``bide witness``: a small service that keeps the latest signed head of each log."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec

from daemon.errors import UsageError
from daemon.witness.service import WitnessState, ingest, load_or_create_key, make_server
from eventlog.heads import read_heads

EPILOG = """\
Run it on another host, under another user, than the daemon: it is what makes a rollback or
a fork of the daemon's log visible to `bide verify --witness`, even to someone who has root
on the daemon's host.

  serve    HTTP(S) on --listen: POST /v1/heads (the daemon's [witness] urls), GET /v1/heads
           and GET /v1/heads/<log id> (what `bide verify --witness URL` reads)
  ingest   read a heads file (the daemon's [witness] file target, e.g. on a shared mount)
  show     print the heads held

A head is accepted when the checkpoint records sent with it link back to the head held for
its log (no key is needed to check that); the first head of a log is taken as it comes, so
start the witness before the daemon. Accepted heads are countersigned with --key (created
0600 on first use) and appended, fsynced, to --state before the answer: an acknowledged
head survives SIGKILL.

exit status: 0 ok; 1 ingest refused a head (printed); 2 usage or I/O error

examples:
  bide witness serve --listen 0.0.0.0:8443 --state /var/lib/bide-witness/heads.jsonl \\
      --key /var/lib/bide-witness/witness.key --tls-cert cert.pem --tls-key key.pem
  bide witness ingest --heads /mnt/audit/bide-heads.jsonl --state heads.jsonl --key w.key
  bide verify /var/lib/bide/log --verify-key verify.pub --witness https://witness:8443
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "witness",
        help="keep the latest signed head of each log; refuse forks (run off the host)",
        description="A witness for bide logs: remembers the latest signed checkpoint head of "
        "each log, refuses a head that does not extend it, countersigns what it accepts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("serve", "ingest", "show"))
    p.add_argument("--state", metavar="FILE", required=True,
                   help="the witness's append-only state file (created)")
    p.add_argument("--key", metavar="FILE", help="the witness's signing key (created 0600)")
    p.add_argument("--listen", metavar="HOST:PORT", help="serve: where to listen")
    p.add_argument("--tls-cert", metavar="PEM", help="serve: HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="serve: and this private key")
    p.add_argument("--heads", metavar="FILE", help="ingest: the heads file to read")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    state_path = Path(args.state)
    if args.action == "show":
        heads = {h.log: h for h in read_heads(state_path)}
        if args.json:
            print(json.dumps([msgspec.to_builtins(h) for h in heads.values()]))
        for h in heads.values() if not args.json else ():
            print(f"{h.log} {h.seq}:{h.hash} epoch={h.epoch}")
        return 0
    if not args.key:
        raise UsageError("--key FILE is required (the witness's own key; created if missing)")
    state = WitnessState(state_path, load_or_create_key(Path(args.key)))
    if args.action == "ingest":
        if not args.heads:
            raise UsageError("ingest needs --heads FILE")
        refused = 0
        for log, verdict in ingest(state, read_heads(Path(args.heads))):
            refused += verdict.status != "accepted"
            if args.json:
                print(json.dumps({"log": log, **msgspec.to_builtins(verdict)}))
            elif verdict.status == "accepted" and verdict.head is not None:
                print(f"{log}: holds {verdict.head.seq}:{verdict.head.hash}")
            else:
                print(f"{log}: REFUSED: {verdict.reason}")
        return 1 if refused else 0
    if not args.listen or ":" not in args.listen:
        raise UsageError("serve needs --listen HOST:PORT")
    host, _, port = args.listen.rpartition(":")
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise UsageError("HTTPS needs both --tls-cert and --tls-key")
        tls = (Path(args.tls_cert), Path(args.tls_key))
    server = make_server(state, host, int(port), tls=tls)
    signal.signal(signal.SIGTERM, _interrupt)  # serve_forever runs in this thread
    bound_host, bound_port = server.server_address[:2]
    print(json.dumps({"listening": f"{bound_host!s}:{bound_port}", "witness": state.fingerprint,
                      "logs": len(state.latest)}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("stopped", file=sys.stderr)
    return 0
