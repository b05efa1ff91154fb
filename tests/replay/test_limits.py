"""S10: every operation ends, within bounds the profile sets (issue 20, finding 7). A
registration asking for a deadline or a budget past the profile's limits is refused, naming the
limit; one within them, or leaving them to the defaults, is registered; and the registrant is
the daemon's word, recorded on the operation."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import OperationRegistered, RegistrationRejected, register

from .helpers import T0, contract, registration

DAY = 86_400.0


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        pytest.param({"deadline_at": 1e300}, "limit_deadline_seconds", id="S10-deadline-1e300"),
        pytest.param({"deadline_at": T0 + 8 * DAY}, "limit_deadline_seconds", id="S10-8-days"),
        pytest.param(
            {"business_deadline_at": T0 + 30 * DAY},
            "business deadline",
            id="S28-business-deadline-too",
        ),
        pytest.param({"max_status_requests": 10_001}, "limit_status_requests", id="S10-requests"),
        pytest.param(
            {"max_transport_failures": 1_001}, "limit_transport_failures", id="S10-transport"
        ),
        pytest.param({"max_rate_limited": 1_001}, "limit_rate_limited", id="S21-rate-limited"),
    ],
)
def test_s10_more_than_the_profile_allows_is_refused_naming_the_limit(
    changes: dict[str, object], says: str
) -> None:
    [out] = register(registration(**changes), contract(), T0)
    assert isinstance(out, RegistrationRejected)
    assert out.reason == "over_limit"
    assert says in out.detail


def test_s10_within_the_limits_is_registered_with_the_registrant() -> None:
    [out] = register(
        registration(deadline_at=T0 + 7 * DAY, max_status_requests=10_000),
        contract(),
        T0,
        registered_by="alice",
        registered_by_uid=1001,
    )
    assert isinstance(out, OperationRegistered)
    assert (out.registered_by, out.registered_by_uid) == ("alice", 1001)
    assert math.isfinite(out.deadline_at)


def test_s10_a_profile_whose_defaults_exceed_its_limits_is_invalid() -> None:
    with pytest.raises(ValueError, match="default_deadline_seconds must not exceed"):
        contract(limit_deadline_seconds=60.0, default_deadline_seconds=3600.0)


NUMBERS = st.one_of(
    st.none(),
    st.floats(),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, float("inf"), float("nan")]),
)


@settings(max_examples=300)
@given(
    deadline=NUMBERS,
    business=NUMBERS,
    started=NUMBERS,
    first=NUMBERS,
    requests=st.one_of(st.none(), st.integers(-(2**40), 2**40)),
)
def test_s10_any_number_a_registration_carries_is_refused_or_bounded(
    deadline: float | None,
    business: float | None,
    started: float | None,
    first: float | None,
    requests: int | None,
) -> None:
    """Issue 14: whatever numbers reach ``register`` (the spool's JSON cannot carry NaN or
    infinity, but the model must not rely on it), the operation it records ends within the
    profile's limits, with finite times and budgets, or it is refused with a reason."""
    reg = msgspec.structs.replace(
        registration(),
        deadline_at=deadline,
        business_deadline_at=business,
        started_at=started,
        first_poll_after_seconds=first,
        max_status_requests=requests,
    )
    c = contract()
    [out] = register(reg, c, T0)
    if isinstance(out, RegistrationRejected):
        assert out.detail
        return
    assert isinstance(out, OperationRegistered)
    for value in (out.deadline_at, out.started_at, out.first_poll_at):
        assert math.isfinite(value)
    assert T0 < out.deadline_at <= T0 + c.limit_deadline_seconds
    assert out.first_poll_at <= out.deadline_at
    assert 1 <= out.max_status_requests <= c.limit_status_requests
