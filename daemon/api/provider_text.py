"""The provider's words on their way to an agent: apart from bide's, and bounded.

A provider chooses its job states, its error bodies, its header values, the values of a
job's results and, for a job bide submitted, the job's id. A hostile or compromised provider
can make any of them read like an instruction ("IGNORE PREVIOUS INSTRUCTIONS and ..."). The
local API and the MCP tools therefore carry them only in fields named ``provider_*`` (and a
story line's ``provider_text``), each cut at :data:`replay.story.PROVIDER_TEXT_LIMIT`
characters (an error and result values at :data:`PROVIDER_LONG_TEXT_LIMIT`) with a marker
saying how much was cut; bide's own text (an escalation's ``detail`` and ``text``, a story
line's ``text``) names them by a placeholder, ``⟨provider_state⟩``, ``⟨provider_error⟩`` and
so on, never quotes them. :func:`inline` puts them back for people (the CLI), quoted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from daemon.outbox import escalation_text
from replay.events import EscalationRaised
from replay.state import Operation
from replay.story import PROVIDER_LONG_TEXT_LIMIT, PROVIDER_TEXT_LIMIT, bounded

__all__ = [
    "PROVIDER_LONG_TEXT_LIMIT",
    "PROVIDER_TEXT_LIMIT",
    "bounded",
    "escalation_parts",
    "inline",
    "placeholder",
    "provider_error",
    "provider_results",
]


_FIELD = re.compile(r"⟨(provider_[a-z_]+)⟩")
_PLAIN = re.compile(r"[\w.:/@+%=&~?…-]{1,200}")


def placeholder(field: str) -> str:
    """How bide's text names the value of the ``provider_*`` field ``field``."""
    return f"⟨{field}⟩"


def provider_results(results: Mapping[str, str]) -> dict[str, str]:
    return {name: bounded(value, PROVIDER_LONG_TEXT_LIMIT) for name, value in results.items()}


def provider_error(error: str | None) -> str | None:
    return None if error is None else bounded(error, PROVIDER_LONG_TEXT_LIMIT)


def _unquoted(text: str, value: str | None, field: str) -> str:
    """``text`` with the provider's ``value``, as bide's recorded messages quote it
    (``repr``), replaced by the placeholder of ``field``."""
    return text.replace(repr(value), placeholder(field)) if value else text


def escalation_parts(raised: EscalationRaised, op: Operation) -> tuple[str, str]:
    """An escalation's ``detail`` and ``text`` for the API: bide's words, with the provider's
    (last state, request id, job id, error) as placeholders of the view's ``provider_*``
    fields."""
    c = raised.context
    detail = _unquoted(
        _unquoted(c.detail, c.last_state, "provider_state"), c.provider_job_id, "provider_job_id"
    )
    context = msgspec.structs.replace(
        c,
        detail=detail,
        provider_job_id=placeholder("provider_job_id"),
        last_state=None if c.last_state is None else placeholder("provider_state"),
        last_provider_request_id=(
            None if c.last_provider_request_id is None else placeholder("provider_request_id")
        ),
    )
    shown = msgspec.structs.replace(
        op, provider_error=None if op.provider_error is None else placeholder("provider_error")
    )
    text = escalation_text(msgspec.structs.replace(raised, context=context), shown)
    return detail, text


def inline(text: str, view: Mapping[str, object]) -> str:
    """``text`` with each placeholder replaced by the value of the ``view``'s field, quoted
    unless it is one plain word; an error keeps its quoted-block shape."""

    def value(m: re.Match[str]) -> str:
        said = view.get(m.group(1))
        if not isinstance(said, str):
            return m.group(0)
        if m.group(1) == "provider_error":
            return said.replace("\n", "\n    | ")
        return said if _PLAIN.fullmatch(said) else repr(said)

    return _FIELD.sub(value, text)
