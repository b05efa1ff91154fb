"""bide's storage: an append-only, encrypted, hash-chained, signed and sealed log of opaque
records, verifiable offline with the public key alone. It knows nothing about polling.

``writer`` is the recipe layer (it alone picks nonces, key ids, associated data, checkpoints
and seals); ``envelope``, ``seal`` and ``mac`` are the low-level framing and cryptography;
``verify`` and ``reader`` read a log; ``keys``, ``lock``, ``position``, ``segments``,
``snapshot`` and ``fsync`` do one job each.

The auditor's guide, with the threat model: ``eventlog/AUDIT.md``.
"""
