"""The provider's contract, as data the model reads (S3, S7, S8, S10, S14, S23, S26).

A :class:`Contract` is everything ``decide`` needs to know about one provider: how to read a
status response (JSON pointers, RFC 6901), which job states mean what (the state table: a state
in no list is *unknown*, and unknown stops the wait, S3/S15), which result fields must be present
and valid before a success is accepted (S14), the provider's hint fields (S8), the 404 grace
window (S23), the backoff schedule (S6/S7), the default deadline and budgets (S10) and what the
provider documents (a cancel call, idempotent submissions: S27/S29).

The daemon builds a ``Contract`` from a TOML profile (``msgspec.convert(table, Contract)``); the
msgspec constraints below, and the cross-field checks in ``__post_init__``, make an invalid
value fail that conversion. A contract is stored inside ``OperationRegistered`` (the contract in
force for that operation), so it does not forbid unknown fields: a newer bide may add fields with
defaults and an older one still reads the log. A profile loader that wants to reject typos checks
the keys itself.

:func:`contract_digest` is the SHA-256 of the canonical encoding (JSON, keys sorted): the digest
an operation records as "the profile in force" (S5, S12).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from replay.rules import Scalar, StateRule, rule_problems

__all__ = [
    "Contract",
    "JsonPointer",
    "ResultField",
    "ResultKind",
    "StateRule",
    "StateTable",
    "contract_digest",
]

#: An RFC 6901 JSON pointer: "" (the whole document) or "/a/b/0"; "~0" is "~", "~1" is "/".
JsonPointer = Annotated[str, Meta(pattern=r"^(/([^~/]|~[01])*)*$", max_length=512)]
#: A provider's name for a job state, exactly as it appears in the status body.
StateName = Annotated[str, Meta(min_length=1, max_length=128)]
#: A name for a result field, used in ``OperationSucceeded.results``.
FieldName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
#: A provider name, as it appears in profiles, events and stories.
#: An HTTP header name (RFC 9110 §5.1, a token), as a profile names one.
HeaderName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")]
ProviderName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]

_DAY = 86_400.0
_YEAR = 366 * _DAY

#: How a result field is validated before a success is accepted (S14).
#: ``https_url``: a string that is an absolute https URL with a host;
#: ``url``: the same with http or https; ``non_empty``: a string with a non-blank character;
#: ``present``: any JSON value other than null.
ResultKind = Literal["https_url", "url", "non_empty", "present"]


class StateTable(msgspec.Struct, frozen=True, kw_only=True):
    """The provider's job states by category (S3). A state in no list is unknown (S15).

    Attributes:
        pending: States that only permit observing again later (S1): queued, running, ...
        success: Accepted terminal success states (S14); at least one.
        failure: Terminal failure states: stop, keep the provider's error.
        canceled: Canceled states: stop, never resubmit (S29).
        expired: Expired states: stop, never resubmit (S29).
    """

    success: Annotated[tuple[StateName, ...], Meta(min_length=1, max_length=64)]
    pending: Annotated[tuple[StateName, ...], Meta(max_length=64)] = ()
    failure: Annotated[tuple[StateName, ...], Meta(max_length=64)] = ()
    canceled: Annotated[tuple[StateName, ...], Meta(max_length=64)] = ()
    expired: Annotated[tuple[StateName, ...], Meta(max_length=64)] = ()

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for category in ("pending", "success", "failure", "canceled", "expired"):
            for state in getattr(self, category):
                if state in seen:
                    raise ValueError(
                        f"state {state!r} is listed as both {seen[state]} and {category}"
                    )
                seen[state] = category


class ResultField(msgspec.Struct, frozen=True, kw_only=True):
    """One field of the status body that the next step needs (S14).

    Attributes:
        name: The name the result is recorded under in ``OperationSucceeded.results``.
        pointer: Where it is in the status body (RFC 6901).
        kind: How it is validated: ``https_url``, ``url``, ``non_empty`` or ``present``
            (:data:`ResultKind`; each is described below).
        required: A success without a valid required field is a contradiction (S4).
    """

    name: FieldName
    pointer: JsonPointer
    kind: ResultKind = "present"
    required: bool = True


class Contract(msgspec.Struct, frozen=True, kw_only=True):
    """One provider's status-polling contract.

    Attributes:
        provider: The provider's name (matches the registration's provider).
        states: The state table (S3), with ``state_pointer``; unset when ``state_rules`` read
            the state instead.
        state_pointer: JSON pointer to the job state in the status body.
        state_rules: Ordered rules deriving the state from several fields
            (:mod:`replay.rules`); the first that matches gives the state and its category,
            none matching is unknown (S15). Exclusive with ``states`` and ``state_pointer``.
        documented_states: The provider's documented values per pointer (``/a/*/b`` for a
            field of an array's elements); each must be classified by some rule.
        job_id_pointer: JSON pointer to the job id in the status body; when set, it must equal
            the registered job id, else the response is a contradiction (identity, S5).
        results: Result fields recorded on success; required ones must validate (S14).
        next_check_at_pointer: Absolute-time poll hint (ISO-8601 or POSIX seconds), S8.
        poll_after_seconds_pointer: Relative poll hint in seconds, S8.
        expires_at_pointer: The job's own expiry; "pending" past it is a contradiction (S4).
        error_pointer: The provider's error, kept verbatim on failure; unset keeps the body.
        error_cap_bytes: The most bytes of a provider error kept.
        ok_statuses: 2xx status codes whose body carries the job state (S22: 202 if documented).
        not_found_grace_seconds: After the job's start, a 404 within this window is "not yet
            visible" (eventual consistency) and polled again; later it is ``not_found`` (S23).
        first_poll_after_seconds: Delay before the first poll (S7); unset means the base.
        backoff_base_seconds: Backoff base (S6).
        backoff_cap_seconds: Backoff cap (S6).
        rate_limited_delay_seconds: Raw delay after a 429 without Retry-After (S21); at least
            twice the backoff cap, so even floored jitter waits longer than any ordinary poll.
        min_hint_seconds: A provider hint sooner than this is rejected as too soon (S8).
        max_hint_horizon_seconds: A provider hint further away than this is rejected (S8).
        default_deadline_seconds: Deadline after registration when none is given (S10).
        default_max_status_requests: Status-request budget when none is given (S10).
        default_max_transport_failures: Transport-failure budget when none is given (S10).
        default_max_rate_limited: Rate-limited-response budget when none is given (S21).
        extend_seconds: What an ``extend`` option offers, in seconds (S27).
        extend_status_requests: What an ``extend`` option offers, in status requests (S27).
        limit_deadline_seconds: The furthest deadline a registration may ask for, from now:
            no operation stays live for ever (S10). Defaults must fit under every limit.
        limit_status_requests: The largest status-request budget a registration may ask for.
        limit_transport_failures: The largest transport-failure budget it may ask for.
        limit_rate_limited: The largest rate-limited budget it may ask for.
        cancel_documented: The provider documents a cancel call (S27: only then offered).
        idempotent_submit: Submissions are idempotent by key (S29).
        rate_limit_remaining_header: The provider's own header counting the requests left in
            its window (GitHub: ``x-ratelimit-remaining``). With ``rate_limit_reset_header``:
            a 403 or 429 whose remaining is ``0`` is rate-limited, not a refused credential.
        rate_limit_reset_header: The provider's own header giving when that window resets, as
            POSIX (epoch) seconds (GitHub: ``x-ratelimit-reset``); no poll before it.
    """

    provider: ProviderName
    states: StateTable | None = None
    state_pointer: JsonPointer | None = None
    state_rules: Annotated[tuple[StateRule, ...], Meta(max_length=64)] = ()
    documented_states: Annotated[
        dict[
            Annotated[str, Meta(pattern=r"^(/([^~/]|~[01])*)*$", max_length=512)],
            Annotated[tuple[Scalar, ...], Meta(max_length=128)],
        ],
        Meta(max_length=32),
    ] = msgspec.field(default_factory=dict)
    job_id_pointer: JsonPointer | None = None
    results: Annotated[tuple[ResultField, ...], Meta(max_length=32)] = ()
    next_check_at_pointer: JsonPointer | None = None
    poll_after_seconds_pointer: JsonPointer | None = None
    expires_at_pointer: JsonPointer | None = None
    error_pointer: JsonPointer | None = None
    error_cap_bytes: Annotated[int, Meta(ge=64, le=65_536)] = 2048
    ok_statuses: Annotated[
        tuple[Annotated[int, Meta(ge=200, le=299)], ...], Meta(min_length=1, max_length=10)
    ] = (200,)
    not_found_grace_seconds: Annotated[float, Meta(ge=0, le=_DAY)] = 0.0
    first_poll_after_seconds: Annotated[float, Meta(ge=0, le=_DAY)] | None = None
    backoff_base_seconds: Annotated[float, Meta(gt=0, le=_DAY)] = 5.0
    backoff_cap_seconds: Annotated[float, Meta(gt=0, le=_DAY)] = 120.0
    rate_limited_delay_seconds: Annotated[float, Meta(gt=0, le=2 * _DAY)] = 300.0
    min_hint_seconds: Annotated[float, Meta(ge=0, le=_DAY)] = 1.0
    max_hint_horizon_seconds: Annotated[float, Meta(gt=0, le=_YEAR)] = _DAY
    default_deadline_seconds: Annotated[float, Meta(gt=0, le=_YEAR)] = 3600.0
    default_max_status_requests: Annotated[int, Meta(ge=1, le=1_000_000)] = 12
    default_max_transport_failures: Annotated[int, Meta(ge=1, le=1_000_000)] = 3
    default_max_rate_limited: Annotated[int, Meta(ge=1, le=1_000_000)] = 3
    extend_seconds: Annotated[int, Meta(ge=1, le=int(_YEAR))] = 900
    extend_status_requests: Annotated[int, Meta(ge=1, le=1_000_000)] = 4
    limit_deadline_seconds: Annotated[float, Meta(gt=0, le=_YEAR)] = 7 * _DAY
    limit_status_requests: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000
    limit_transport_failures: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    limit_rate_limited: Annotated[int, Meta(ge=1, le=1_000_000)] = 1_000
    cancel_documented: bool = False
    idempotent_submit: bool = False
    rate_limit_remaining_header: HeaderName | None = None
    rate_limit_reset_header: HeaderName | None = None

    def __post_init__(self) -> None:
        table = self.states is not None or self.state_pointer is not None
        if self.state_rules:
            if table:
                raise ValueError(
                    "state_rules replace state_pointer and states: give one form, not both"
                )
            problems = rule_problems(self.state_rules, self.documented_states.items())
            if problems:
                raise ValueError("; ".join(problems))
        elif self.states is None or self.state_pointer is None:
            raise ValueError("give state_pointer and states, or state_rules")
        elif self.documented_states:
            raise ValueError("documented_states are checked against state_rules only")
        if (self.rate_limit_remaining_header is None) != (self.rate_limit_reset_header is None):
            raise ValueError(
                "rate_limit_remaining_header and rate_limit_reset_header go together: "
                "give both or neither"
            )
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be at least backoff_base_seconds")
        if self.rate_limited_delay_seconds < 2 * self.backoff_cap_seconds:
            # S21: "a markedly larger delay": the floor of its jitter is above every backoff.
            raise ValueError("rate_limited_delay_seconds must be at least 2 * backoff_cap_seconds")
        if self.min_hint_seconds >= self.max_hint_horizon_seconds:
            raise ValueError("min_hint_seconds must be below max_hint_horizon_seconds")
        for default, limit in (
            ("default_deadline_seconds", "limit_deadline_seconds"),
            ("default_max_status_requests", "limit_status_requests"),
            ("default_max_transport_failures", "limit_transport_failures"),
            ("default_max_rate_limited", "limit_rate_limited"),
        ):
            if getattr(self, default) > getattr(self, limit):
                raise ValueError(f"{default} must not exceed {limit}")
        names = [field.name for field in self.results]
        if len(set(names)) != len(names):
            raise ValueError("result field names must be unique")

    @property
    def success_states(self) -> tuple[str, ...]:
        """The names of the success states, from the table or the rules."""
        if self.states is not None:
            return self.states.success
        return tuple(r.state for r in self.state_rules if r.category == "success")


_canonical = msgspec.json.Encoder(order="sorted")


def contract_digest(contract: Contract) -> str:
    """Return the SHA-256 hex digest of the contract's canonical encoding (keys sorted).

    Args:
        contract: The contract in force.

    Returns:
        64 lowercase hex characters.
    """
    data = msgspec.to_builtins(contract)
    # Keys added with the state rules (and the provider's rate-limit headers) are left out when
    # unused, so a contract written before
    # them keeps its digest (recorded operations still name the profile in force).
    for key in _OMITTED_WHEN_UNSET:
        value = data.get(key)
        if value is None or (isinstance(value, tuple | list | dict) and not value):
            del data[key]
    return hashlib.sha256(_canonical.encode(data)).hexdigest()


_OMITTED_WHEN_UNSET = (
    "state_rules",
    "documented_states",
    "states",
    "state_pointer",
    "rate_limit_remaining_header",
    "rate_limit_reset_header",
)
