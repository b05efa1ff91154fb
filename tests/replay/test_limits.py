"""S10: every operation ends, within bounds the profile sets (issue 20, finding 7). A
registration asking for a deadline or a budget past the profile's limits is refused, naming the
limit; one within them, or leaving them to the defaults, is registered; and the registrant is
the daemon's word, recorded on the operation."""

from __future__ import annotations

import math

import pytest

from replay import OperationRegistered, RegistrationRejected, register

from .helpers import T0, contract, registration

DAY = 86_400.0


@pytest.mark.parametrize(("changes", "says"), [
    pytest.param({"deadline_at": 1e300}, "limit_deadline_seconds", id="S10-deadline-1e300"),
    pytest.param({"deadline_at": T0 + 8 * DAY}, "limit_deadline_seconds", id="S10-8-days"),
    pytest.param({"business_deadline_at": T0 + 30 * DAY}, "business deadline",
                 id="S28-business-deadline-too"),
    pytest.param({"max_status_requests": 10_001}, "limit_status_requests", id="S10-requests"),
    pytest.param({"max_transport_failures": 1_001}, "limit_transport_failures",
                 id="S10-transport"),
    pytest.param({"max_rate_limited": 1_001}, "limit_rate_limited", id="S21-rate-limited"),
])
def test_s10_more_than_the_profile_allows_is_refused_naming_the_limit(
        changes: dict[str, object], says: str) -> None:
    [out] = register(registration(**changes), contract(), T0)
    assert isinstance(out, RegistrationRejected)
    assert out.reason == "over_limit"
    assert says in out.detail


def test_s10_within_the_limits_is_registered_with_the_registrant() -> None:
    [out] = register(registration(deadline_at=T0 + 7 * DAY, max_status_requests=10_000),
                     contract(), T0, registered_by="alice", registered_by_uid=1001)
    assert isinstance(out, OperationRegistered)
    assert (out.registered_by, out.registered_by_uid) == ("alice", 1001)
    assert math.isfinite(out.deadline_at)


def test_s10_a_profile_whose_defaults_exceed_its_limits_is_invalid() -> None:
    with pytest.raises(ValueError, match="default_deadline_seconds must not exceed"):
        contract(limit_deadline_seconds=60.0, default_deadline_seconds=3600.0)
