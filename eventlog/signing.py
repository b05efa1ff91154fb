"""How a writer signs: the genesis record, every checkpoint, and the seal MAC key.

:class:`CheckpointSigning` is the one interface :class:`~eventlog.writer.LogWriter` calls; it
keeps the writer ignorant of key evolution. Two implementations:

    SingleKey       format 2: one signing key signs the genesis record and every checkpoint,
                    and the seal MAC key is derived from it (the original scheme; existing
                    logs keep being read and written this way)
    EpochSigning    format 3 (:mod:`eventlog.epochs`): the root key certifies the first epoch
                    key in the genesis record; each epoch key signs its epoch's checkpoints
                    and certifies the next one at the epoch boundary, then is destroyed

The protocol of a write: :meth:`checkpoint` may begin a key rotation (the checkpoint it
returns certifies the next key, and every later signature and seal in the same write uses
that key); :meth:`durable` is called once the write is on disk (the rotation is then final
and the old private key is destroyed); :meth:`abandoned` when it failed (the rotation is
forgotten; what the write left is cut, and :meth:`opened` reconciles on reopen).
"""

from __future__ import annotations

import base64
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from eventlog.envelope import (
    FORMAT_SINGLE_KEY,
    ZERO_HASH,
    Checkpoint,
    Genesis,
    Takeover,
    checkpoint_message,
    genesis_message,
    takeover_fields,
)
from eventlog.keys import Signer, VerifyKey
from eventlog.position import LogPosition

if TYPE_CHECKING:
    from eventlog.verify import Report


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


class CheckpointSigning(ABC):
    """What the writer asks of its signing keys (see the module docstring)."""

    #: The root public key (``verify.pub``): the writer verifies its log with it on open.
    verify_key: VerifyKey

    @property
    @abstractmethod
    def format(self) -> int:
        """The format version of a log this creates."""

    @property
    @abstractmethod
    def mac_key(self) -> bytes:
        """The seal MAC key for records written now (the rotation in progress included)."""

    @property
    def seals_checkable(self) -> bool:
        """Whether :attr:`mac_key` checks the seals of the log as opened (not so for a node
        taking over a log whose epoch key is on another host)."""
        return True

    @property
    def epoch(self) -> int:
        """The epoch whose key signs now (0: single-key mode)."""
        return 0

    @property
    def epoch_key(self) -> str:
        """Base64 of the public key of :attr:`epoch` ("" in single-key mode)."""
        return ""

    def stamp(self, position: LogPosition) -> LogPosition:
        """``position`` (the head) with what it must record of the epoch in force."""
        return msgspec.structs.replace(position, format=self.format)

    @abstractmethod
    def genesis(self, log_id: str, t_us: int, checkpoint_every: int) -> Genesis:
        """The signed genesis record of a new log."""

    @abstractmethod
    def opened(self, log_dir: Path, report: Report) -> None:
        """The writer verified its log (``report`` is intact): adopt the epoch it ends in."""

    @abstractmethod
    def checkpoint(
        self,
        log_id: str,
        seq: int,
        head: str,
        t_us: int,
        prev_cp: str,
        final: bool,
        *,
        may_rotate: bool = True,
        takeover: Takeover | None = None,
    ) -> Checkpoint:
        """A signed checkpoint; perhaps one that certifies the next epoch's key, or one that
        records a takeover."""

    def durable(self) -> None:  # noqa: B027 - nothing to do without key evolution
        """The write holding the checkpoints returned since the last call is durable."""

    def abandoned(self) -> None:  # noqa: B027
        """That write failed: forget any rotation it began."""


class SingleKey(CheckpointSigning):
    """Format 2: the one signing key signs everything (the key must stay on the host)."""

    def __init__(self, signer: Signer) -> None:
        self._signer = signer
        self.verify_key = VerifyKey(signer.private.public_key(), signer.public_bytes)

    @property
    def format(self) -> int:
        return FORMAT_SINGLE_KEY

    @property
    def mac_key(self) -> bytes:
        return self._signer.mac_key

    def genesis(self, log_id: str, t_us: int, checkpoint_every: int) -> Genesis:
        fp = self._signer.fingerprint
        signed = genesis_message(log_id, FORMAT_SINGLE_KEY, fp, t_us, checkpoint_every)
        return Genesis(
            0,
            ZERO_HASH,
            FORMAT_SINGLE_KEY,
            log_id,
            fp,
            t_us,
            checkpoint_every,
            b64(self._signer.sign(signed)),
        )

    def opened(self, log_dir: Path, report: Report) -> None:
        if report.format != FORMAT_SINGLE_KEY:
            from eventlog.errors import KeyFileError

            raise KeyFileError(
                f"log {log_dir} is format {report.format} (forward-secure checkpoints): its "
                f"checkpoints are signed by epoch keys kept in the state directory, not by "
                f"signing.key; open it with the epoch keys (`bide run` does)"
            )

    def checkpoint(
        self,
        log_id: str,
        seq: int,
        head: str,
        t_us: int,
        prev_cp: str,
        final: bool,
        *,
        may_rotate: bool = True,
        takeover: Takeover | None = None,
    ) -> Checkpoint:
        msg = checkpoint_message(log_id, seq, head, t_us, prev_cp, final, takeover)
        return Checkpoint(
            seq,
            head,
            log_id,
            t_us,
            prev_cp,
            final,
            b64(self._signer.sign(msg)),
            **takeover_fields(takeover),
        )
