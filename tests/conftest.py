"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pgsupport import schema_dsn


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A real PostgreSQL schema of this test's own (see :mod:`tests.pgsupport`)."""
    yield from schema_dsn()
