"""``bide verify --witness``: an intact log judged against the heads its witnesses hold.

:func:`check_witnesses` asks each witness, keeps the heads that verify (a head that does not
is a lie, never evidence against the log) and judges the log by them; :class:`WitnessCheck`
is what it found, for the report: a ``witness`` object in ``--json`` whether the check
passed or not, one line of text, and the verdict it makes.

Findings, in the order they decide the verdict: ``rolled_back``, ``truncated``, ``forked``
(the log fails a witnessed head), ``witness_lied`` (a witness returned a head that does not
verify), ``no_heads`` (no witness holds a head of this log), ``consistent`` (the log holds
every head), ``not_checked`` (the log is damaged, empty, or signed by another key: there is
nothing to judge).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from daemon.witness.remote import Lie, Witnessed, believed, shown
from eventlog.headchain import genesis_line
from eventlog.heads import Finding, Head, judge
from eventlog.keys import VerifyKey
from eventlog.verify import Report


@dataclass(frozen=True)
class Asked:
    """One witness: the heads of this log it holds that verify, and the ones that do not."""

    source: str
    heads: list[Head]
    lies: list[Lie]


@dataclass
class WitnessCheck:
    log_id: str
    asked: list[Asked] = field(default_factory=list)
    checked: bool = False
    finding: Finding | None = None

    @property
    def lies(self) -> list[Lie]:
        return [lie for a in self.asked for lie in a.lies]

    @property
    def heads(self) -> list[Head]:
        return [h for a in self.asked for h in a.heads if h.log == self.log_id]

    @property
    def newest(self) -> Head | None:
        return max(self.heads, key=lambda h: h.seq, default=None)

    @property
    def outcome(self) -> str:
        if not self.checked:
            return "not_checked"
        if self.finding is not None:
            return self.finding.kind
        if self.lies:
            return "witness_lied"
        return "consistent" if self.heads else "no_heads"

    def verdict(self, report: Report) -> str:
        """The report's verdict, unless the log is otherwise intact and the witnesses found
        it rolled back, truncated or forked, or one of them lied."""
        if report.verdict != "intact" or self.outcome not in (
            "rolled_back",
            "truncated",
            "forked",
            "witness_lied",
        ):
            return report.verdict
        return self.outcome

    def to_json(self) -> dict[str, object]:
        newest = self.newest
        finding = self.finding
        return {
            "checked": self.checked,
            "finding": self.outcome,
            "what": (
                f"every head the witnesses hold for log {self.log_id} that verifies from "
                f"verify.pub must be in the log, at its sequence number with its hash"
            ),
            "witnesses": [
                {
                    "witness": shown(a.source),
                    "heads": len([h for h in a.heads if h.log == self.log_id]),
                    "newest_head": _head_json(
                        max(
                            (h for h in a.heads if h.log == self.log_id),
                            key=lambda h: h.seq,
                            default=None,
                        )
                    ),
                    "lied": len(a.lies),
                }
                for a in self.asked
            ],
            "newest_head": _head_json(newest),
            # What the log fails (rolled_back, truncated, forked); None when it fails none.
            "kind": finding.kind if finding is not None else None,
            "detail": finding.detail if finding is not None else None,
            "head": _head_json(finding.head) if finding is not None else None,
        }

    def line(self) -> str | None:
        """The text report's line for a check that passed (a failure has its own lines)."""
        if self.outcome != "consistent":
            return None
        newest = self.newest
        assert newest is not None
        count = len(self.asked)
        return (
            f"WITNESS consistent: the log holds every head {count} witness"
            f"{'es' if count != 1 else ''} hold for it (newest witnessed head "
            f"{newest.seq}:{newest.hash})"
        )


def _head_json(head: Head | None) -> dict[str, object] | None:
    if head is None:
        return None
    return {"seq": head.seq, "hash": head.hash, "epoch": head.epoch}


def check_witnesses(
    sources: list[str],
    ask: Callable[[str], Witnessed],
    log_dir: Path,
    report: Report,
    verify_key: VerifyKey,
    pinned: dict[str, bytes] | None,
    *,
    judged: bool,
) -> WitnessCheck:
    """Ask each of ``sources`` (through ``ask``) and judge the log by the heads that verify;
    with ``judged`` False (the log is damaged, or another key signed it), only record that
    it was not checked."""
    check = WitnessCheck(report.log_id)
    if not judged or report.damage is not None or report.head_seq < 0:
        return check
    genesis = genesis_line(log_dir) or ""
    for source in sources:
        good, lied = believed(ask(source), verify_key.raw, genesis, pinned)
        check.asked.append(Asked(source, good, lied))
    heads = [h for a in check.asked for h in a.heads]
    check.finding = judge(log_dir, report, heads, other_log_is_fork=False)
    check.checked = True
    if not check.heads and not check.lies:
        report.notes.append(
            f"the witness holds no head of log {report.log_id}: it was "
            f"never published there, or this log replaced the one that was"
        )
    return check
