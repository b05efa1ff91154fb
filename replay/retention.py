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
keeps, per retired operation, a 64-bit hash of its id, 32-bit hashes of its request digest
and of (provider, job id), its owner's uid and its outcome, in three flat arrays (open
addressing, linear probing): about 50 bytes a retired operation at the table's average load,
no Python object per entry, and bytes in the snapshot. The table holds at most
``tombstones_kept`` (recorded in each event); the oldest beyond are forgotten, and a retry
of a forgotten id registers anew. A different id whose 64-bit hash equals a kept one's
(about 1 in 10**13 for a million tombstones) would be taken for the retired one.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterator, Mapping
from typing import Final, Literal

import msgspec

from replay.actions import Action
from replay.events import OperationRetired
from replay.state import Operation

__all__ = [
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
_ACTION_DONE: Final = frozenset({"succeeded", "failed", "closed"})
_EMPTY: Final = 0
_MIN_CAPACITY: Final = 64
_HAS_OWNER: Final = 1 << 32
_CLOSED: Final = 1 << 33


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
    digest_hash: int  # 32 bits of the registering request's digest (0: none)
    job_hash: int  # 32 bits of (provider, job id)

    def same_request(self, digest: str, provider: str, job_id: str) -> bool:
        """Whether a registration is the retired one again: by the API request's
        ``digest`` when it has one, else by provider and job id (as for a live id)."""
        if digest:
            return self.digest_hash == _hash32(digest)
        return self.job_hash == _hash32(f"{provider}\0{job_id}")


def request_hashes(op: Operation) -> tuple[int, int]:
    """The (digest, job) hashes a tombstone keeps of ``op``."""
    digest = _hash32(op.request_digest) if op.request_digest else 0
    return digest, _hash32(f"{op.provider}\0{op.provider_job_id}")


def _hash32(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")


def _key(op_id: str) -> int:
    """A nonzero 64-bit hash of an operation id (0 marks an empty slot)."""
    h = int.from_bytes(hashlib.blake2b(op_id.encode(), digest_size=8).digest(), "little")
    return h or 1


class Tombstones:
    """Retired operations by id hash, in the order they retired; see the module docstring.

    ``_keys``, ``_values`` (digest hash | job hash << 32) and ``_meta`` (owner uid, whether
    there is one, outcome) are the slots of an open-addressing table; ``_order`` lists the
    keys in retirement order from ``_head``, so the oldest is forgotten first.
    """

    __slots__ = ("_head", "_keys", "_meta", "_order", "_values", "count")

    def __init__(self) -> None:
        self._keys = array("Q")
        self._values = array("Q")
        self._meta = array("Q")
        self._order = array("Q")
        self._head = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tombstones):
            return NotImplemented
        return list(self._entries()) == list(other._entries())

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> Tombstones:
        """An independent copy (to encode in another thread while this one changes)."""
        other = Tombstones()
        other._keys, other._values = array("Q", self._keys), array("Q", self._values)
        other._meta, other._order = array("Q", self._meta), self._order[self._head :]
        other.count = self.count
        return other

    def get(self, op_id: str) -> Tombstone | None:
        """The tombstone of ``op_id``; None when it was never retired (or was forgotten)."""
        if not self.count:
            return None
        key = _key(op_id)
        i = self._find(key)
        if self._keys[i] != key:
            return None
        meta, value = self._meta[i], self._values[i]
        return Tombstone(
            owner_uid=(meta & 0xFFFFFFFF) if meta & _HAS_OWNER else None,
            outcome="closed" if meta & _CLOSED else "succeeded",
            digest_hash=value & 0xFFFFFFFF,
            job_hash=value >> 32,
        )

    def add(self, op: Operation, keep: int) -> None:
        """Keep ``op``'s tombstone, then forget the oldest beyond ``keep``."""
        if keep <= 0:
            self._forget_beyond(0)
            return
        digest, job = request_hashes(op)
        uid = op.registered_by_uid
        meta = (uid & 0xFFFFFFFF | _HAS_OWNER if uid is not None else 0) | (
            _CLOSED if op.phase == "closed" else 0
        )
        self._put(_key(op.operation_id), digest | job << 32, meta)
        self._forget_beyond(keep)

    def _find(self, key: int) -> int:
        """The slot holding ``key``, or the empty slot where it would go."""
        keys = self._keys
        mask = len(keys) - 1
        i = key & mask
        while True:
            k = keys[i]
            if k in (key, _EMPTY):
                return i
            i = (i + 1) & mask

    def _put(self, key: int, value: int, meta: int) -> None:
        if (self.count + 1) * 4 > len(self._keys) * 3:
            self._resize(max(_MIN_CAPACITY, len(self._keys) * 2))
        i = self._find(key)
        if self._keys[i] == _EMPTY:
            self.count += 1
            self._order.append(key)
        self._keys[i], self._values[i], self._meta[i] = key, value, meta

    def _resize(self, capacity: int) -> None:
        old = list(zip(self._keys, self._values, self._meta, strict=True))
        self._keys = array("Q", bytes(8 * capacity))
        self._values = array("Q", bytes(8 * capacity))
        self._meta = array("Q", bytes(8 * capacity))
        for key, value, meta in old:
            if key != _EMPTY:
                i = self._find(key)
                self._keys[i], self._values[i], self._meta[i] = key, value, meta

    def _forget_beyond(self, keep: int) -> None:
        while self.count > keep:
            key = self._order[self._head]
            self._head += 1
            self._delete(key)
        if self._head > 4096 and self._head * 2 > len(self._order):
            del self._order[: self._head]
            self._head = 0

    def _delete(self, key: int) -> None:
        """Remove ``key``, shifting the entries after it back (no deletion markers)."""
        keys, values, meta = self._keys, self._values, self._meta
        mask = len(keys) - 1
        i = self._find(key)
        if keys[i] != key:
            return
        self.count -= 1
        j = i
        while True:
            keys[i] = _EMPTY
            while True:
                j = (j + 1) & mask
                k = keys[j]
                if k == _EMPTY:
                    return
                home = k & mask
                # Leave k where it is when its home lies cyclically in (i, j].
                if (i < j and i < home <= j) or (j < i and (home > i or home <= j)):
                    continue
                break
            keys[i], values[i], meta[i] = k, values[j], meta[j]
            i = j

    def _entries(self) -> Iterator[tuple[int, int, int]]:
        for key in self._order[self._head :]:
            i = self._find(key)
            if self._keys[i] == key:
                yield key, self._values[i], self._meta[i]

    def dump(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The table as bytes for a snapshot (little-endian whatever the host)."""
        parts = (self._keys, self._values, self._meta, self._order[self._head :])
        return tuple(_le_bytes(a) for a in parts)  # type: ignore[return-value]

    @classmethod
    def load(cls, parts: tuple[bytes, bytes, bytes, bytes]) -> Tombstones:
        """A table from :meth:`dump`'s bytes; ValueError when they are not one."""
        table = cls()
        keys, values, meta, order = (_from_le(b) for b in parts)
        capacity = len(keys)
        if capacity & (capacity - 1) or not len(values) == len(meta) == capacity:
            raise ValueError("the tombstone table's columns do not match")
        used = sum(1 for k in keys if k != _EMPTY)
        if used != len(order) or (capacity and used * 4 > capacity * 3):
            raise ValueError("the tombstone table's order does not match its entries")
        table._keys, table._values, table._meta, table._order = keys, values, meta, order
        table.count = used
        return table


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
        if any(actions[a].phase not in _ACTION_DONE for a in action_ids(op_id, actions)):
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
