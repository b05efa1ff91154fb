"""Fixtures the fault tests share: raw loopback servers (see :mod:`tests.faults.rawserver`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.rawserver import RawServer


@pytest.fixture
def raw() -> Iterator[RawServer]:
    """The provider's origin, answering with the behaviour its path names."""
    server = RawServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def elsewhere() -> Iterator[RawServer]:
    """Another origin, which must never be called (let alone with the credential)."""
    server = RawServer()
    try:
        yield server
    finally:
        server.close()
