"""Every event bide records, and their one encoder and decoder.

Events are facts, named in the past tense, frozen msgspec Structs tagged with an explicit and
stable string (``type``), never a class name. They fall in three groups:

* **registration**: ``operation_registered`` (the operation record of S5/S12, with the contract
  in force), ``registration_rejected``;
* **facts the daemon records** after a request (observations of the world, S31):
  ``status_response_received``, ``transport_failed``, ``request_outcome_unknown``;
* **the log's own facts** about an operation: ``node_took_over`` (another node took the log
  while the operation was not ended; it changes no state, and the story tells it);
* **decisions** that ``decide`` returns (each carries ``at``, the ``now`` it was computed with,
  and a ``PollScheduled`` carries the jitter ``draw``, so ``check`` can re-derive it):
  ``status_request_intended``, ``response_classified``, ``hint_rejected``, ``poll_scheduled``,
  ``operation_succeeded``, ``operation_stopped``, ``escalation_raised``, ``decision_recorded``,
  ``decision_rejected``.

Schema evolution (msgspec's rules): a new field always has a default; stored events never forbid
unknown fields, so an older bide reads a newer *minor* version. Every payload is an envelope
``{"schema": MAJOR, "minor": MINOR, "event": {...}}``; a payload with a newer major version, or
whose event type this bide does not know, raises :class:`~replay.errors.NewerSchemaError`
("this log was written by a newer bide (schema N); upgrade bide"), never a silent misread.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeVar

import msgspec
from msgspec import Meta

from replay.contract import Contract
from replay.errors import EventDecodeError, InvalidEventError, NewerSchemaError

__all__ = [
    "ACTION_EVENT_TYPES",
    "SCHEMA_MAJOR",
    "SCHEMA_MINOR",
    "ActionDecided",
    "ActionEvent",
    "ActionFailed",
    "ActionIntended",
    "ActionKind",
    "ActionReason",
    "ActionSucceeded",
    "DecisionRecorded",
    "DecisionRejected",
    "DelaySource",
    "EscalationContext",
    "EscalationRaised",
    "Event",
    "ExtendRule",
    "HintName",
    "HintRejected",
    "Histogram",
    "HttpOutcome",
    "JobOutcome",
    "LogEvent",
    "NodeTookOver",
    "OperationRegistered",
    "OperationStopped",
    "OperationSucceeded",
    "OperationWithdrawn",
    "Option",
    "OptionKind",
    "PollScheduled",
    "Registration",
    "RegistrationRejected",
    "RequestOutcomeUnknown",
    "ResponseClassified",
    "ResponseHeaders",
    "StatusRequestIntended",
    "StatusResponseReceived",
    "StopReason",
    "TransportFailed",
    "TransportKind",
    "decode_event",
    "decode_log_event",
    "encode_checked",
    "encode_event",
]

#: The schema major version this bide writes and reads. A newer major refuses to decode.
SCHEMA_MAJOR: Final = 1
#: The schema minor version this bide writes; minor additions are fields with defaults.
SCHEMA_MINOR: Final = 0

Seconds = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]
RequestNumber = Annotated[int, Meta(ge=1)]

#: Where the delay before the next poll came from (S38).
DelaySource = Literal[
    "provider_retry_after",  # RFC 9110 §10.2.3 Retry-After, on any response (S20, S21)
    "provider_poll_hint",  # a validated next_check_at / poll_after_seconds (S8)
    "local_backoff",  # exponential backoff with floored jitter (S6), or the 429 delay (S21)
    "rate_limit_policy",  # pacing from the IETF RateLimit / RateLimit-Policy headers
    "manual_extension",  # the first poll after a human extended the operation (S36)
    "local_quota",  # the daemon's per-provider quota held the poll back
]

#: Machine-readable stop reasons (S26); each decides the permitted options (replay.tables).
StopReason = Literal[
    "deadline_exceeded",  # S16: the operation's own deadline
    "business_deadline_exceeded",  # S28: the result's usefulness window closed first
    "request_budget_exhausted",  # S17
    "retry_after_past_deadline",  # S20: the provider asks us to wait past the deadline
    "rate_limited",  # S21: the rate-limited-response budget is spent
    "delivery_ambiguous",  # S18, S25: the transport-failure budget is spent
    "unknown_state",  # S15
    "unparseable_response",  # S15
    "integration_failure",  # S23: a status the contract cannot explain, 3xx, over-cap body
    "contradiction",  # S4, S5: success without results, pending past expiry, other job id
    "provider_failure",  # S3: terminal failure, error kept verbatim
    "canceled",  # S3, S29
    "expired",  # S3, S29
    "not_found",  # S23
    "authorization_denied",  # S24
    "internal_error",  # bide itself failed while handling the operation: a bug, contained
]

#: How a transport failure happened; see ``replay.tables.TRANSPORT_KINDS`` for what each means.
TransportKind = Literal[
    "connect_refused",
    "dns",
    "tls",
    "connect_timeout",
    "pool_timeout",
    "read_timeout",
    "write_timeout",
    "connection_reset",
    "protocol_error",
    "body_too_large",
    "not_sent",  # refused before it left: an invalid URL or header value (never delivered)
]

#: The HTTP outcome of a response (S2), separate from the job outcome.
HttpOutcome = Literal[
    "ok",
    "not_found",
    "auth_denied",
    "rate_limited",
    "server_error",
    "redirect",
    "unexplained",
]

#: The job outcome of a response (S2): the category of its state in the state table, if read.
JobOutcome = Literal["pending", "success", "failure", "canceled", "expired", "unknown"]

#: What a hint rejection was about (S8, RFC 9110 §10.2.3, IETF RateLimit headers).
HintName = Literal[
    "retry_after",
    "next_check_at",
    "poll_after_seconds",
    "expires_at",
    "ratelimit",
    "ratelimit_policy",
    "ratelimit_reset",  # the provider's own reset header (x-ratelimit-reset), epoch seconds
]

#: What a resuming decision (``extend``, ``rotate_credential_and_resume``) does to the deadline
#: and budgets, fixed when the operation is registered, so a log replays with the rule it was
#: written under. ``add`` (every registration since it exists): the option's time is added to
#: the deadline in force (to the approval time if the deadline has passed by then) and its
#: checks and failures to the budgets in force, as the option's label says. ``at_least`` (older
#: logs): the deadline becomes at least approval + time and each budget at least used + added,
#: which may add nothing when the deadline and budgets were not reached.
ExtendRule = Literal["at_least", "add"]

#: The kinds of escalation options (S27, S36); the option id is its kind.
OptionKind = Literal[
    "extend",
    "rotate_credential_and_resume",
    "cancel_at_provider",
    "retry_same_idempotency_key",
    "inspect_provider_console",
    "abandon",
    "retry_submit",
    "retry_cancel",
]


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event has.

    Attributes:
        operation_id: The operation the event belongs to.
        at: When it happened (POSIX seconds, UTC): for a fact, when it was observed; for a
            decision, the ``now`` it was computed with.
    """

    operation_id: str
    at: float


class Option(msgspec.Struct, frozen=True, kw_only=True):
    """One option of an escalation, with its concrete numbers (S27).

    Attributes:
        id: The option's id (its kind); what a decision names.
        label: Human-readable, with the numbers the decision will apply, e.g. "extend: deadline
            2025-04-18T10:40:00Z -> 2025-04-18T10:55:00Z (+15 min), checks 20 -> 24 (+4), ..."
            (in older logs, "extend 15 minutes and 4 more checks").
        params: Concrete numbers computed when the escalation was raised, e.g.
            ``{"add_seconds": 900, "add_status_requests": 4}``.
    """

    id: OptionKind
    label: str
    params: dict[str, int] = {}


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    """Counts of what the operation observed (S27): status codes, job states, transport kinds."""

    status_codes: dict[str, int] = {}
    job_states: dict[str, int] = {}
    transport: dict[str, int] = {}


class EscalationContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a human needs to decide, and no secret (S27, S37)."""

    operation_id: str
    provider: str
    provider_job_id: str
    reason: StopReason
    detail: str
    last_state: str | None
    last_state_at: float | None
    elapsed_seconds: float
    started_at: float
    deadline_at: float
    business_deadline_at: float | None
    status_requests_used: int
    max_status_requests: int
    transport_failures_used: int
    max_transport_failures: int
    rate_limited_used: int
    max_rate_limited: int
    last_http_status: int | None
    last_http_at: float | None
    last_provider_request_id: str | None
    histogram: Histogram


class ResponseHeaders(msgspec.Struct, frozen=True, kw_only=True):
    """The response headers that matter, as received (the daemon caps their length).

    Attributes:
        retry_after: ``Retry-After`` (RFC 9110 §10.2.3).
        ratelimit: ``RateLimit`` (IETF httpapi-ratelimit-headers).
        ratelimit_policy: ``RateLimit-Policy``.
        request_id: The provider's request id (``X-Request-Id`` or the profile's header), S25.
        location: ``Location`` (S22).
        content_type: ``Content-Type``.
        ratelimit_remaining: The provider's own remaining-requests header (the contract's
            ``rate_limit_remaining_header``, e.g. GitHub's ``x-ratelimit-remaining``).
        ratelimit_reset: The provider's own reset header (the contract's
            ``rate_limit_reset_header``, e.g. GitHub's ``x-ratelimit-reset``, epoch seconds).
    """

    retry_after: str | None = None
    ratelimit: str | None = None
    ratelimit_policy: str | None = None
    request_id: str | None = None
    location: str | None = None
    content_type: str | None = None
    ratelimit_remaining: str | None = None
    ratelimit_reset: str | None = None


# --- registration ------------------------------------------------------------------------------


class OperationRegistered(_Event, tag="operation_registered", frozen=True, kw_only=True):
    """The operation record, persisted before the first poll (S5, S12).

    Attributes:
        provider: Provider name (the contract's).
        provider_job_id: The job id at the provider.
        account_context: The provider account context (a name, never a credential).
        request_fingerprint: Fingerprint of the original submit request (S5).
        expected_terminal_state: The success state the submitter expects, if any.
        idempotency_key: The submission's idempotency key, if one was persisted (S29).
        status_location: The status resource from a 202's Location, if any (S22).
        started_at: When the job was submitted (at or before ``at``).
        deadline_at: The operation's wall-clock deadline (S10).
        business_deadline_at: When the result stops being useful, if earlier known (S28).
        max_status_requests: Status-request budget (S10).
        max_transport_failures: Transport-failure budget (S10).
        max_rate_limited: Rate-limited-response budget (S21).
        first_poll_at: When the first poll is due (S7).
        contract: The provider contract in force.
        contract_digest: ``contract_digest(contract)``.
        registered_by: Who asked for the operation, as the daemon saw it (the spool file's
            owner, or the API's peer): never a name the request claims. Empty in older logs.
        registered_by_uid: That user's uid, if known.
        request_digest: SHA-256 of the API request that asked for it (empty from the spool
            and in older logs): a retry with the same operation id and the same request is
            answered with the same receipt, a different request with a conflict.
        extend_rule: What an approved extension does (:data:`ExtendRule`); ``at_least`` in
            logs written before the rule was recorded, ``add`` for every new registration.
    """

    provider: str
    provider_job_id: str
    account_context: str = ""
    request_fingerprint: str = ""
    expected_terminal_state: str | None = None
    idempotency_key: str | None = None
    status_location: str | None = None
    started_at: float
    deadline_at: float
    business_deadline_at: float | None = None
    max_status_requests: Annotated[int, Meta(ge=1)]
    max_transport_failures: Annotated[int, Meta(ge=1)]
    max_rate_limited: Annotated[int, Meta(ge=1)]
    first_poll_at: float
    contract: Contract
    contract_digest: str
    registered_by: str = ""
    registered_by_uid: int | None = None
    request_digest: str = ""
    extend_rule: ExtendRule = "at_least"


class RegistrationRejected(_Event, tag="registration_rejected", frozen=True, kw_only=True):
    """A registration that did not validate; no operation exists.

    Attributes:
        reason: A machine-readable reason (``replay.decide.RegistrationProblem``).
        detail: A human-readable explanation, without the offending value.
    """

    reason: str
    detail: str = ""


# --- facts the daemon records ------------------------------------------------------------------


class StatusResponseReceived(_Event, tag="status_response_received", frozen=True, kw_only=True):
    """A status request got an HTTP response; ``at`` is when it was received (S2, S25, S31).

    Attributes:
        request_number: The ``StatusRequestIntended.request_number`` it answers.
        status_code: The HTTP status code: the HTTP outcome, recorded apart from the job's.
        headers: The headers that matter.
        body: The body, as received, capped by the daemon.
        body_truncated: The body was larger than the daemon's cap (and is cut).
    """

    request_number: RequestNumber
    status_code: Annotated[int, Meta(ge=100, le=599)]
    headers: ResponseHeaders = msgspec.field(default_factory=ResponseHeaders)
    body: bytes = b""
    body_truncated: bool = False


class TransportFailed(_Event, tag="transport_failed", frozen=True, kw_only=True):
    """A status request got no HTTP response (S10, S25); ``at`` is when it failed.

    Attributes:
        request_number: The request it was.
        kind: How it failed (never delivered, delivery ambiguous, or over the size cap).
        detail: A short description without secrets (no URL query, no header values).
    """

    request_number: RequestNumber
    kind: TransportKind
    detail: str = ""


class RequestOutcomeUnknown(_Event, tag="request_outcome_unknown", frozen=True, kw_only=True):
    """On restart, an intent was found without an outcome (S11, S13): it counted, and its
    delivery is ambiguous.

    Attributes:
        request_number: The request whose outcome is unknown.
    """

    request_number: RequestNumber


# --- decisions -----------------------------------------------------------------------------------


class StatusRequestIntended(_Event, tag="status_request_intended", frozen=True, kw_only=True):
    """One status request is about to be sent; durable before it is (S13, S31, S32).

    Attributes:
        request_number: The status-request counter after the increment (S13).
        deadline_at: The deadline in force (the earlier of operation and business deadline).
        max_status_requests: The budget in force.
        due_by_timer: Sent because the daemon's monotonic timer for the scheduled wait had
            elapsed while the wall clock still read before ``next_poll_at`` (it was set back):
            a wait is an interval, a deadline a wall-clock fact.
    """

    request_number: RequestNumber
    deadline_at: float
    max_status_requests: int
    due_by_timer: bool = False


class ResponseClassified(_Event, tag="response_classified", frozen=True, kw_only=True):
    """How ``decide`` read a response: HTTP outcome and job outcome, two facts (S2).

    Attributes:
        request_number: The request answered.
        http_status: The status code.
        http_outcome: What the status code means under the contract.
        job_state: The job state read from the body, if one was read.
        job_outcome: Its category in the state table, if one was read (S3).
        provider_request_id: The provider's request id, if sent (S25).
        retry_after_at: The absolute time a valid Retry-After asked to wait until (S20).
    """

    request_number: RequestNumber
    http_status: int
    http_outcome: HttpOutcome
    job_state: str | None = None
    job_outcome: JobOutcome | None = None
    provider_request_id: str | None = None
    retry_after_at: float | None = None


class HintRejected(_Event, tag="hint_rejected", frozen=True, kw_only=True):
    """A provider hint or protocol header was rejected and ignored (S8).

    Attributes:
        request_number: The response it came with.
        hint: Which hint.
        value: The value as received, cut to 200 characters.
        reason: Why it was rejected.
    """

    request_number: int
    hint: HintName
    value: str
    reason: str


class PollScheduled(_Event, tag="poll_scheduled", frozen=True, kw_only=True):
    """When the next poll is due, and why (S6, S8, S20, S21, S38).

    Attributes:
        next_poll_at: The earliest time of the next status request.
        delay_source: Where the delay came from.
        raw_delay: The raw delay: for local backoff ``min(cap, base * 2**attempt)`` (S6) or the
            429 delay; for guidance, the time it asked for minus ``at``.
        delay: ``next_poll_at - at``.
        draw: The jitter draw in [0, 1) the local delay was computed with, if any.
        until: The absolute time the provider or the quota asked for, if any.
        clamped_to_deadline: The poll was moved to the deadline, where it will stop (S8, S16).
    """

    next_poll_at: float
    delay_source: DelaySource
    raw_delay: Seconds
    delay: Seconds
    draw: float | None = None
    until: float | None = None
    clamped_to_deadline: bool = False


class OperationSucceeded(_Event, tag="operation_succeeded", frozen=True, kw_only=True):
    """The job reached an accepted success state and every required result validated (S14).

    Attributes:
        request_number: The response that showed it.
        state: The success state.
        results: The result fields, by name (strings; other JSON values as JSON text).
    """

    request_number: int
    state: str
    results: dict[str, str] = {}


class OperationStopped(_Event, tag="operation_stopped", frozen=True, kw_only=True):
    """The wait ended without success; an escalation follows at once (S15, S16, S26).

    Attributes:
        reason: The machine-readable reason.
        detail: A human-readable explanation (no secret).
        last_state: The last job state observed (S16).
        provider_error: The provider's error, verbatim and capped (provider_failure).
        provider_error_truncated: The provider's error was cut at the contract's cap.
        request_number: The response that caused it, or 0 for a wake-up.
    """

    reason: StopReason
    detail: str = ""
    last_state: str | None = None
    provider_error: str | None = None
    provider_error_truncated: bool = False
    request_number: int = 0


class EscalationRaised(_Event, tag="escalation_raised", frozen=True, kw_only=True):
    """A human decision is needed; the options are finite and concrete (S26, S27, S37).

    Attributes:
        escalation_id: 1 for the operation's first escalation, then 2, ...
        reason: The stop reason.
        options: The permitted options, with their numbers.
        context: What the decision needs to know.
    """

    escalation_id: Annotated[int, Meta(ge=1)]
    reason: StopReason
    options: tuple[Option, ...]
    context: EscalationContext


class DecisionRecorded(_Event, tag="decision_recorded", frozen=True, kw_only=True):
    """A human chose an offered option; a resuming option is a new authorization (S36).

    Counters are never reset (S17): new budgets are ``used + added``.

    Attributes:
        escalation_id: The escalation decided.
        option_id: The option chosen.
        approver: The user name of the decision's owner (filled by the daemon).
        note: The approver's note.
        resumes: Polling resumes (extend, rotate_credential_and_resume).
        new_deadline_at: The operation deadline from now on.
        new_business_deadline_at: The business deadline from now on.
        new_max_status_requests: The status-request budget from now on.
        new_max_transport_failures: The transport-failure budget from now on.
        new_max_rate_limited: The rate-limited budget from now on.
        follow_up: What the daemon or a human does next when polling does not resume
            (``cancel_at_provider``, ``retry_same_idempotency_key``,
            ``inspect_provider_console``, ``abandon``): a separate operation (S34).
        self_approved: The approver registered the operation themselves (allowed only where
            the config says so: ``[api] allow_self_approval``).
    """

    escalation_id: int
    option_id: OptionKind
    approver: str
    note: str = ""
    resumes: bool = False
    new_deadline_at: float
    new_business_deadline_at: float | None = None
    new_max_status_requests: int
    new_max_transport_failures: int
    new_max_rate_limited: int
    follow_up: OptionKind | None = None
    self_approved: bool = False


class DecisionRejected(_Event, tag="decision_rejected", frozen=True, kw_only=True):
    """A decision that named no offered option; nothing else changes (S36).

    Attributes:
        option_id: The option named, as given (cut to 64 characters).
        approver: Who submitted it.
        note: Their note.
        escalation_id: The escalation the decision named, if it named one.
        reason: Why it was rejected.
    """

    option_id: str
    approver: str
    note: str = ""
    escalation_id: int | None = None
    reason: str


class OperationWithdrawn(_Event, tag="operation_withdrawn", frozen=True, kw_only=True):
    """The operation's owner stopped the wait: no provider call is made, none follows.

    Attributes:
        by: The user name of who withdrew it (the daemon's word: the API's peer).
        by_uid: That user's uid.
        note: Their note.
    """

    by: str
    by_uid: int | None = None
    note: str = ""


class NodeTookOver(_Event, tag="node_took_over", frozen=True, kw_only=True):
    """A node took the log (the lease, with the log in PostgreSQL) while this operation was
    live or escalated: recorded once per such operation, right after the node's signed
    takeover checkpoint, before it decides anything. It changes no state; a log without it
    (files, or written before it) replays exactly as before.

    Attributes:
        node: The node's name (``[postgres] node``, else its host name).
        holder: The lease's holder as the takeover checkpoint names it (name/pid/random).
        epoch: The lease epoch it took.
    """

    node: str
    holder: str = ""
    epoch: Annotated[int, Meta(ge=0)]


#: The longest operation id, provider job id, fingerprint or account context accepted.
MAX_ID_LENGTH: Final = 256
#: Ids are printable: no control characters, no whitespace at either end.
ID_PATTERN: Final = r"^[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"

Identifier = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """A request to watch one job at one provider (S5, S10, S12, S28).

    Attributes:
        operation_id: bide's id for the operation (unique in the log; the daemon checks).
        provider: The provider; must be the contract's.
        provider_job_id: The job id at the provider; non-empty, bounded, printable.
        account_context: The provider account context (a name, never a credential).
        request_fingerprint: Fingerprint of the original submit request.
        expected_terminal_state: The success state expected; must be in the success list.
        idempotency_key: The persisted idempotency key of the submission, if any (S29).
        status_location: The status resource named by a 202's Location, if any (S22).
        started_at: When the job was submitted; default ``now``; not in the future.
        deadline_at: The deadline; default ``now + contract.default_deadline_seconds``.
        business_deadline_at: When the result stops being useful (S28), if known.
        max_status_requests: Status-request budget; default from the contract.
        max_transport_failures: Transport-failure budget; default from the contract.
        max_rate_limited: Rate-limited budget; default from the contract.
        first_poll_after_seconds: Delay before the first poll; default from the contract.
    """

    operation_id: Identifier
    provider: Annotated[str, Meta(min_length=1, max_length=64)]
    provider_job_id: Identifier
    account_context: Annotated[str, Meta(max_length=MAX_ID_LENGTH)] = ""
    request_fingerprint: Annotated[str, Meta(max_length=MAX_ID_LENGTH)] = ""
    expected_terminal_state: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH)] | None = None
    status_location: Annotated[str, Meta(min_length=1, max_length=2048)] | None = None
    started_at: float | None = None
    deadline_at: float | None = None
    business_deadline_at: float | None = None
    max_status_requests: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    max_transport_failures: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    max_rate_limited: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    first_poll_after_seconds: Annotated[float, Meta(ge=0)] | None = None


# --- side-effecting actions: submit, fetch, cancel (S22, S29, S34, S36) ------------------------
#
# Each call with a side effect is its own recorded operation: an intent made durable before
# the call, one call, its outcome, and its own escalation when the outcome is ambiguous. These
# events are kept out of :data:`Event` (the status operation's events), so ``fold``, ``evolve``
# and ``check`` of status operations never see them; :data:`LogEvent` is everything the log
# holds. ``operation_id`` names the status operation the action belongs to (for a submit, the
# one it registers on success); ``action_id`` names the action.

#: What a side-effecting action does.
ActionKind = Literal["submit", "fetch", "cancel"]

#: Why an action did not succeed.
ActionReason = Literal[
    "submit_rejected",  # the provider answered, and not with an accepted job
    "submit_not_delivered",  # the request never reached the provider: safe to retry
    "submit_outcome_unknown",  # sent, outcome unknown (timeout, reset, 5xx): S29
    "submit_contradiction",  # accepted, but no job id or status resource as the profile says
    "fetch_failed",  # download refused, too large, cut short, or timed out
    "cancel_rejected",  # the provider answered and refused
    "cancel_outcome_unknown",  # sent, outcome unknown
]


class ActionIntended(_Event, tag="action_intended", frozen=True, kw_only=True):
    """A side-effecting call is about to be made; durable before it is (S13, S29, S31).

    Attributes:
        action_id: The action's id (``OP.submit``, ``OP.fetch.N``, ``OP.cancel.N``).
        kind: submit, fetch or cancel.
        provider: The provider called.
        method: The HTTP method.
        url: The URL called (from the profile; never guessed, S22).
        request_fingerprint: SHA-256 of method, URL and body (submit).
        idempotency_key: The key sent with the submit, recorded before sending (S29).
        attempt: 1 for the first call, then 2, ... (automatic retries only when idempotent).
        timeout_seconds: The bound on the call.
        max_bytes: The size cap on what comes back (fetch).
        body: The submit body, kept so that a decided retry sends exactly the same request.
        registration: What to register when a submit is accepted (deadline, budgets).
        registered_by: Who asked for the submit (the spool file's owner), for the operation.
        registered_by_uid: That user's uid.
        spool_request: The spool request it answers, so its receipt survives a restart.
        request_digest: The digest of the whole API request that asked for a submit
            (deadline and budgets too), so a retry that differs is a conflict, not the same.
        result_name: The result field fetched (fetch).
        requested_by: Who asked for the fetch (the API caller or the spool file's owner, as
            the kernel says); "" in logs written before it was recorded.
        requested_by_uid: That user's uid (None before it was recorded).
    """

    action_id: Annotated[str, Meta(min_length=1, max_length=300)]
    kind: ActionKind
    provider: str
    method: str
    url: str
    request_fingerprint: str = ""
    idempotency_key: str | None = None
    attempt: Annotated[int, Meta(ge=1)] = 1
    timeout_seconds: float
    max_bytes: int | None = None
    body: bytes = b""
    registration: Registration | None = None
    registered_by: str = ""
    registered_by_uid: int | None = None
    spool_request: str | None = None
    request_digest: str = ""
    result_name: str | None = None
    requested_by: str = ""
    requested_by_uid: int | None = None


class ActionSucceeded(_Event, tag="action_succeeded", frozen=True, kw_only=True):
    """The call succeeded (S22: a 202 with the job's id and status resource as documented).

    Attributes:
        action_id: The action.
        http_status: The HTTP status of the answer.
        provider_job_id: The job id the provider returned (submit).
        status_location: The status resource the provider named (submit), same origin only.
        final_result: A submit answered 200/201 with the job already done.
        size: Bytes downloaded (fetch).
        sha256: Their SHA-256 (fetch).
        stored_as: Where the daemon stored them, relative to its results directory (fetch).
    """

    action_id: str
    http_status: int
    provider_job_id: str | None = None
    status_location: str | None = None
    final_result: bool = False
    size: int | None = None
    sha256: str | None = None
    stored_as: str | None = None


class ActionFailed(_Event, tag="action_failed", frozen=True, kw_only=True):
    """The call did not succeed; with ``options`` it is escalated and awaits a decision.

    Attributes:
        action_id: The action.
        reason: Why, machine-readable.
        http_status: The HTTP status, when an answer came.
        transport: How delivery failed, when no answer came.
        ambiguous: The request may have had its effect (sent, outcome unknown).
        detail: A short description without secrets.
        options: The finite options offered to a human (empty: nothing to decide).
        retry_scheduled: An automatic retry with the same idempotency key follows (S29).
    """

    action_id: str
    reason: ActionReason
    http_status: int | None = None
    transport: TransportKind | None = None
    ambiguous: bool = False
    detail: str = ""
    options: tuple[Option, ...] = ()
    retry_scheduled: bool = False


class ActionDecided(_Event, tag="action_decided", frozen=True, kw_only=True):
    """A human chose one of an escalated action's options, or named one not offered.

    Attributes:
        action_id: The action.
        option_id: The option named.
        approver: The decision file's owner.
        note: Their note.
        accepted: False when the option was not offered; nothing else changes then.
        reason: Why it was rejected, when it was.
    """

    action_id: str
    option_id: str
    approver: str
    note: str = ""
    accepted: bool = True
    reason: str = ""


ActionEvent = ActionIntended | ActionSucceeded | ActionFailed | ActionDecided

Event = (
    OperationRegistered
    | RegistrationRejected
    | StatusResponseReceived
    | TransportFailed
    | RequestOutcomeUnknown
    | StatusRequestIntended
    | ResponseClassified
    | HintRejected
    | PollScheduled
    | OperationSucceeded
    | OperationStopped
    | EscalationRaised
    | DecisionRecorded
    | DecisionRejected
    | OperationWithdrawn
    | NodeTookOver
)

#: Every event class, for code that must enumerate them (tests, docs).
EVENT_TYPES: Final[tuple[type[_Event], ...]] = (
    OperationRegistered,
    RegistrationRejected,
    StatusResponseReceived,
    TransportFailed,
    RequestOutcomeUnknown,
    StatusRequestIntended,
    ResponseClassified,
    HintRejected,
    PollScheduled,
    OperationSucceeded,
    OperationStopped,
    EscalationRaised,
    DecisionRecorded,
    DecisionRejected,
    OperationWithdrawn,
    NodeTookOver,
)

ACTION_EVENT_TYPES: Final[
    tuple[type[ActionIntended], type[ActionSucceeded], type[ActionFailed], type[ActionDecided]]
] = (
    ActionIntended,
    ActionSucceeded,
    ActionFailed,
    ActionDecided,
)

#: Everything the log holds: status-operation events and action events.
LogEvent = Event | ActionEvent

_TAGS: Final[frozenset[str]] = frozenset(
    str(t.__struct_config__.tag) for t in (*EVENT_TYPES, *ACTION_EVENT_TYPES)
)


class _Envelope(msgspec.Struct, frozen=True):
    schema: int
    event: LogEvent
    minor: int = 0


class _RawEnvelope(msgspec.Struct, frozen=True):
    schema: int
    event: msgspec.Raw
    minor: int = 0


class _TagOnly(msgspec.Struct, frozen=True):
    type: str


_T = TypeVar("_T")

_encoder: Final = msgspec.json.Encoder()
_raw_decoder: Final = msgspec.json.Decoder(_RawEnvelope)
_event_decoder: Final = msgspec.json.Decoder(Event)
_log_event_decoder: Final = msgspec.json.Decoder(LogEvent)
_tag_decoder: Final = msgspec.json.Decoder(_TagOnly)


def encode_event(event: LogEvent) -> bytes:
    """Encode an event as the versioned JSON payload the log stores.

    Args:
        event: Any event.

    Returns:
        ``{"schema": 1, "event": {...}, "minor": 0}`` as UTF-8 JSON bytes.
    """
    return _encoder.encode(_Envelope(schema=SCHEMA_MAJOR, minor=SCHEMA_MINOR, event=event))


def encode_checked(event: LogEvent) -> bytes:
    """:func:`encode_event`, and proof that the payload reads back as the same event.

    The writer's path uses this: an event that would not decode (a status code of 999, a
    value outside its constraints, NaN) is a bug caught before it reaches the log, where it
    would make every reader of every operation fail.

    Raises:
        InvalidEventError: The event would not read back as written.
    """
    data = encode_event(event)
    try:
        again = _log_event_decoder.decode(_raw_decoder.decode(data).event)
    except msgspec.DecodeError as exc:
        raise InvalidEventError(
            f"{type(event).__name__} would not read back from the log: {exc}"
        ) from None
    if again != event:
        raise InvalidEventError(f"{type(event).__name__} would read back changed")
    return data


def decode_event(data: bytes) -> Event:
    """Decode a status-operation event written by :func:`encode_event`.

    Args:
        data: The payload bytes.

    Returns:
        The event.

    Raises:
        NewerSchemaError: The payload has a newer schema major, or an event type this bide
            does not know.
        EventDecodeError: The payload is not a bide event (an action event included).
    """
    return _decode(data, _event_decoder)


def decode_log_event(data: bytes) -> LogEvent:
    """Decode any payload the log holds: a status-operation event or an action event.

    Raises:
        NewerSchemaError: As :func:`decode_event`.
        EventDecodeError: As :func:`decode_event`.
    """
    return _decode(data, _log_event_decoder)


def _decode(data: bytes, decoder: msgspec.json.Decoder[_T]) -> _T:
    try:
        envelope = _raw_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"payload is not a bide event envelope: {exc}") from None
    if envelope.schema > SCHEMA_MAJOR:
        raise NewerSchemaError(envelope.schema)
    if envelope.schema < 1:
        raise EventDecodeError(f"payload has an invalid schema version {envelope.schema}")
    try:
        return decoder.decode(envelope.event)
    except msgspec.DecodeError as exc:
        try:
            tag = _tag_decoder.decode(envelope.event).type
        except msgspec.DecodeError:
            tag = None
        if tag is not None and tag not in _TAGS:
            raise NewerSchemaError(envelope.schema, f"unknown event type {tag[:64]!r}") from None
        raise EventDecodeError(f"payload is not a valid bide event: {exc}") from None
