"""``bide keygen DIR``: create the data key, the signing key and the public verify key."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from eventlog import keys


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="create data.key, signing.key (0600) and verify.pub",
        description="Create a key set for one log: data.key (AEAD data key: reads and "
        "encrypts payloads) and signing.key (Ed25519: signs checkpoints, and keys the MAC that "
        "seals every write and the snapshot), both 0600 in a 0700 directory, and verify.pub, "
        "the public key auditors verify with. Existing keys are never overwritten.",
        epilog="examples:\n  bide keygen /etc/bide/keys\n"
        "  bide keygen --rotate /etc/bide/keys   # new data.key; the old one stays readable\n"
        "                                        # as data-<kid>.key until you delete it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", metavar="DIR", help="where to write the keys (created 0700)")
    p.add_argument(
        "--rotate",
        action="store_true",
        help="make a new active data key; keep the old one as data-<kid>.key",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = keys.generate(Path(args.directory), rotate=args.rotate)
    if args.json:
        print(
            json.dumps(
                {
                    "directory": str(result.directory),
                    "created": [str(p) for p in result.created],
                    "active_data_key_id": result.active_kid,
                    "signer_fingerprint": result.signer_fingerprint,
                }
            )
        )
        return 0
    for path in result.created:
        print(f"wrote {path}")
    print(f"active data key id: {result.active_kid}")
    print(f"signer fingerprint: {result.signer_fingerprint}")
    if not args.rotate:
        print("give verify.pub to auditors; back up data.key and signing.key somewhere safe")
    return 0
