"""The contract as data: constraints fail decoding; the digest is canonical."""

from __future__ import annotations

import msgspec
import pytest

from replay import Contract, contract_digest

from .helpers import contract


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"provider": ""}, id="empty-provider"),
        pytest.param({"provider": "a b"}, id="provider-space"),
        pytest.param({"state_pointer": "state"}, id="pointer-no-slash"),
        pytest.param({"state_pointer": "/a~2"}, id="pointer-bad-escape"),
        pytest.param({"states": {"pending": ["x"], "success": []}}, id="S3-no-success"),
        pytest.param({"states": {"pending": ["x"], "success": ["x"]}}, id="S3-overlap"),
        pytest.param({"backoff_base_seconds": 0}, id="S6-zero-base"),
        pytest.param({"backoff_base_seconds": -1}, id="S6-negative-base"),
        pytest.param({"backoff_cap_seconds": 1}, id="S6-cap-below-base"),
        pytest.param({"rate_limited_delay_seconds": 100}, id="S21-not-markedly-longer"),
        pytest.param({"default_max_status_requests": 0}, id="S10-zero-budget"),
        pytest.param({"default_max_transport_failures": 0}, id="S10-zero-transport"),
        pytest.param({"not_found_grace_seconds": -1}, id="S23-negative-grace"),
        pytest.param({"ok_statuses": [302]}, id="ok-status-not-2xx"),
        pytest.param({"results": [{"name": "u", "pointer": "/a", "kind": "magic"}]}, id="S14-kind"),
        pytest.param(
            {"results": [{"name": "u", "pointer": "/a"}, {"name": "u", "pointer": "/b"}]},
            id="S14-duplicate-names",
        ),
        pytest.param({"default_deadline_seconds": float("inf")}, id="S10-infinite-deadline"),
    ],
)
def test_invalid_contract_fails_decoding(changes: dict[str, object]) -> None:
    with pytest.raises(msgspec.ValidationError):
        contract(**changes)


def test_digest_is_canonical_and_sensitive() -> None:
    a = contract()
    b = msgspec.json.decode(msgspec.json.encode(a), type=Contract)
    assert contract_digest(a) == contract_digest(b)
    assert len(contract_digest(a)) == 64
    assert contract_digest(a) != contract_digest(contract(backoff_cap_seconds=60.0))
