"""``bide escalations``: open escalations and the options each offers."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from daemon.actions import action_escalation_text
from daemon.api.provider_text import inline
from daemon.commands.apicall import require
from daemon.config import Config, add_config_flag, load_config
from daemon.outbox import escalation_text
from daemon.readers import load_ledger, open_keyring
from replay.events import ActionFailed, EscalationRaised


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "escalations",
        help="open escalations awaiting a decision (read-only)",
        description="List every escalation awaiting a human decision, with its "
        "reason, context and numbered options: your own (agents), or everyone's "
        "(approvers, operators). --offline reads the log with its data key.",
        epilog="examples:\n  bide escalations\n  bide escalations --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--offline",
        action="store_true",
        help="read the log directly with its data key (operators, forensics); "
        "without it the running daemon answers, and no key is needed",
    )
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.offline:
        return run_offline(cfg, args)
    with require(cfg, "escalations") as client:
        listed = client.call("GET", "/v1/escalations")["escalations"]
    if args.json:
        print(json.dumps(listed))
    elif not listed:
        print("no open escalations")
    else:
        print("\n".join(_text(e) for e in listed), end="")
    return 0


def _text(escalation: dict[str, Any]) -> str:
    if escalation.get("text"):
        return inline(str(escalation["text"]), escalation)  # the provider's words, quoted
    lines = [
        f"bide escalation {escalation['operation_id']} #{escalation['escalation_id']}: "
        f"{escalation['reason']}",
        "  options:",
    ]
    lines += [f"    {o['number']}. {o['id']}: {o['label']}" for o in escalation["options"]]
    lines.append(f"  decide with: {escalation['decide_command']}")
    return "\n".join(lines) + "\n"


def run_offline(cfg: Config, args: argparse.Namespace) -> int:
    """From the state snapshot and the events after it (the whole log without one): every
    open escalation keeps what it was raised with in the operation's state."""
    ledger = load_ledger(cfg, open_keyring(cfg))
    open_ = [
        EscalationRaised(
            operation_id=op.operation_id,
            at=e.raised_at,
            escalation_id=e.escalation_id,
            reason=e.reason,
            options=e.options,
            context=e.context,
        )
        for op in ledger.ops.values()
        if op.phase == "escalated" and (e := op.escalation) is not None and e.context is not None
    ]
    open_.sort(key=lambda e: e.at)
    escalated = [
        a
        for a in ledger.actions.values()
        if a.phase == "escalated" and isinstance(a.outcome, ActionFailed)
    ]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        **msgspec.to_builtins(ev),
                        "provider_error": ledger.ops[ev.operation_id].provider_error,
                        "provider_error_truncated": ledger.ops[
                            ev.operation_id
                        ].provider_error_truncated,
                    }
                    for ev in open_
                ]
                + [
                    {
                        "action_id": a.action_id,
                        "operation_id": a.operation_id,
                        "kind": a.kind,
                        "reason": a.outcome.reason,
                        "detail": a.outcome.detail,
                        "options": msgspec.to_builtins(a.outcome.options),
                    }
                    for a in escalated
                    if isinstance(a.outcome, ActionFailed)
                ]
            )
        )
    elif not open_ and not escalated:
        print("no open escalations")
    else:
        texts = [escalation_text(ev, ledger.ops[ev.operation_id]) for ev in open_]
        texts += [
            action_escalation_text(a, a.outcome)
            for a in escalated
            if isinstance(a.outcome, ActionFailed)
        ]
        print("\n".join(texts), end="")
    return 0
