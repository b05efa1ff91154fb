"""Sealed blobs (eventlog.sealed): they open only with the key they were sealed with, for the
domain and the binding they were sealed for, and unaltered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eventlog import keys
from eventlog.errors import DecryptError
from eventlog.sealed import open_blob, seal_blob

DOMAIN = b"bide.test.v1\n"


def test_a_blob_opens_only_as_it_was_sealed(tmp_path: Path) -> None:
    keys.generate(tmp_path / "k1")
    keys.generate(tmp_path / "k2")
    ring, other = keys.load_keyring(tmp_path / "k1"), keys.load_keyring(tmp_path / "k2")
    blob = seal_blob(ring, DOMAIN, b"schema\n3\nrid-1", b"the body")
    assert b"the body" not in blob
    assert open_blob(ring, DOMAIN, b"schema\n3\nrid-1", blob, where="t") == b"the body"
    assert seal_blob(ring, DOMAIN, b"schema\n3\nrid-1", b"the body") != blob  # a fresh nonce
    refused: dict[str, Callable[[], bytes]] = {
        "another binding": lambda: open_blob(ring, DOMAIN, b"schema\n4\nrid-1", blob, where="t"),
        "another domain": lambda: open_blob(ring, b"x\n", b"schema\n3\nrid-1", blob, where="t"),
        "another key": lambda: open_blob(other, DOMAIN, b"schema\n3\nrid-1", blob, where="t"),
        "a flipped byte": lambda: open_blob(
            ring, DOMAIN, b"schema\n3\nrid-1", blob[:-1] + bytes([blob[-1] ^ 1]), where="t"
        ),
        "no header": lambda: open_blob(ring, DOMAIN, b"", b"garbage", where="t"),
        "a bad header": lambda: open_blob(ring, DOMAIN, b"", b"{]\nxx", where="t"),
    }
    for why, attempt in refused.items():
        with pytest.raises(DecryptError) as err:
            attempt()
        assert str(err.value).startswith("t:"), why
