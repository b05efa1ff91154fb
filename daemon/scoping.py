"""Operation ids are each registrant's own: two agents may both use ``nightly``.

The first registrant of an id gets it as it is; another principal who registers the same id
gets an operation recorded as ``ID~uUID`` (its uid), and is answered, shown and served under
``ID`` exactly as if it had been free: nothing tells an agent that another agent's id exists.
Agents address their operations by the id they chose; approvers and operators, who see
everyone's, see the recorded ids. Ids that hold ``~u`` and a digit are refused from callers,
so no one can take another principal's scoped name. Logs recorded before this hold no
scoped ids and replay as they did.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from replay.events import MAX_ID_LENGTH

#: What no caller's id may contain (a scoped id's marker).
RESERVED = re.compile(r"~u\d")
#: The longest id a caller may choose: room for the marker and any uid.
MAX_CHOSEN_LENGTH = MAX_ID_LENGTH - 12
#: The owner of an id that nothing holds (``None`` is an owner: an operation recorded
#: before registrants were).
FREE = -1


def marker(uid: int) -> str:
    return f"~u{uid}"


def scoped(op_id: str, uid: int) -> str:
    return f"{op_id}{marker(uid)}"


def refusal(op_id: str) -> str | None:
    """Why a caller may not choose ``op_id``, or None."""
    if RESERVED.search(op_id):
        return (
            f"operation id {op_id!r} holds '~u' and a digit, which bide keeps for its own "
            f"use; choose another"
        )
    if len(op_id) > MAX_CHOSEN_LENGTH:
        return f"operation id is {len(op_id)} characters; at most {MAX_CHOSEN_LENGTH}"
    return None


def recorded_id(op_id: str, uid: int, holder: Callable[[str], int | None]) -> str:
    """The id under which ``uid``'s operation ``op_id`` is (or is to be) recorded: ``op_id``
    when it is free or ``uid``'s own, else ``uid``'s scoped one. ``holder`` gives an id's
    registrant (:data:`FREE` when nothing holds it)."""
    owner = holder(op_id)
    if owner in (FREE, uid):
        return op_id
    return scoped(op_id, uid)


def shown(text: str, uid: int) -> str:
    """``text`` as ``uid`` sees it: its own scoped ids under the ids it chose."""
    return re.sub(re.escape(marker(uid)) + r"(?!\d)", "", text)
