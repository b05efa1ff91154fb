"""Every operation's and action's state, folded from the log event by event, and its snapshot.

The daemon folds the whole log into a :class:`Ledger` at start and then keeps folding what it
appends; the ledger also remembers facts whose decision is not in the log yet (a crash
between the two appends), so a restart decides them.

A snapshot is the ledger encoded as bytes (MessagePack). Operations share their contract
object in memory, so the snapshot stores each contract once, by digest, and every operation
as a row naming its digest: 100,000 operations under one contract cost one contract. Loading
a snapshot and then folding the events after it gives the ledger a full fold gives.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from replay.actions import Action, evolve_action
from replay.contract import Contract
from replay.errors import NewerSchemaError, ReplayError
from replay.events import (
    ActionDecided,
    ActionFailed,
    ActionIntended,
    ActionSucceeded,
    LogEvent,
    NodeTookOver,
    OperationRegistered,
    RequestOutcomeUnknown,
    StatusResponseReceived,
    TransportFailed,
    decode_log_event,
    encode_event,
)
from replay.state import Operation, compact, evolve

__all__ = ["Fact", "Ledger", "SnapshotFormatError"]

Fact = StatusResponseReceived | TransportFailed | RequestOutcomeUnknown
_FACTS = (StatusResponseReceived, TransportFailed, RequestOutcomeUnknown)
_ACTION_EVENTS = (ActionIntended, ActionSucceeded, ActionFailed, ActionDecided)
_FORMAT = 1


class SnapshotFormatError(ValueError):
    """Snapshot bytes this version cannot load (another format, or not a ledger at all)."""


def _row_type() -> type[msgspec.Struct]:
    """``Operation`` with its contract replaced by the contract's digest. Mutable: loading
    puts the shared contract object in its place, then converts the row (in C)."""
    fields: list[tuple[str, object] | tuple[str, object, object]] = []
    for f in msgspec.structs.fields(Operation):
        typ = object if f.name == "contract" else f.type
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, typ, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, typ, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, typ))
    return msgspec.defstruct("OperationRow", fields, kw_only=True, array_like=True)


_Row = _row_type()
_CONTRACT_AT = [f.name for f in msgspec.structs.fields(Operation)].index("contract")


class _Body(msgspec.Struct, frozen=True, array_like=True):
    format: int
    model: str
    events: int
    contracts: dict[str, Contract]
    ops: list[_Row]  # type: ignore[valid-type]
    actions: list[Action]
    undecided: list[bytes]  # encoded facts


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Body)


class Ledger:
    """Operations by id, actions by id, undecided facts by operation id, shared contracts."""

    def __init__(self) -> None:
        self.ops: dict[str, Operation] = {}
        self.actions: dict[str, Action] = {}
        self.undecided: dict[str, Fact] = {}
        self.contracts: dict[str, Contract] = {}  # one shared object per contract digest
        self.events = 0

    def apply(self, ev: LogEvent) -> Operation | None:
        """Fold one event in; the operation's new state (None for an action's event).
        An event that cannot follow the state (:class:`ReplayOrderError`) changes nothing."""
        if isinstance(ev, _ACTION_EVENTS):
            self.actions[ev.action_id] = evolve_action(self.actions.get(ev.action_id), ev)
            self.events += 1
            return None
        op = evolve(self.ops.get(ev.operation_id), ev)
        self.events += 1
        if isinstance(ev, OperationRegistered):
            op = self._share_contract(op)
        self.ops[ev.operation_id] = op
        if isinstance(ev, _FACTS):
            self.undecided[ev.operation_id] = ev
        elif not isinstance(ev, NodeTookOver):
            # A takeover is recorded before the new node decides what a crash left undecided.
            self.undecided.pop(ev.operation_id, None)
        return op

    def fold(
        self, payloads: Iterable[tuple[int, bytes]], skipped: list[tuple[int, str]] | None = None
    ) -> None:
        """Decode and apply stored events (seq, payload) in order: how a start-up replays the
        log. (The daemon pauses the garbage collector around it, ``daemon.gc_tuning``: a
        process-wide switch is not the pure model's to touch.)

        An event that does not decode (a damaged or foreign payload) or cannot follow its
        operation's state (a later event of an operation whose registration was
        crypto-shredded) raises; given ``skipped``, it is listed there as (seq, why) and left
        out, and the other operations fold on. An event of a newer bide always raises:
        folding around it would act on a state that bide does not know.
        """
        apply = self.apply
        for seq, payload in payloads:
            try:
                ev = decode_log_event(payload)
                op = apply(ev)
                if isinstance(ev, OperationRegistered) and op is not None:
                    # Where the registration landed: a receipt names it.
                    self.ops[ev.operation_id] = msgspec.structs.replace(op, registered_seq=seq)
            except NewerSchemaError:
                raise
            except ReplayError as exc:
                if skipped is None:
                    raise
                skipped.append((seq, str(exc)))

    def _share_contract(self, op: Operation) -> Operation:
        """A contract is about 1.4 KB of Python objects; 100,000 operations often have a
        handful of them, so every operation under one digest shares one object."""
        shared = self.contracts.setdefault(op.contract_digest, op.contract)
        return op if shared is op.contract else msgspec.structs.replace(op, contract=shared)

    def copy(self) -> Ledger:
        """A copy to encode elsewhere while this one goes on changing (the states themselves
        are immutable, so copying the dictionaries is enough)."""
        other = Ledger()
        other.ops, other.actions = dict(self.ops), dict(self.actions)
        other.undecided, other.contracts = dict(self.undecided), dict(self.contracts)
        other.events = self.events
        return other

    def dump(self, model: str = "") -> bytes:
        """The ledger as snapshot bytes. ``model`` names the code that folded it (the daemon
        passes a digest of ``replay``'s sources): a snapshot loads only under the same one,
        because another version of ``evolve`` could fold the same events differently."""
        rows = []
        for op in self.ops.values():
            values = msgspec.structs.astuple(op)
            rows.append((*values[:_CONTRACT_AT], op.contract_digest, *values[_CONTRACT_AT + 1 :]))
        contracts = {op.contract_digest: op.contract for op in self.ops.values()}
        undecided = [encode_event(fact) for fact in self.undecided.values()]
        body = (
            _FORMAT,
            model,
            self.events,
            contracts,
            rows,
            list(self.actions.values()),
            undecided,
        )
        return _encoder.encode(body)

    @classmethod
    def load(cls, data: bytes, model: str = "") -> Ledger:
        """A ledger from snapshot bytes; :class:`SnapshotFormatError` if they are not one, or
        if they were made by another version of the model (``model``, see :meth:`dump`)."""
        try:
            return cls._load(data, model)
        except SnapshotFormatError:
            raise
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            ReplayError,
            ValueError,
            TypeError,
        ) as exc:
            raise SnapshotFormatError(f"not a ledger snapshot this version reads ({exc})") from None

    @classmethod
    def _load(cls, data: bytes, model: str) -> Ledger:
        body = _decoder.decode(data)
        if body.model != model:
            raise SnapshotFormatError(
                "the snapshot was made by another version of the model (what it holds "
                "could differ from a replay by this one)"
            )
        if body.format != _FORMAT:
            raise SnapshotFormatError(
                f"ledger snapshot format {body.format}, this version reads {_FORMAT}"
            )
        ledger = cls()
        ledger.events = body.events
        ledger.contracts = contracts = body.contracts
        ops = ledger.ops
        rows: list[msgspec.Struct] = body.ops
        for row in rows:
            try:
                row.contract = contracts[row.contract]  # type: ignore[attr-defined]
            except (KeyError, TypeError):
                raise SnapshotFormatError(
                    "an operation names a contract the snapshot does not hold"
                ) from None
            op = compact(msgspec.convert(row, Operation, from_attributes=True))
            ops[op.operation_id] = op
        ledger.actions = {a.action_id: a for a in body.actions}
        for raw in body.undecided:
            fact = decode_log_event(raw)
            if not isinstance(fact, _FACTS):
                raise SnapshotFormatError(f"an undecided fact is a {type(fact).__name__}")
            ledger.undecided[fact.operation_id] = fact
        return ledger
