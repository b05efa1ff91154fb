"""``bide witness``: a small service that keeps the latest signed head of each log."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from daemon.errors import UsageError
from daemon.inputs import count_arg
from daemon.witness.service import (
    Limits,
    Trusted,
    TrustError,
    WitnessState,
    held_heads,
    ingest,
    load_or_create_key,
    load_trust,
    make_server,
    public_key_text,
    write_token,
)
from eventlog.headchain import Proof
from eventlog.heads import read_heads

EPILOG = """\
Run it on another host, under another user, than the daemon: it is what makes a rollback or
a fork of the daemon's log visible to `bide verify --witness`, even to someone who has root
on the daemon's host.

  serve    HTTP(S) on --listen: POST /v1/heads (the daemon's [witness] urls; needs the log's
           token), GET /v1/heads and GET /v1/heads/<log id> (public: what `bide verify
           --witness URL` and `bide run` read)
  ingest   read a heads file (the daemon's [witness] file target, e.g. on a shared mount)
  show     print the heads held
  token    write a new publisher token (0600) to --out

Trust (--trust-dir DIR): one subdirectory per log id that may publish here, holding
  DIR/<log id>/verify.pub   the log's root public key (from `bide keygen`)
  DIR/<log id>/token        the secret its daemon sends (0600; `bide witness token --out`),
                            the same file the daemon's [witness] token_file names
A head is accepted only from a publisher with that log's token, and only when its checkpoint
verifies from that verify.pub through the log's certified epoch keys (the daemon sends the
genesis record and the key certificates on first contact), and when the checkpoint records
sent with it link back to the head held. Anything else is refused and changes nothing.
Accepted heads are countersigned with --key (created 0600 on first use; its public half is
written to <key>.pub and printed at start: pin it in the daemon's [witness] witness_keys and
in `bide verify --witness-key`) and appended, fsynced, to --state before the answer.

exit status: 0 ok; 1 ingest refused a head (printed); 2 usage or I/O error

examples:
  bide witness token --out /etc/bide-witness/trust/<log id>/token
  bide witness serve --listen 0.0.0.0:8443 --state /var/lib/bide-witness/heads.jsonl \\
      --key /var/lib/bide-witness/witness.key --trust-dir /etc/bide-witness/trust \\
      --tls-cert cert.pem --tls-key key.pem
  bide verify /var/lib/bide/log --verify-key verify.pub --witness https://witness:8443 \\
      --witness-key "$(cat witness.key.pub)"
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "witness",
        help="keep the latest signed head of each log; refuse forks (run off the host)",
        description="A witness for bide logs: remembers the latest signed checkpoint head of "
        "each trusted log, refuses a head its keys did not sign or that does not extend the "
        "one held, countersigns what it accepts.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=("serve", "ingest", "show", "token"))
    p.add_argument("--state", metavar="FILE", help="the witness's state file (created)")
    p.add_argument("--key", metavar="FILE", help="the witness's signing key (created 0600)")
    p.add_argument(
        "--trust-dir",
        metavar="DIR",
        help="serve, ingest: DIR/<log id>/{verify.pub,token} per log allowed",
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="serve: where to listen")
    p.add_argument("--tls-cert", metavar="PEM", help="serve: HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="serve: and this private key")
    p.add_argument(
        "--max-connections",
        type=count_arg(1, 10_000),
        default=64,
        metavar="N",
        help="serve: connections at once (default 64; more are closed at once)",
    )
    p.add_argument(
        "--max-per-client",
        type=count_arg(1, 10_000),
        default=8,
        metavar="N",
        help="serve: connections at once from one client address (default 8)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="serve: per socket operation, TLS handshake included (default 5)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=20.0,
        metavar="PER_SECOND",
        help="serve: requests a second per client address (default 20; then 429)",
    )
    p.add_argument(
        "--burst",
        type=count_arg(1, 100_000),
        default=40,
        metavar="N",
        help="serve: requests at once per client address (default 40)",
    )
    p.add_argument("--heads", metavar="FILE", help="ingest: the heads file to read")
    p.add_argument(
        "--genesis",
        metavar="FILE",
        help="ingest: a file holding the log's genesis record (its first line), "
        "for a log this witness holds no key state of yet",
    )
    p.add_argument("--out", metavar="FILE", help="token: where to write it (0600, new)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _trust(args: argparse.Namespace) -> dict[str, Trusted]:
    if not args.trust_dir:
        raise UsageError(
            "--trust-dir DIR is required: DIR/<log id>/verify.pub and "
            "DIR/<log id>/token for every log allowed to publish here"
        )
    try:
        return load_trust(Path(args.trust_dir))
    except TrustError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.action == "token":
        if not args.out:
            raise UsageError("token needs --out FILE")
        try:
            write_token(Path(args.out))
        except FileExistsError:
            raise UsageError(f"{args.out} exists; a token is never overwritten") from None
        print(f"wrote a new token to {args.out} (0600)")
        return 0
    if not args.state:
        raise UsageError("--state FILE is required")
    state_path = Path(args.state)
    if args.action == "show":
        heads = {h.log: h for h in held_heads(state_path)}
        if args.json:
            print(json.dumps([msgspec.to_builtins(h) for h in heads.values()]))
        for h in heads.values() if not args.json else ():
            print(f"{h.log} {h.seq}:{h.hash} epoch={h.epoch}")
        return 0
    if not args.key:
        raise UsageError("--key FILE is required (the witness's own key; created if missing)")
    trust = _trust(args)
    state = WitnessState(state_path, load_or_create_key(Path(args.key)), trust)
    if args.action == "ingest":
        if not args.heads:
            raise UsageError("ingest needs --heads FILE")
        offered = read_heads(Path(args.heads))
        proof = None
        if args.genesis:
            genesis = Path(args.genesis).read_text().split("\n", 1)[0]
            proof = Proof(genesis)  # the file's heads, from the first on, carry the rest
        refused = 0
        for log, verdict in ingest(state, offered, proof):
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
    if not 0 < args.timeout <= 300 or not args.rate > 0:
        raise UsageError("--timeout must be in (0, 300] and --rate above 0")
    limits = Limits(args.max_connections, args.max_per_client, args.timeout, args.rate, args.burst)
    server = make_server(state, host, int(port), tls=tls, limits=limits)
    # SIGTERM asks the serving loop to stop, from a thread of its own (shutdown waits for
    # the loop, which runs in this one): no exception lands in the middle of accepting.
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: threading.Thread(target=server.shutdown, daemon=True).start(),
    )
    bound_host, bound_port = server.server_address[:2]
    print(
        json.dumps(
            {
                "listening": f"{bound_host!s}:{bound_port}",
                "witness": state.fingerprint,
                "witness_key": public_key_text(state.key),
                "logs": len(state.trust),
                "held": len(state.latest),
            }
        ),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("stopped", file=sys.stderr)
    return 0
