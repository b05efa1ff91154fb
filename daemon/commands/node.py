"""``bide node enroll``: enrol a node for forward-secure signing with the log in PostgreSQL.

The one step that needs the root private key (``signing.key``): run it where that key is (an
offline machine, say), then copy what it writes to the node. See ``eventlog.nodekeys``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from eventlog.keys import SIGNING_KEY, load_signer
from eventlog.nodekeys import NODE_DIR, enroll

_EPILOG = f"""\
examples:
  bide node enroll --name db-node-2 --keys-dir /root/bide-keys --out ./db-node-2
  # then, on db-node-2 (its [postgres] node = "db-node-2", state in /var/lib/bide):
  install -d -m 700 -o bide /var/lib/bide/{NODE_DIR}
  install -m 600 -o bide ./db-node-2/* /var/lib/bide/{NODE_DIR}/
  bide run --check    # names the node and its enrolment

The private key written (node-key-00000001.key) is the node's first key: the daemon evolves it
and destroys each key after one use, so delete the copy in --out once it is on the node.
"""


def add_parser(sub: Any) -> None:
    node = sub.add_parser(
        "node",
        help="enrol a node (forward-secure signing with the log in PostgreSQL)",
        description="Nodes sharing a log in PostgreSQL each sign with a key chain of their own, "
        "certified once from the root key.",
        epilog="example:\n  bide node enroll --name db-node-2 --keys-dir /root/bide-keys "
        "--out ./db-node-2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub2 = node.add_subparsers(dest="node_command", metavar="SUBCOMMAND", required=True)
    p = sub2.add_parser(
        "enroll",
        help="make a node's first key and its certificate, signed by the root key",
        description="Make node NAME's first node key and a certificate over (the node's name, "
        "the key's public half, not-before) signed by the root key (signing.key), valid for "
        "any log of this root: every shard, and logs made later. Writes the certificate "
        "(node.cert) and the private key (node-key-00000001.key, 0600) into --out, for the "
        "operator to copy into the node's <state_dir>/node/. The node then signs each takeover "
        "with its current key, evolving and destroying its keys itself; `bide verify` follows "
        "the chain with verify.pub alone. Refuses to overwrite; never prints a private key.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--name",
        required=True,
        metavar="NODE",
        help="the node's name: its [postgres] node (or host name), 1-64 of A-Z a-z 0-9 . _ -",
    )
    p.add_argument(
        "--keys-dir",
        required=True,
        metavar="DIR",
        help=f"the directory holding the root {SIGNING_KEY}",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where to write the node's files (created 0700; default ./node-NAME)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_enroll)


def run_enroll(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(f"node-{args.name}")
    root = load_signer(Path(args.keys_dir))
    cert, key = enroll(root, args.name, out)
    if args.json:
        print(
            json.dumps(
                {
                    "node": args.name,
                    "certificate": str(cert),
                    "private_key": str(key),
                    "root_fingerprint": root.fingerprint,
                }
            )
        )
        return 0
    print(f"enrolled node {args.name} (root {root.fingerprint[:16]}...)")
    print(f"wrote {cert}")
    print(f"wrote {key} (0600: the node's first private key)")
    print(
        f"copy both into the node's <state_dir>/{NODE_DIR}/ (mode 0700, owned by the daemon's "
        f"user), then delete {key} here"
    )
    return 0
