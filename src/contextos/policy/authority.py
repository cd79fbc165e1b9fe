"""Authority at run time: binding a run's context, the gate every tool call passes, and people
approving, denying, answering and revoking.

The gate re-reads the run's own log before each decision, so everything it relies on (the bound
context, approvals, denials, revocations, what already ran) is durable and survives restarts:
a run resumed in a new process is judged exactly as it would have been in the old one, under
the policy, roles and clock in force now.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from contextos import events as ev
from contextos.causality import stamp
from contextos.deadlines import Expiry
from contextos.errors import (
    AnswerTooLate,
    ApprovalRefused,
    ConcurrencyConflict,
    InterruptNotFound,
    RunIsTerminal,
    RunNotFound,
)
from contextos.events import utcnow
from contextos.expiry import deadline_for, expire_overdue, expired_decision, overdue, what_happened
from contextos.interrupts import (
    Approval,
    Book,
    FrozenAction,
    Interrupt,
    InterruptKind,
    bind_store,
    check_approval,
    default_blast_radius,
    default_preview,
    fmt_roles,
    parse_answer,
    render_template,
    run_of_interrupt,
)
from contextos.numbers import seconds
from contextos.policy.ask import HumanTool
from contextos.policy.containment import activate
from contextos.policy.decision import Check, Decision, PolicyDecision, ProposedCall
from contextos.policy.engine import CallHistory, Engine
from contextos.policy.identity import Principal, RunContext
from contextos.policy.rules import Policy, check_constraints, constraints_problem
from contextos.runs import RunId, RunStatus
from contextos.state import fold
from contextos.store.base import EventStore, load_state
from contextos.tools.contract import Tool
from contextos.tools.effects import confirmation

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
        return self.policy.roles_of(principal_id)


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

    async def check_child(self, store: EventStore, context: RunContext) -> None:
        """A child run's context must be within its parent's (AuthorityWidened otherwise)."""
        if context.parent_run_id is None:
            return
        parent = await self.book(store, context.parent_run_id)
        context.check_narrows(parent.context or RunContext.local())

    def gate(self, store: EventStore, tools: Sequence[Tool]) -> Gate:
        """The policy hook for a gateway over `tools`."""
        return Gate(self, store, tools)

    # -- reading ------------------------------------------------------------------------------

    async def book(self, store: EventStore, run_id: str) -> Book:
        return Book.of(run_id, await store.read(RunId(run_id)))

    async def find(self, store: EventStore, interrupt_id: str) -> tuple[Book, Interrupt]:
        """The run and interrupt an id names; only that run's log is read."""
        run_id = run_of_interrupt(interrupt_id)
        if run_id is not None:
            try:
                book = await self.book(store, run_id)
            except RunNotFound:
                pass
            else:
                if interrupt_id in book.interrupts:
                    return book, book.interrupts[interrupt_id]
        raise InterruptNotFound(f"no interrupt with id {interrupt_id!r}", interrupt_id=interrupt_id)

    async def inbox(self, store: EventStore, *, limit: int = 200) -> list[Interrupt]:
        """Pending interrupts across runs waiting for a person, oldest first."""
        out: list[Interrupt] = []
        for summary in await store.list_runs(status=RunStatus.INPUT_REQUIRED, limit=limit):
            out.extend((await self.book(store, summary.run_id)).pending)
        return sorted(out, key=lambda i: i.raised_at)

    # -- people -------------------------------------------------------------------------------

    async def approve(
        self,
        store: EventStore,
        interrupt_id: str,
        *,
        approver: str,
        expires_in: timedelta | float | None = None,
        conditions: Mapping[str, Any] | None = None,
        action_hash: str | None = None,
    ) -> Approval:
        """Approve the frozen action of a pending interrupt; approving again returns the same
        approval. Refused (ApprovalRefused) for a hash that is not the action's, an approver
        without the role, the run's own principal, or conditions the action already breaks."""
        while True:
            book, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, book, found, f"user:{approver}"):
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
            _check_waiting(book, interrupt_id)
            context = book.context or RunContext.local()
            roles = await self.directory.roles_of(approver, tenant=context.tenant)
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
                run_id=RunId(book.run_id),
                seq=book.seq + 1,
                actor=f"user:{approver}",
                occurred_at=now,
                approval_id=f"apr.{book.run_id}.{book.seq + 1}",
                interrupt_id=interrupt_id,
                action_hash=found.action_hash,
                approver=approver,
                approver_roles=tuple(sorted(roles)),
                expires_at=now + self._ttl(expires_in),
                conditions=conds,
                snapshot_hash=self.policy.snapshot_hash,
            )
            if await self._append(store, book, event):
                book.apply(event)
                approval = book.approvals[event.approval_id]
                return approval

    async def deny(
        self, store: EventStore, interrupt_id: str, *, approver: str, reason: str = ""
    ) -> None:
        """Refuse the action of a pending interrupt; the model is told, the run goes on."""
        while True:
            book, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, book, found, f"user:{approver}"):
                continue
            if found.status == "denied":
                return
            if found.status != "pending":
                hint = "; revoke the approval instead" if found.status == "approved" else ""
                raise ApprovalRefused(
                    f"{interrupt_id} is already {found.status}{hint}", interrupt_id=interrupt_id
                )
            _check_waiting(book, interrupt_id)
            context = book.context or RunContext.local()
            roles = await self.directory.roles_of(approver, tenant=context.tenant)
            required = found.approver_roles
            if approver != context.principal.id and any(r not in roles for r in required):
                raise ApprovalRefused(
                    f"{approver} cannot decide on {interrupt_id}: it needs role "
                    f"{fmt_roles(required)}",
                    interrupt_id=interrupt_id,
                )
            event = ev.ApprovalDenied(
                run_id=RunId(book.run_id),
                seq=book.seq + 1,
                actor=f"user:{approver}",
                occurred_at=self.clock(),
                interrupt_id=interrupt_id,
                action_hash=found.action_hash,
                approver=approver,
                reason=reason,
            )
            if await self._append(store, book, event):
                return

    async def answer(
        self, store: EventStore, interrupt_id: str, value: Any, *, answered_by: str
    ) -> dict[str, Any]:
        """Answer an interrupt with a value matching its kind's schema (approval kinds take
        `approve` / `deny`)."""
        while True:
            book, found = await self.find(store, interrupt_id)
            if await self._lapsed(store, book, found, f"user:{answered_by}"):
                continue
            parsed = parse_answer(found.kind, value, found.payload)
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
            _check_waiting(book, interrupt_id)
            event = ev.InterruptAnswered(
                run_id=RunId(book.run_id),
                seq=book.seq + 1,
                actor=f"user:{answered_by}",
                occurred_at=self.clock(),
                interrupt_id=interrupt_id,
                kind=found.kind.value,
                value=parsed,
                answered_by=answered_by,
            )
            settled = await self._settlement(store, book, found, parsed, answered_by)
            if await self._append(store, book, event, *settled):
                return parsed

    async def revoke(
        self, store: EventStore, approval_id: str, *, revoked_by: str, reason: str = ""
    ) -> Approval:
        """Withdraw an approval. If its action has not run yet, it will not run on it."""
        run_id = _run_of_approval(approval_id)
        while True:
            try:
                book = await self.book(store, run_id)
            except RunNotFound:
                raise ApprovalRefused(f"no approval with id {approval_id!r}") from None
            approval = book.approvals.get(approval_id)
            if approval is None:
                raise ApprovalRefused(f"no approval with id {approval_id!r}")
            if approval.revoked:
                return approval
            context = book.context or RunContext.local()
            roles = await self.directory.roles_of(revoked_by, tenant=context.tenant)
            found = book.interrupts.get(approval.interrupt_id)
            required = found.approver_roles if found else ()
            if revoked_by != approval.approver and any(r not in roles for r in required):
                raise ApprovalRefused(
                    f"{revoked_by} cannot revoke {approval_id}: only its approver or a holder "
                    f"of role {fmt_roles(required)} can"
                )
            event = ev.ApprovalRevoked(
                run_id=RunId(book.run_id),
                seq=book.seq + 1,
                actor=f"user:{revoked_by}",
                occurred_at=self.clock(),
                approval_id=approval_id,
                revoked_by=revoked_by,
                reason=reason,
            )
            if await self._append(store, book, event):
                book.apply(event)
                return book.approvals[approval_id]

    # -- helpers ------------------------------------------------------------------------------

    async def _lapsed(self, store: EventStore, book: Book, found: Interrupt, actor: str) -> bool:
        """Refuse an answer to an expired interrupt (AnswerTooLate). An overdue one is expired
        first, with the fence, so whichever of the answer and the expiry commits first wins;
        True: it was, read again."""
        if found.status == "expired" and found.expiry is not None:
            raise AnswerTooLate(
                f"{found.id} expired unanswered at {found.expiry.expires_at.isoformat()}; "
                f"{what_happened(found)}. The answer was not recorded.",
                interrupt_id=found.id,
                run_id=book.run_id,
                expired_at=found.expiry.expires_at.isoformat(),
                on_expiry=found.expiry.on_expiry,
            )
        if found in overdue(book, self.clock()):
            await expire_overdue(store, book.run_id, now=self.clock(), actor=actor)
            return True
        return False

    def with_deadline(self, decision: PolicyDecision, tool: Tool | None) -> PolicyDecision:
        """An interrupt about to be raised gets its deadline, when anything declares one."""
        if decision.decision is not Decision.REQUIRE_APPROVAL or not decision.interrupt_kind:
            return decision
        deadline = deadline_for(
            InterruptKind(decision.interrupt_kind),
            decision.interrupt_payload,
            now=self.clock(),
            policy=self.policy,
            rule_ids=decision.rule_ids,
            tool_name=tool.name if tool is not None else "",
            tool_expiry=tool.expiry if isinstance(tool, HumanTool) else None,
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

    async def _settlement(
        self,
        store: EventStore,
        book: Book,
        found: Interrupt,
        answer: Mapping[str, Any],
        who: str,
    ) -> list[ev.Event]:
        """For a confirmed external outcome: the event that settles the effect in the ledger,
        appended with the answer, so the call is never sent again and the model is told."""
        if found.kind is not InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED or not found.effect_id:
            return []
        state = fold(await store.read(RunId(book.run_id)), book.run_id)
        effect = state.effects.get(found.effect_id)
        if effect is None or not effect.state.in_flight:
            return []
        receipt = str(answer.get("receipt") or "")
        return [
            confirmation(
                state,
                found.effect_id,
                happened=answer["outcome"] == "committed",
                actor=f"user:{who}",
                note=str(answer.get("note") or ""),
                receipts={"confirmation": receipt} if receipt else None,
                seq=book.seq + 2,
            )
        ]

    async def _append(self, store: EventStore, book: Book, *events: ev.Event) -> bool:
        """Append at the book's tail; False when the log moved on (the caller re-reads)."""
        state = await load_state(store, RunId(book.run_id))
        if state.seq != book.seq:
            return False
        try:
            await store.append(RunId(book.run_id), stamp(state, events), expected_seq=book.seq)
        except ConcurrencyConflict:
            return False
        except RunIsTerminal as exc:
            raise ApprovalRefused(
                f"run {book.run_id} has ended ({exc.status}); nothing to decide any more",
                run_id=book.run_id,
            ) from exc
        return True

    def freeze(self, call: ProposedCall, tool: Tool | None, context: RunContext) -> FrozenAction:
        """The frozen action for a proposed call, with the policy's preview when it has one.

        Fields the tool's contract redacts are shown as `[redacted]` (in the preview too); the
        hash still covers their real values.
        """
        preview = blast = None
        for rule in self.policy.rules:
            if (rule.preview or rule.blast_radius) and rule.matches(call, context):
                preview = preview or rule.preview
                blast = blast or rule.blast_radius
        full = dict(call.arguments)
        shown = tool.redacted(full) if tool is not None and tool.redact_fields else full
        action = FrozenAction(
            run_id=call.run_id,
            call_id=call.call_id,
            tool=call.tool,
            arguments=full,
            contract_hash=tool.contract_hash() if tool is not None else "",
            effect=call.effect,
            risk=call.risk,
            preview=(
                render_template(preview, shown) if preview else default_preview(call.tool, shown)
            ),
            blast_radius=(
                render_template(blast, shown)
                if blast
                else default_blast_radius(
                    call.effect, call.risk, tool.compensation if tool is not None else None
                )
            ),
        )
        if shown is full:
            return action
        return replace(action, arguments=shown, digest=action.hash)


class Gate:
    """The policy hook of one gateway: decides each proposed call from the run's own log."""

    def __init__(self, authority: Authority, store: EventStore, tools: Sequence[Tool]) -> None:
        self.authority = authority
        self.store = store
        self.tools = {t.name: t for t in tools}
        self._books: OrderedDict[str, Book] = OrderedDict()
        self._done: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}

    async def _book(self, run_id: str) -> Book:
        book = self._books.pop(run_id, None) or Book(run_id=run_id)
        for event in await self.store.read(RunId(run_id), after_seq=book.seq):
            book.apply(event)
        self._books[run_id] = book
        while len(self._books) > 256:
            self._done.pop(self._books.popitem(last=False)[0], None)
        return book

    def _history(self, book: Book) -> CallHistory:
        """What already succeeded, each call's arguments as its tool validated them (as the
        call being decided has them), so limits and the repeat guard compare like with like."""
        done = self._done.setdefault(book.run_id, [])
        for name, raw in book.succeeded[len(done) :]:
            tool = self.tools.get(name)
            try:
                args = tool.args_model.model_validate(raw).model_dump(mode="json") if tool else raw
            except ValidationError:
                args = raw
            done.append((name, args))
        return CallHistory(succeeded=tuple(done))

    async def evaluate(self, call: ProposedCall) -> PolicyDecision:
        a = self.authority
        book = await self._book(call.run_id)
        context = book.context or RunContext.local()
        # The built-in file and HTTP tools read the run's containment at the moment they act,
        # and the tools that ask a person read the answer from the run's log.
        activate(context.containment)
        bind_store(self.store)
        tool = self.tools.get(call.tool)
        if a.implicit and book.snapshot_hash and book.snapshot_hash != a.policy.snapshot_hash:
            # Fail closed: deciding under "no policy" would silently widen the run's authority.
            return PolicyDecision(
                decision=Decision.DENY,
                rule_ids=("policy:missing",),
                reasons=(
                    f"the run is bound to policy snapshot {book.snapshot_hash[:12]}, and this "
                    "runtime has no policy; give it the run's policy (CONTEXTOS_POLICY)",
                ),
                absolute=True,
            )
        decision = a.engine.evaluate(call, context, tool=tool, history=self._history(book))
        action = a.freeze(call, tool, context)
        decision = replace(decision, action_hash=action.hash)
        if isinstance(tool, HumanTool) and decision.allowed:
            return a.with_deadline(_ask_person(decision, call, tool, book), tool)
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
        latest = book.latest_for_call(call.call_id)
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
        return a.with_deadline(asked, tool)


def _ask_person(
    decision: PolicyDecision, call: ProposedCall, tool: HumanTool, book: Book
) -> PolicyDecision:
    """A call that asks a person: raise its interrupt, or let it complete once answered."""
    latest = book.latest_for_call(call.call_id)
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
    kind = InterruptKind.CHOICE_REQUIRED if options else tool.interrupt_kind
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


def _check_waiting(book: Book, interrupt_id: str) -> None:
    """Only a run waiting for a person takes an answer: the answer moves it back to the queue,
    which is a legal move from `input_required` only."""
    if book.status != RunStatus.INPUT_REQUIRED.value:
        raise ApprovalRefused(
            f"run {book.run_id} is {book.status}, not waiting for an answer; {interrupt_id} "
            "can be answered when the run asks again",
            interrupt_id=interrupt_id,
            run_id=book.run_id,
        )


def _run_of_approval(approval_id: str) -> str:
    if not approval_id.startswith("apr.") or approval_id.count(".") < 2:
        raise ApprovalRefused(f"{approval_id!r} is not an approval id (apr.RUN.SEQ)")
    return approval_id[4:].rsplit(".", 1)[0]
