"""bide's storage: an append-only, encrypted, hash-chained, signed and sealed log of opaque
records, verifiable offline with the public key alone. It knows nothing about polling.

Where the records live is one interface, ``logstore`` (records, fencing, snapshots, schema,
export, following), with two stores holding the same record bytes: ``filestore`` (segment
files, the default) and ``pgstore`` with ``pglink`` (PostgreSQL); ``store`` holds the line
type and the segment-layout helpers both use. ``tests/eventlog/test_store_contract.py`` is
the contract a further store must pass.

``writer`` is the recipe layer (it alone picks nonces, key ids, associated data, checkpoints
and seals); ``envelope``, ``seal`` and ``mac`` are the low-level framing and cryptography;
``verify`` and ``reader`` read a log; ``keys``, ``lock``, ``position``, ``segments``,
``snapshot`` and ``fsync`` do one job each.

The auditor's guide, with the threat model: ``eventlog/AUDIT.md``.
"""
