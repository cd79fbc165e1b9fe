"""Approvals held against the action they name, and what a person is shown of an action.

An approval is checked at the moment its action would run, not when it was given: the hash
must still be the action's, it must not have expired or been revoked, the approver must still
hold the roles, and the arguments must still meet its conditions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from contextos.policy.hook import ProposedCall
from contextos.policy.identity import RunContext
from contextos.policy.rules import Policy, check_constraints, lookup
from contextos.records.interrupts import Approval, FrozenAction


def freeze(call: ProposedCall, policy: Policy, context: RunContext) -> FrozenAction:
    """The frozen action for a proposed call, with the policy's preview when it has one.

    Fields the tool's contract redacts are shown as `[redacted]` (in the preview too); the hash
    still covers their real values.
    """
    preview = blast = None
    for rule in policy.rules:
        if (rule.preview or rule.blast_radius) and rule.matches(call, context):
            preview = preview or rule.preview
            blast = blast or rule.blast_radius
    full = dict(call.arguments)
    shown = (
        {k: "[redacted]" if k in call.redact_fields else v for k, v in full.items()}
        if call.redact_fields
        else full
    )
    action = FrozenAction(
        run_id=call.run_id,
        call_id=call.call_id,
        tool=call.tool,
        arguments=full,
        contract_hash=call.contract_hash,
        effect=call.effect,
        risk=call.risk,
        preview=render_template(preview, shown) if preview else default_preview(call.tool, shown),
        blast_radius=(
            render_template(blast, shown)
            if blast
            else default_blast_radius(call.effect, call.risk, call.compensation)
        ),
    )
    if shown is full:
        return action
    return replace(action, arguments=shown, digest=action.hash)


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def render_template(template: str, arguments: Mapping[str, Any]) -> str:
    """`Refund {amount} on {order_id}` filled from the arguments; unknown fields stay as is.

    Only plain (dotted) names are substituted, never attribute access or format specs, so a
    template cannot reach into Python objects.
    """

    def fill(m: re.Match[str]) -> str:
        value = lookup(arguments, m.group(1))
        return m.group(0) if value is lookup({}, "x") else str(value)

    return _FIELD.sub(fill, template)


def default_preview(tool: str, arguments: Mapping[str, Any], *, limit: int = 200) -> str:
    args = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in arguments.items()
    )
    text = f"{tool}({args})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def default_blast_radius(effect: str, risk: str, compensation: str | None = None) -> str:
    what = {
        "read": "reads only",
        "write": "changes data outside the run",
        "reversible_write": "changes data outside the run; can be undone"
        + (f" by {compensation}" if compensation else ""),
        "irreversible": "irreversible: cannot be undone",
    }.get(effect, effect)
    return f"{what} (risk {risk})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """Why an approval does not hold."""

    code: Literal[
        "hash_mismatch", "expired", "revoked", "role_missing", "condition_failed", "self_approval"
    ]
    """Stable code."""
    reason: str
    """In words."""


def check_approval(
    approval: Approval,
    *,
    action_hash: str,
    arguments: Mapping[str, Any],
    now: datetime,
    approver_roles: frozenset[str],
    required_roles: Sequence[str],
    run_principal: str | None = None,
    allow_self_approval: bool = False,
) -> list[Problem]:
    """Everything wrong with an approval at the moment it would be used (empty: it holds).

    Whether policy still permits the action and whether the budget still has room are asked
    of the engine, which re-evaluates the call before an approval is even considered.
    """
    problems: list[Problem] = []
    if approval.action_hash != action_hash:
        problems.append(
            Problem(
                code="hash_mismatch",
                reason=f"approval {approval.id} is for action {approval.action_hash[:12]}, "
                f"not {action_hash[:12]}",
            )
        )
    if approval.revoked:
        by = f" by {approval.revoked_by}" if approval.revoked_by else ""
        problems.append(Problem(code="revoked", reason=f"approval {approval.id} was revoked{by}"))
    if now >= approval.expires_at:
        problems.append(
            Problem(
                code="expired",
                reason=f"approval {approval.id} expired at {approval.expires_at.isoformat()}",
            )
        )
    missing = [r for r in required_roles if r not in approver_roles]
    if missing:
        problems.append(
            Problem(
                code="role_missing",
                reason=f"{approval.approver} does not (or no longer) hold role "
                f"{', '.join(missing)}",
            )
        )
    if not allow_self_approval and run_principal is not None and approval.approver == run_principal:
        problems.append(
            Problem(
                code="self_approval",
                reason=f"{approval.approver} cannot approve an action of their own run",
            )
        )
    broken = check_constraints(approval.conditions, arguments)
    if broken:
        problems.append(
            Problem(
                code="condition_failed",
                reason=f"approval {approval.id} conditions not met: " + "; ".join(broken),
            )
        )
    return problems
