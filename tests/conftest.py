"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import STORES
from tests.pgsupport import schema_dsn


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A real PostgreSQL schema of this test's own (see :mod:`tests.pgsupport`)."""
    yield from schema_dsn()


@pytest.fixture(scope="module", params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    """Where the daemon's log is, for suites that run against both stores: pass it to
    ``workspace(..., store=store)``. Module-scoped so a module's shared run is made once per
    store; without a PostgreSQL server the ``postgres`` variants skip (fail under
    ``BIDE_REQUIRE_POSTGRES=1``)."""
    return str(request.param)
