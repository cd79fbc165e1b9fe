"""Authority at run time: a runtime's policy, approver directory and clock; binding a run's
context; people approving, denying, answering and revoking.

Everything it relies on (the bound context, approvals, denials, revocations, what already ran)
is in the run's log and read through its folded state, so it survives restarts: a run resumed
in a new process is judged exactly as it would have been in the old one, under the policy,
roles and clock in force now. The gate that decides each tool call is `contextos.policy.gate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from contextos import events as ev
from contextos.causality import stamp
from contextos.errors import (
    AnswerTooLate,
    ApprovalRefused,
    ConcurrencyConflict,
    ConfigError,
    InterruptNotFound,
    RunIsTerminal,
    RunNotFound,
)
from contextos.events import utcnow
from contextos.numbers import seconds
from contextos.policy.engine import Engine
from contextos.policy.expiry import deadline_for, expire_overdue, overdue, what_happened
from contextos.policy.hook import ProposedCall
from contextos.policy.identity import Principal, RunContext
from contextos.policy.rules import Policy, check_constraints, constraints_problem
from contextos.records.deadlines import Expiry
from contextos.records.decisions import Decision, PolicyDecision
from contextos.records.interrupts import (
    Approval,
    Interrupt,
    InterruptKind,
    approval_id_for,
    fmt_roles,
    parse_answer,
    run_of_approval,
    run_of_interrupt,
)
from contextos.runs import RunId, RunStatus
from contextos.state import RunState, apply
from contextos.store.base import EventStore, load_state

POLICY_ENV = "CONTEXTOS_POLICY"
"""Path of the policy file a runtime loads when it is given none."""


@runtime_checkable
class Directory(Protocol):
    """Who holds which approver role, asked at approval time and again on resume."""

    async def roles_of(self, principal_id: str, *, tenant: str) -> frozenset[str]: ...


class PolicyDirectory:
    """Roles as the policy's `[roles]` table assigns them."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def roles_of(self, principal_id: str, *, tenant: str) -> frozenset[str]:
        return self.policy.roles_of(principal_id, tenant=tenant)


def _approver(who: str | Principal) -> tuple[str, Principal | None]:
    """An approver's id, and its authenticated principal (None for a bare name)."""
    if isinstance(who, Principal):
        return who.id, who
    return who, None


def load_policy(policy: Policy | str | os.PathLike[str] | None) -> Policy:
    """A Policy as is, one loaded from a path, or the file `CONTEXTOS_POLICY` names."""
    if isinstance(policy, Policy):
        return policy
    if policy is None:
        path = os.environ.get(POLICY_ENV)
        return Policy.load(path) if path else Policy()
    return Policy.load(Path(policy))


class Authority:
    """A runtime's policy, approver directory and clock, and everything done with them."""

    def __init__(
        self,
        policy: Policy | str | os.PathLike[str] | None = None,
        *,
        directory: Directory | None = None,
        clock: Callable[[], datetime] = utcnow,
        implicit: bool = False,
        expiry: Expiry | None = None,
    ) -> None:
        self.implicit = implicit
        """True for the allow-all stand-in of a runtime given no policy: it refuses to decide
        for runs that were bound to a real one."""
        self.policy = load_policy(policy)
        self.engine = Engine(self.policy)
        self.directory: Directory = directory or PolicyDirectory(self.policy)
        self.clock = clock
        self.expiry = expiry
        """How long an interrupt waits when neither its rule, its tool nor the policy says."""

    # -- binding a run ----------------------------------------------------------------------

    def context_for(
        self, principal: Principal | None = None, context: RunContext | None = None
    ) -> RunContext:
        if context is not None:
            if principal is not None and principal.ref != context.principal.ref:
                raise ApprovalRefused(
                    f"principal {principal.ref} does not match the context's "
                    f"{context.principal.ref}"
                )
            return context
        if principal is not None:
            return RunContext(principal=principal)
        return RunContext.local()

    def bound(self, run_id: RunId, seq: int, context: RunContext) -> ev.ContextBound:
        """The event that binds `context` and this policy's snapshot to a run."""
        return ev.ContextBound(
            run_id=run_id,
            seq=seq,
            actor=context.principal.ref,
            context=context.to_dict(),
            context_hash=context.hash(),
            policy_name=self.policy.name,
            policy_version=self.policy.version,
            snapshot_hash=self.policy.snapshot_hash,
        )

    def check_opt_out(self, agent_name: str, opt_out: Mapping[str, str]) -> None:
        """An agent leaves a default guard out only where the policy says it may
        (`allow_opt_out`); the allow-all stand-in of a runtime with no policy lets the
        agent's own, recorded opt-outs stand."""
        refused = sorted(set(opt_out) - set(self.policy.allow_opt_out))
        if refused and not self.implicit:
            raise ConfigError(
                f"agent {agent_name} leaves out the {', '.join(refused)} guard, which policy "
                f"{self.policy.name} does not allow: add it to the policy's allow_opt_out, "
                "or drop the opt-out",
                agent=agent_name,
                policy=self.policy.name,
            )

    async def check_child(self, store: EventStore, context: RunContext) -> None:
        """A child run's context must be within its parent's (AuthorityWidened otherwise)."""
        if context.parent_run_id is None:
            return
        parent = await load_state(store, RunId(context.parent_run_id))
        context.check_narrows(RunContext.of_run(parent.context))

    # -- reading ------------------------------------------------------------------------------

    async def find(self, store: EventStore, interrupt_id: str) -> tuple[RunState, Interrupt]:
        """The run and interrupt an id names; only that run is read."""
        run_id = run_of_interrupt(interrupt_id)
        if run_id is not None:
            try:
                state = await load_state(store, RunId(run_id))
            except RunNotFound:
                pass
            else:
                if interrupt_id in state.interrupts:
                    return state, state.interrupts[interrupt_id]
        raise InterruptNotFound(f"no interrupt with id {interrupt_id!r}", interrupt_id=interrupt_id)

    async def inbox(
        self, store: EventStore, *, limit: int = 200, tenant: str | None = None
    ) -> list[Interrupt]:
        """Pending interrupts across runs waiting for a person (of one tenant's runs when
        named), at most `limit`, oldest first."""
        out: list[Interrupt] = []
        waiting = await store.list_runs(status=RunStatus.INPUT_REQUIRED, limit=limit, tenant=tenant)
        for summary in waiting:
            out.extend((await load_state(store, summary.run_id)).pending_interrupts.values())
        return sorted(out, key=lambda i: i.raised_at)[:limit]

    # -- people -------------------------------------------------------------------------------

    async def approve(
        self,
        store: EventStore,
        interrupt_id: str,
        *,
        approver: str | Principal,
        expires_in: timedelta | float | None = None,
        conditions: Mapping[str, Any] | None = None,
        action_hash: str | None = None,
    ) -> Approval:
        """Approve the frozen action of a pending interrupt; approving again returns the same
        approval. Refused (ApprovalRefused) for a hash that is not the action's, an approver
        without the role, the run's own principal, or conditions the action already breaks.
        An authenticated `Principal` approves with at most the roles it carries."""
        approver, principal = _approver(approver)
        while True:
            state, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, state, found, f"user:{approver}"):
                continue
            if not found.kind.is_approval:
                raise ApprovalRefused(
                    f"{interrupt_id} is a {found.kind} interrupt; answer it instead",
                    interrupt_id=interrupt_id,
                )
            if action_hash is not None and action_hash != found.action_hash:
                raise ApprovalRefused(
                    f"the action hash {action_hash[:12]}… is not the hash of the action "
                    f"{interrupt_id} froze ({found.action_hash[:12]}…); nothing was approved",
                    interrupt_id=interrupt_id,
                    code_detail="hash_mismatch",
                )
            if found.status == "approved" and found.approval is not None:
                return found.approval  # idempotent: the first approval stands
            if found.status != "pending":
                raise ApprovalRefused(
                    f"{interrupt_id} is already {found.status}"
                    + (f" by {found.denied_by}" if found.denied_by else ""),
                    interrupt_id=interrupt_id,
                )
            _check_waiting(state, interrupt_id)
            context = RunContext.of_run(state.context)
            roles = await self._roles(approver, principal, context.tenant)
            required = found.approver_roles
            missing = [r for r in required if r not in roles]
            if missing:
                raise ApprovalRefused(
                    f"{approver} cannot approve {interrupt_id}: it needs role "
                    f"{fmt_roles(required)}, and {approver} does not hold {', '.join(missing)}",
                    interrupt_id=interrupt_id,
                    approver=approver,
                )
            if approver == context.principal.id and not self.policy.allow_self_approval:
                raise ApprovalRefused(
                    f"{approver} started this run and cannot approve its own action",
                    interrupt_id=interrupt_id,
                )
            action = found.action
            conds = dict(conditions or {})
            problem = constraints_problem(conds)
            if problem:
                raise ApprovalRefused(
                    f"the approval's conditions cannot be checked: {problem}",
                    interrupt_id=interrupt_id,
                    code_detail="invalid_conditions",
                )
            broken = check_constraints(conds, action.arguments if action else {})
            if broken:
                raise ApprovalRefused(
                    "the action already breaks the approval's conditions: " + "; ".join(broken),
                    interrupt_id=interrupt_id,
                )
            now = self.clock()
            event = ev.ApprovalGranted(
                run_id=state.run_id,
                seq=state.seq + 1,
                actor=f"user:{approver}",
                occurred_at=now,
                approval_id=approval_id_for(state.run_id, state.seq + 1),
                interrupt_id=interrupt_id,
                action_hash=found.action_hash,
                approver=approver,
                approver_roles=tuple(sorted(roles)),
                expires_at=now + self._ttl(expires_in),
                conditions=conds,
                snapshot_hash=self.policy.snapshot_hash,
            )
            if await self._append(store, state, event):
                return apply(state, event).approvals[event.approval_id]

    async def _roles(
        self, approver: str, principal: Principal | None, tenant: str
    ) -> frozenset[str]:
        """The roles the directory gives `approver` in the run's tenant; for an authenticated
        principal, only those it carries too, and none at all in another tenant."""
        roles = await self.directory.roles_of(approver, tenant=tenant)
        if principal is None:
            return roles
        return roles & frozenset(principal.roles) if principal.tenant == tenant else frozenset()

    async def deny(
        self, store: EventStore, interrupt_id: str, *, approver: str | Principal, reason: str = ""
    ) -> None:
        """Refuse the action of a pending interrupt; the model is told, the run goes on."""
        approver, principal = _approver(approver)
        while True:
            state, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, state, found, f"user:{approver}"):
                continue
            if found.status == "denied":
                return
            if found.status != "pending":
                hint = "; revoke the approval instead" if found.status == "approved" else ""
                raise ApprovalRefused(
                    f"{interrupt_id} is already {found.status}{hint}", interrupt_id=interrupt_id
                )
            _check_waiting(state, interrupt_id)
            context = RunContext.of_run(state.context)
            roles = await self._roles(approver, principal, context.tenant)
            required = found.approver_roles
            if approver != context.principal.id and any(r not in roles for r in required):
                raise ApprovalRefused(
                    f"{approver} cannot decide on {interrupt_id}: it needs role "
                    f"{fmt_roles(required)}",
                    interrupt_id=interrupt_id,
                )
            event = ev.ApprovalDenied(
                run_id=state.run_id,
                seq=state.seq + 1,
                actor=f"user:{approver}",
                occurred_at=self.clock(),
                interrupt_id=interrupt_id,
                action_hash=found.action_hash,
                approver=approver,
                reason=reason,
            )
            if await self._append(store, state, event):
                return

    async def answer(
        self,
        store: EventStore,
        interrupt_id: str,
        value: Any,
        *,
        answered_by: str,
        check: Callable[[RunState, Interrupt, dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Answer an interrupt with a value matching its kind's schema (approval kinds take
        `approve` / `deny`); `check` may refuse the parsed answer further, by raising."""
        while True:
            state, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, state, found, f"user:{answered_by}"):
                continue
            parsed = parse_answer(found.kind, value, found.payload)
            if check is not None:
                check(state, found, parsed)
            if found.kind.is_approval:
                if parsed["decision"] == "approve":
                    await self.approve(
                        store,
                        interrupt_id,
                        approver=answered_by,
                        expires_in=parsed.get("expires_in_s"),
                        conditions=parsed.get("conditions") or None,
                    )
                else:
                    await self.deny(
                        store, interrupt_id, approver=answered_by, reason=parsed.get("reason", "")
                    )
                return parsed
            if found.status == "answered":
                if found.answer == parsed:
                    return parsed  # the same answer twice changes nothing
                raise ApprovalRefused(
                    f"{interrupt_id} was already answered by {found.answered_by}",
                    interrupt_id=interrupt_id,
                )
            if found.status != "pending":
                raise ApprovalRefused(
                    f"{interrupt_id} is {found.status}", interrupt_id=interrupt_id
                )
            _check_waiting(state, interrupt_id)
            event = ev.InterruptAnswered(
                run_id=state.run_id,
                seq=state.seq + 1,
                actor=f"user:{answered_by}",
                occurred_at=self.clock(),
                interrupt_id=interrupt_id,
                kind=found.kind.value,
                value=parsed,
                answered_by=answered_by,
            )
            if await self._append(store, state, event):
                return parsed

    async def revoke(
        self, store: EventStore, approval_id: str, *, revoked_by: str, reason: str = ""
    ) -> Approval:
        """Withdraw an approval. If its action has not run yet, it will not run on it."""
        run_id = run_of_approval(approval_id)
        if run_id is None:
            raise ApprovalRefused(f"{approval_id!r} is not an approval id (apr.RUN.SEQ)")
        while True:
            try:
                state = await load_state(store, RunId(run_id))
            except RunNotFound:
                raise ApprovalRefused(f"no approval with id {approval_id!r}") from None
            approval = state.approvals.get(approval_id)
            if approval is None:
                raise ApprovalRefused(f"no approval with id {approval_id!r}")
            if approval.revoked:
                return approval
            context = RunContext.of_run(state.context)
            roles = await self.directory.roles_of(revoked_by, tenant=context.tenant)
            found = state.interrupts.get(approval.interrupt_id)
            required = found.approver_roles if found else ()
            if revoked_by != approval.approver and any(r not in roles for r in required):
                raise ApprovalRefused(
                    f"{revoked_by} cannot revoke {approval_id}: only its approver or a holder "
                    f"of role {fmt_roles(required)} can"
                )
            event = ev.ApprovalRevoked(
                run_id=state.run_id,
                seq=state.seq + 1,
                actor=f"user:{revoked_by}",
                occurred_at=self.clock(),
                approval_id=approval_id,
                revoked_by=revoked_by,
                reason=reason,
            )
            if await self._append(store, state, event):
                return apply(state, event).approvals[approval_id]

    # -- helpers ------------------------------------------------------------------------------

    async def _lapsed(
        self, store: EventStore, state: RunState, found: Interrupt, actor: str
    ) -> bool:
        """Refuse an answer to an expired interrupt (AnswerTooLate). An overdue one is expired
        first, with the fence, so whichever of the answer and the expiry commits first wins;
        True: it was, read again."""
        if found.status == "expired" and found.expiry is not None:
            raise AnswerTooLate(
                f"{found.id} expired unanswered at {found.expiry.expires_at.isoformat()}; "
                f"{what_happened(found)}. The answer was not recorded.",
                interrupt_id=found.id,
                run_id=state.run_id,
                expired_at=found.expiry.expires_at.isoformat(),
                on_expiry=found.expiry.on_expiry,
            )
        if found in overdue(state, self.clock()):
            await expire_overdue(store, state.run_id, now=self.clock(), actor=actor)
            return True
        return False

    def with_deadline(self, decision: PolicyDecision, call: ProposedCall) -> PolicyDecision:
        """An interrupt about to be raised gets its deadline, when anything declares one."""
        if decision.decision is not Decision.REQUIRE_APPROVAL or not decision.interrupt_kind:
            return decision
        deadline = deadline_for(
            InterruptKind(decision.interrupt_kind),
            decision.interrupt_payload,
            now=self.clock(),
            policy=self.policy,
            rule_ids=decision.rule_ids,
            tool_name=call.tool,
            tool_expiry=call.expiry if call.asks is not None else None,
            fallback=self.expiry,
        )
        if deadline is None:
            return decision
        payload = {**decision.interrupt_payload, "expiry": deadline.to_dict()}
        return replace(decision, interrupt_payload=payload)

    def _ttl(self, expires_in: timedelta | float | None) -> timedelta:
        if expires_in is None:
            return timedelta(seconds=self.policy.approval_ttl_s)
        given = expires_in.total_seconds() if isinstance(expires_in, timedelta) else expires_in
        most = self.policy.max_approval_ttl_s
        ttl = seconds(
            given, what="an approval's expiry", error=ApprovalRefused, code_detail="invalid_expiry"
        )
        if ttl > most:
            raise ApprovalRefused(
                f"an approval may last at most {most:g}s (asked for {ttl:g}s)",
                code_detail="invalid_expiry",
            )
        return timedelta(seconds=ttl)

    async def _append(self, store: EventStore, state: RunState, *events: ev.Event) -> bool:
        """Append at the run's tail; False when the log moved on (the caller re-reads)."""
        try:
            await store.append(state.run_id, stamp(state, events), expected_seq=state.seq)
        except ConcurrencyConflict:
            return False
        except RunIsTerminal as exc:
            raise ApprovalRefused(
                f"run {state.run_id} has ended ({exc.status}); nothing to decide any more",
                run_id=state.run_id,
            ) from exc
        return True


def _check_waiting(state: RunState, interrupt_id: str) -> None:
    """Only a run waiting for a person takes an answer: the answer moves it back to the queue,
    which is a legal move from `input_required` only."""
    if state.status is not RunStatus.INPUT_REQUIRED:
        raise ApprovalRefused(
            f"run {state.run_id} is {state.status}, not waiting for an answer; {interrupt_id} "
            "can be answered when the run asks again",
            interrupt_id=interrupt_id,
            run_id=state.run_id,
        )
