"""Retention: which ended operations leave memory, and what is kept of them (tombstones).

Rules:

* Only an **ended** operation retires: ``succeeded`` or ``closed``, with none of its actions
  (submit, fetch, cancel) still in flight or awaiting a decision. A live or escalated one
  never does, whatever its age.
* An ended operation retires when it ended at least ``ended_after`` seconds before ``now``
  (``why="age"``), or when more than ``max_ended`` ended operations are kept: the oldest
  ended beyond that count (``why="count"``).
* The decision is an event, :class:`~replay.events.OperationRetired`, recorded before the
  daemon forgets anything; folding it removes the operation (and its actions) from the
  ledger and leaves a tombstone. The policy's numbers are configuration, which may change
  between runs, so a replay follows the recorded events, never the rule: an old log
  replays to the same state under any configuration.

Theory of operation: the ledger keeps its ended operations in the order they ended
(``Ledger.ended``, id -> when), so :func:`due` looks only at the oldest few: the cost of a
pass is the number it retires, not the number kept.

Tombstones. A retired id must still answer a retry consistently: the same request is told
the operation ended and was retired (and where its story is), another request is refused as
a conflict, another principal is scoped apart as for a live id. A :class:`Tombstones` table
keeps, per retired operation, a 64-bit hash of its id and 64 bits holding its owner's uid,
its outcome and 15-bit hashes of its request digest and of (provider, job id), in flat
arrays (open addressing): 16 bytes a slot, 21-43 bytes a retired operation by the table's
load, no Python object per entry, and the same bytes in the snapshot. The bound
``tombstones_kept`` (recorded in each event) is kept by two generations: when the newer
holds half the bound, the older is forgotten whole, and a retry of a forgotten id registers
anew. Collisions: a different id whose 64-bit hash equals a kept one's (about 1 in 10**13
for a million tombstones) would be taken for the retired one; a different request under a
retired id by its own owner is told "gone" instead of "conflict" once in 32,768 (either
way it is refused).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from replay.actions import Action
from replay.events import OperationRetired
from replay.state import Operation

__all__ = [
    "ACTION_DONE_PHASES",
    "ENDED_PHASES",
    "RetentionPolicy",
    "Tombstone",
    "Tombstones",
    "action_ids",
    "due",
    "request_hashes",
]

#: The phases an operation ends in (escalated waits for a person: not ended).
ENDED_PHASES: Final = frozenset({"succeeded", "closed"})
#: The phases an action is over in (in flight and escalated are not).
ACTION_DONE_PHASES: Final = frozenset({"succeeded", "failed", "closed"})
_EMPTY: Final = 0
_MIN_CAPACITY: Final = 64
_HASH_MASK: Final = (1 << 15) - 1
_CLOSED: Final = 1 << 30
_HAS_OWNER: Final = 1 << 31


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The numbers of ``[retention]``.

    Attributes:
        ended_after: Seconds an ended operation is kept after it ended.
        max_ended: Ended operations kept at most (the oldest beyond retire first).
        max_tombstones: Tombstones kept at most (the oldest beyond are forgotten).
        batch: Retirements decided in one pass at most (one durable append).
    """

    ended_after: float
    max_ended: int
    max_tombstones: int
    batch: int = 1000


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    """What is kept of a retired operation: enough to answer a retry of its id."""

    owner_uid: int | None
    outcome: Literal["succeeded", "closed"]
    digest_hash: int  # 15 bits of the registering request's digest (0: none)
    job_hash: int  # 15 bits of (provider, job id)

    def same_request(self, digest: str, provider: str, job_id: str) -> bool:
        """Whether a registration is the retired one again: by the API request's
        ``digest`` when it has one, else by provider and job id (as for a live id)."""
        if digest:
            return self.digest_hash == _hash15(digest)
        return self.job_hash == _hash15(f"{provider}\0{job_id}")


def request_hashes(op: Operation) -> tuple[int, int]:
    """The (digest, job) hashes a tombstone keeps of ``op``."""
    digest = _hash15(op.request_digest) if op.request_digest else 0
    return digest, _hash15(f"{op.provider}\0{op.provider_job_id}")


def _hash15(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=2).digest()
    return int.from_bytes(digest, "little") & _HASH_MASK


def _key(op_id: str) -> int:
    """A nonzero 64-bit hash of an operation id (0 marks an empty slot)."""
    h = int.from_bytes(hashlib.blake2b(op_id.encode(), digest_size=8).digest(), "little")
    return h or 1


def _pack(op: Operation) -> int:
    """A tombstone in 64 bits: owner uid (32), whether there is one, closed or succeeded,
    and the two 15-bit request hashes."""
    digest, job = request_hashes(op)
    uid = op.registered_by_uid
    value = digest | job << 15
    if op.phase == "closed":
        value |= _CLOSED
    if uid is not None:
        value |= _HAS_OWNER | (uid & 0xFFFFFFFF) << 32
    return value


def _unpack(value: int) -> Tombstone:
    return Tombstone(
        owner_uid=(value >> 32) if value & _HAS_OWNER else None,
        outcome="closed" if value & _CLOSED else "succeeded",
        digest_hash=value & _HASH_MASK,
        job_hash=(value >> 15) & _HASH_MASK,
    )


class _Table:
    """An open-addressing table (linear probing) of 64-bit keys to 64-bit values in two flat
    arrays: 16 bytes a slot, at most three quarters full. Nothing is ever deleted from one
    (a whole generation is dropped instead), so no deletion marker is needed."""

    __slots__ = ("count", "keys", "values")

    def __init__(self, keys: array[int] | None = None, values: array[int] | None = None) -> None:
        self.keys = keys if keys is not None else array("Q")
        self.values = values if values is not None else array("Q")
        self.count = len(self.keys) - self.keys.count(_EMPTY)

    def _slot(self, key: int) -> int:
        keys = self.keys
        mask = len(keys) - 1
        i = key & mask
        while (k := keys[i]) != key and k != _EMPTY:
            i = (i + 1) & mask
        return i

    def get(self, key: int) -> int | None:
        if not self.count:
            return None
        i = self._slot(key)
        return self.values[i] if self.keys[i] == key else None

    def put(self, key: int, value: int) -> None:
        if (self.count + 1) * 4 > len(self.keys) * 3:
            self._resize(max(_MIN_CAPACITY, len(self.keys) * 2))
        i = self._slot(key)
        if self.keys[i] == _EMPTY:
            self.count += 1
        self.keys[i], self.values[i] = key, value

    def _resize(self, capacity: int) -> None:
        old = [(k, v) for k, v in zip(self.keys, self.values, strict=True) if k != _EMPTY]
        self.keys = array("Q", bytes(8 * capacity))
        self.values = array("Q", bytes(8 * capacity))
        for key, value in old:
            i = self._slot(key)
            self.keys[i], self.values[i] = key, value

    def items(self) -> list[tuple[int, int]]:
        return sorted((k, v) for k, v in zip(self.keys, self.values, strict=True) if k != _EMPTY)

    def copy(self) -> _Table:
        return _Table(array("Q", self.keys), array("Q", self.values))


class Tombstones:
    """Retired operations by id hash; see the module docstring.

    Two generations: tombstones go into the newer; once it holds half the bound
    (``tombstones_kept``, recorded in each retirement) it becomes the older and the older
    one is forgotten whole. So between half the bound and the bound of the most recent
    tombstones are kept, at 16 bytes a slot and no per-entry order to keep.
    """

    __slots__ = ("_new", "_old")

    def __init__(self) -> None:
        self._old = _Table()
        self._new = _Table()

    def __len__(self) -> int:
        return self._old.count + self._new.count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tombstones):
            return NotImplemented
        return (self._old.items(), self._new.items()) == (other._old.items(), other._new.items())

    __hash__ = None  # type: ignore[assignment]

    def get(self, op_id: str) -> Tombstone | None:
        """The tombstone of ``op_id``; None when it was never retired (or was forgotten)."""
        key = _key(op_id)
        value = self._new.get(key)
        if value is None:
            value = self._old.get(key)
        return None if value is None else _unpack(value)

    def add(self, op: Operation, keep: int) -> None:
        """Keep ``op``'s tombstone under the bound ``keep`` (see the class docstring)."""
        if keep <= 0:
            self._old, self._new = _Table(), _Table()
            return
        self._new.put(_key(op.operation_id), _pack(op))
        if self._new.count >= (keep + 1) // 2:
            self._old, self._new = self._new, _Table()
        if len(self) > keep:  # the bound was lowered: what is beyond it goes at once
            self._old = _Table()

    def copy(self) -> Tombstones:
        """An independent copy (to encode in another thread while this one changes)."""
        other = Tombstones()
        other._old, other._new = self._old.copy(), self._new.copy()
        return other

    def dump(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The two tables as bytes for a snapshot (little-endian whatever the host)."""
        return (
            _le_bytes(self._old.keys),
            _le_bytes(self._old.values),
            _le_bytes(self._new.keys),
            _le_bytes(self._new.values),
        )

    @classmethod
    def load(cls, parts: tuple[bytes, bytes, bytes, bytes]) -> Tombstones:
        """The tables from :meth:`dump`'s bytes; ValueError when they are not such tables."""
        tables = []
        for keys, values in ((parts[0], parts[1]), (parts[2], parts[3])):
            table = _Table(_from_le(keys), _from_le(values))
            capacity = len(table.keys)
            if capacity & (capacity - 1) or len(table.values) != capacity:
                raise ValueError("a tombstone table's columns do not match")
            if capacity and table.count * 4 > capacity * 3:
                raise ValueError("a tombstone table is fuller than it can be")
            tables.append(table)
        stones = cls()
        stones._old, stones._new = tables
        return stones


def _le_bytes(a: array[int]) -> bytes:
    if sys.byteorder == "little":
        return a.tobytes()
    b = array("Q", a)
    b.byteswap()
    return b.tobytes()


def _from_le(data: bytes) -> array[int]:
    a = array("Q")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def action_ids(op_id: str, actions: Mapping[str, Action]) -> list[str]:
    """The ids of ``op_id``'s recorded actions (a submit; fetches and cancels, numbered
    from 1 without gaps)."""
    found = [f"{op_id}.submit"] if f"{op_id}.submit" in actions else []
    for kind in ("fetch", "cancel"):
        n = 1
        while f"{op_id}.{kind}.{n}" in actions:
            found.append(f"{op_id}.{kind}.{n}")
            n += 1
    return found


def due(
    ended: Mapping[str, float],
    ops: Mapping[str, Operation],
    actions: Mapping[str, Action],
    now: float,
    policy: RetentionPolicy,
) -> list[OperationRetired]:
    """The retirements due at ``now``: the oldest ended operations past the age or beyond
    the count, at most ``policy.batch`` of them, oldest first. ``ended`` is the ledger's
    (ended operations in the order they ended)."""
    out: list[OperationRetired] = []
    over = len(ended) - policy.max_ended
    cutoff = now - policy.ended_after
    for position, (op_id, ended_at) in enumerate(ended.items()):
        if len(out) >= policy.batch:
            break
        why: Literal["age", "count"]
        if position < over:
            why = "count"
        elif ended_at <= cutoff:
            why = "age"
        else:
            break  # ended in order: none after this one is due
        op = ops.get(op_id)
        if op is None or op.phase not in ENDED_PHASES:
            continue
        if any(actions[a].phase not in ACTION_DONE_PHASES for a in action_ids(op_id, actions)):
            continue  # a fetch or cancel still running: retire it on a later pass
        out.append(
            OperationRetired(
                operation_id=op_id,
                at=now,
                ended_at=ended_at,
                why=why,
                tombstones_kept=policy.max_tombstones,
            )
        )
    return out
