"""The policy gate: the hook that decides each tool call of one run, from the run's state.

The engine says what policy makes of a call; the gate adds what people said about it (an
approval, still valid now, lifts require_approval; a denial or an expiry refuses) and, when a
person must be asked, the interrupt to raise with its frozen action and its deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from contextos.policy.approvals import check_approval, freeze
from contextos.policy.authority import Authority
from contextos.policy.engine import CallHistory
from contextos.policy.expiry import expired_decision
from contextos.policy.hook import ProposedCall
from contextos.policy.identity import RunContext
from contextos.records.decisions import Check, Decision, PolicyDecision
from contextos.records.interrupts import InterruptKind
from contextos.state import RunState

Validated = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]
"""A recorded call's arguments as its tool validates them: (tool name, arguments) -> arguments
(the tool gateway's `validated`)."""


class Gate:
    """The policy hook of one run's gateway: decides each proposed call from the run's state.

    The state is the driver's own, folded up to the last event it committed: whatever the gate
    relies on is already in it, and anything another process appended meanwhile (a revocation)
    makes the driver's next append fail at the fence, so it is read on the next resume.
    """

    def __init__(self, authority: Authority, state: RunState, validated: Validated) -> None:
        self.authority = authority
        self.state = state
        self.validated = validated
        self.context = RunContext.of_run(state.context)
        """The authority the run acts under (bound at its start, with its first event)."""
        self._done = CallHistory()

    def counts(self, tool: str) -> bool:
        """Whether a limit of the policy counts calls to `tool` (each decision then depends on
        the calls decided before it, so such calls are decided and run one at a time)."""
        return any(lim.covers(tool) for lim in self.authority.policy.limits)

    def _history(self) -> CallHistory:
        """What already succeeded, each call's arguments as its tool validated them (as the
        call being decided has them), so limits and the repeat guard compare like with like."""
        done = self._done
        for call_id in self.state.succeeded[len(done) :]:
            call = self.state.tool_call(call_id)
            name, raw = (call.name, _arguments(call.arguments)) if call else ("", {})
            done.add(name, self.validated(name, raw))
        return done

    async def evaluate(self, call: ProposedCall) -> PolicyDecision:
        a = self.authority
        state = self.state
        context = self.context
        bound = state.context.snapshot_hash if state.context is not None else ""
        if a.implicit and bound and bound != a.policy.snapshot_hash:
            # Fail closed: deciding under "no policy" would silently widen the run's authority.
            return PolicyDecision(
                decision=Decision.DENY,
                rule_ids=("policy:missing",),
                reasons=(
                    f"the run is bound to policy snapshot {bound[:12]}, and this "
                    "runtime has no policy; give it the run's policy (CONTEXTOS_POLICY)",
                ),
                absolute=True,
            )
        decision = a.engine.evaluate(call, context, history=self._history())
        action = freeze(call, a.policy, context)
        decision = replace(decision, action_hash=action.hash)
        if call.asks is not None and decision.allowed:
            return a.with_deadline(_ask_person(decision, call, call.asks, state), call)
        exception = (
            decision.decision is Decision.DENY
            and not decision.absolute
            and decision.exception_role is not None
        )
        if decision.decision is not Decision.REQUIRE_APPROVAL and not exception:
            return decision
        kind = (
            InterruptKind.POLICY_EXCEPTION_REQUESTED
            if exception
            else InterruptKind.APPROVAL_REQUIRED
        )
        latest = state.latest_interrupt(call.call_id)
        stale: list[str] = []
        if latest is not None and latest.status == "expired":
            return expired_decision(decision, latest)
        if latest is not None and latest.status == "denied":
            who = latest.denied_by or "an approver"
            why = f": {latest.deny_reason}" if latest.deny_reason else ""
            return replace(
                decision,
                decision=Decision.DENY,
                rule_ids=(*decision.rule_ids, f"denied:{latest.id}"),
                reasons=(f"{who} denied this action{why}",),
                exception_role=None,
                checks=(
                    *decision.checks,
                    Check(layer="approval", decision=Decision.DENY, rule_id=latest.id),
                ),
            )
        if latest is not None and latest.status == "approved" and latest.approval is not None:
            approval = latest.approval
            roles = await a.directory.roles_of(approval.approver, tenant=context.tenant)
            problems = check_approval(
                approval,
                action_hash=action.hash,
                arguments=call.arguments,
                now=a.clock(),
                approver_roles=roles,
                required_roles=decision.approver_roles,
                run_principal=context.principal.id,
                allow_self_approval=a.policy.allow_self_approval,
            )
            if not problems:
                return replace(
                    decision,
                    decision=Decision.CONSTRAIN if decision.constraints else Decision.ALLOW,
                    rule_ids=(*decision.rule_ids, f"approval:{approval.id}"),
                    reasons=(
                        *decision.reasons,
                        f"approved by {approval.approver} until {approval.expires_at.isoformat()}",
                    ),
                    approval_id=approval.id,
                    checks=(
                        *decision.checks,
                        Check(
                            layer="approval",
                            decision=Decision.ALLOW,
                            rule_id=approval.id,
                            reason=f"approved by {approval.approver}",
                        ),
                    ),
                )
            stale = [p.reason for p in problems]
        asked = replace(
            decision,
            decision=Decision.REQUIRE_APPROVAL,
            reasons=(*decision.reasons, *stale),
            interrupt_kind=kind.value,
            interrupt_payload={
                "action": action.to_dict(),
                "approver_roles": list(decision.approver_roles),
                "rule_ids": list(decision.rule_ids),
                "reasons": [*decision.reasons, *stale],
                "snapshot_hash": decision.snapshot_hash,
                "replaces": latest.id if latest is not None else None,
            },
        )
        return a.with_deadline(asked, call)


def _ask_person(
    decision: PolicyDecision, call: ProposedCall, asks: InterruptKind, state: RunState
) -> PolicyDecision:
    """A call that asks a person: raise its interrupt, or let it complete once answered."""
    latest = state.latest_interrupt(call.call_id)
    if latest is not None and latest.status == "expired":
        return expired_decision(decision, latest)
    if latest is not None and latest.status == "answered":
        who = latest.answered_by or "a person"
        return replace(
            decision,
            rule_ids=(*decision.rule_ids, f"answered:{latest.id}"),
            reasons=(*decision.reasons, f"answered by {who}"),
            checks=(
                *decision.checks,
                Check(layer="person", decision=Decision.ALLOW, rule_id=latest.id, reason=who),
            ),
        )
    options = call.arguments.get("options") or None
    kind = InterruptKind.CHOICE_REQUIRED if options else asks
    question = call.arguments.get("question") or call.arguments.get("summary") or ""
    return replace(
        decision,
        decision=Decision.REQUIRE_APPROVAL,
        rule_ids=(*decision.rule_ids, "ask:person"),
        reasons=(*decision.reasons, f"{call.tool} asks a person"),
        interrupt_kind=kind.value,
        interrupt_payload={
            "question": str(question),
            "options": list(options) if options else None,
            "tool": call.tool,
            "replaces": latest.id if latest is not None else None,
        },
    )


def _arguments(text: str) -> dict[str, Any]:
    """A recorded call's arguments (the call succeeded, so they passed the gateway's limits)."""
    try:
        args = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return args if isinstance(args, dict) else {}
