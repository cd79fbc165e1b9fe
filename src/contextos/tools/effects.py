"""The effect ledger in motion: every tool call of a run, journaled step by step.

`ToolRunner` takes a pending tool call from the folded state to a recorded result. For a tool
whose effect is not `read` it first writes the effect's proposal, validation and policy decision,
then `dispatched` in a commit of its own, and only then calls the tool; so after a crash the log
tells exactly which calls may have happened without their outcome being known. Those are never
re-run blindly: they are reconciled through the tool, re-sent with the same idempotency key when
the contract says that is safe, or put to a person as an interrupt.

When a run fails or is cancelled after committed reversible writes, the saga
(`contextos.tools.saga`) settles its effects through this runner before the terminal event is
written.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from pydantic import BaseModel

from contextos import events as ev
from contextos.errors import (
    ToolCrashed,
    ToolManifestChanged,
    ToolOutcomeUnknown,
    ToolOutputInvalid,
)
from contextos.ledger import (
    MAX_DISPATCHES,
    Effect,
    EffectState,
    abandoned,
    action_key,
    effect_id_for,
    idempotency_key,
)
from contextos.messages import ToolCall
from contextos.policy.containment import Containment
from contextos.policy.identity import RunContext
from contextos.records.decisions import Decision, PolicyDecision
from contextos.records.interrupts import InterruptKind, approval_interrupt, interrupt_id_for
from contextos.runs import RunId
from contextos.state import RunState
from contextos.store.base import EventStore
from contextos.tools._invoke import error_text, error_type, safe_text
from contextos.tools.contract import Tool, ToolContext
from contextos.tools.gateway import (
    Gateway,
    ToolOutcome,
    error_outcome,
    failure_outcome,
    refusal_outcome,
    safe_receipts,
    timeout_message,
    unshowable_outcome,
)
from contextos.tools.inflight import Ending, attempt, ms_since, now


class Journal(Protocol):
    """What the runner needs from the loop driver: the folded state and a fenced commit."""

    state: RunState
    store: EventStore

    def event(self, cls: type[Any], offset: int = 1, **fields: Any) -> Any: ...

    async def commit(self, *events: ev.Event, synchronous: bool = True) -> None: ...


@dataclass(slots=True)
class _Batch:
    """Events to append in one transaction, numbered as they are added."""

    journal: Journal
    events: list[ev.Event]

    def add(self, cls: type[Any], **fields: Any) -> None:
        self.events.append(self.journal.event(cls, offset=len(self.events) + 1, **fields))

    async def commit(self, *, synchronous: bool = True) -> None:
        """Append the events; `synchronous=False` only where a synchronous commit is sure to
        follow before anything with an effect leaves the process (see `Driver.commit`)."""
        if self.events:
            await self.journal.commit(*self.events, synchronous=synchronous)
            self.events = []


class ToolRunner:
    """Runs tool calls of one run through the gateway, journaling every step."""

    def __init__(self, journal: Journal, gateway: Gateway) -> None:
        self.j = journal
        self.gw = gateway

    @property
    def state(self) -> RunState:
        return self.j.state

    def batch(self) -> _Batch:
        return _Batch(self.j, [])

    # -- entry points ---------------------------------------------------------------------

    def check_manifest(self) -> None:
        """Refuse to call tools whose contracts differ from those the run started with."""
        recorded = self.state.tool_manifest_hash
        if recorded and recorded != self.gw.manifest_hash:
            raise ToolManifestChanged(
                f"the run's tools changed while it was in flight: it started with tool manifest "
                f"{recorded[:12]}, this process has {self.gw.manifest_hash[:12]}; the run will "
                "not call a capability other than the one it was started with",
                run_id=self.state.run_id,
                recorded=recorded,
                current=self.gw.manifest_hash,
            )
        for effect in self.state.effects.values():
            tool = self.gw.tools.get(effect.tool)
            changed = tool is not None and tool.contract_hash() != effect.contract_hash
            if effect.state.in_flight and changed:
                raise ToolManifestChanged(
                    f"tool {effect.tool} changed since effect {effect.effect_id} was dispatched",
                    run_id=self.state.run_id,
                    tool=effect.tool,
                )

    async def run(self, call: ToolCall) -> None:
        """Take one pending call to its recorded result (or to an interrupt)."""
        self.check_manifest()
        effect_id = self.state.effect_by_call.get(call.id)
        if effect_id is not None:
            await self._continue(call, self.state.effects[effect_id])
            return
        parsed = self.gw.parse(call)
        if isinstance(parsed, ToolOutcome):
            await self._complete(call, parsed)
            return
        tool, args = parsed
        if tool.has_effect:
            if self.state.inherited and await self._inherit(call, tool):
                await self._continue(call, self.state.effects[self.state.effect_by_call[call.id]])
                return
            await self._propose(call, tool, args)
            await self._continue(call, self.state.effects[self.state.effect_by_call[call.id]])
        else:
            await self._run_read(call, tool, args)

    # -- read tools -----------------------------------------------------------------------

    async def _run_read(self, call: ToolCall, tool: Tool, args: BaseModel) -> None:
        decided = self.state.policy_by_call.get(call.id)
        if decided is None and self.gw.policy is not None:
            decision = await self.gw.decide(self.gw.propose(self.state.run_id, call, tool, args))
            b = self.batch()
            b.add(ev.PolicyDecided, **decision.recorded(call.id, tool.name, None))
            # Recorded before the call runs, without waiting for the disk: a read has no effect,
            # and its result, a refusal or the approval's interrupt commits next, flushing this
            # (a power loss in between loses both, and the call is decided and run again).
            await b.commit(synchronous=False)
            decided = self.state.policy_by_call[call.id]
        if decided is not None and decided.decision in (Decision.DENY, Decision.REQUIRE_APPROVAL):
            if decided.decision == Decision.REQUIRE_APPROVAL:
                await self.approval_required(call, tool, None, decided)
            else:
                await self._complete(call, refusal_outcome(tool.name, PolicyDecision.of(decided)))
            return
        await self._complete(call, await self.dispatch_read(call, tool, args))

    async def dispatch_read(
        self,
        call: ToolCall,
        tool: Tool,
        args: BaseModel,
        failed: list[dict[str, Any]] | None = None,
    ) -> ToolOutcome:
        """Run an authorised read call to its outcome, retrying as its contract allows.

        Each failed attempt is recorded as it happens, or, with `failed`, kept there (the
        fields of its tool_attempt_failed event) for the caller to record in order later.
        """
        attempt = 1
        while True:
            ctx = self._context(call, None, attempt)
            started = now()
            try:
                r = self.gw.render(await self._attempt(tool, args, ctx), tool)
            except Ending:
                return error_outcome("cancelled", f"{tool.name} was cancelled: the run is ending.")
            except TimeoutError as exc:
                if await self._retry_after(call, tool, None, attempt, exc, failed):
                    attempt += 1
                    continue
                return error_outcome("tool_timeout", timeout_message(tool, exc))
            except Exception as exc:
                if await self._retry_after(call, tool, None, attempt, exc, failed):
                    attempt += 1
                    continue
                return failure_outcome(tool, exc)
            return ToolOutcome(
                output=r.text,
                truncated=r.truncated,
                receipts={**safe_receipts(ctx.receipts), **r.receipts},
                duration_ms=ms_since(started),
            )

    # -- tools with effects ---------------------------------------------------------------

    async def _propose(self, call: ToolCall, tool: Tool, args: BaseModel) -> None:
        run_id = self.state.run_id
        key = idempotency_key(run_id, call.id)
        eid = effect_id_for(key)
        decision = await self.gw.decide(self.gw.propose(run_id, call, tool, args))
        b = self.batch()
        b.add(
            ev.EffectProposed,
            effect_id=eid,
            call_id=call.id,
            tool=tool.name,
            kind=tool.effect.value,
            idempotency_key=key,
            contract_hash=tool.contract_hash(),
            arguments=tool.redacted(args.model_dump(mode="json")),
            compensation=tool.compensation,
        )
        b.add(ev.EffectChanged, effect_id=eid, state=EffectState.VALIDATED)
        b.add(ev.PolicyDecided, **decision.recorded(call.id, tool.name, eid))
        if decision.decision in (Decision.ALLOW, Decision.CONSTRAIN):
            b.add(ev.EffectChanged, effect_id=eid, state=EffectState.AUTHORISED)
        # Before the call is sent its dispatch is committed, synchronously, which flushes this
        # (as does a refusal or the approval's interrupt): the proposal need not wait for the disk.
        await b.commit(synchronous=False)

    async def _inherit(self, call: ToolCall, tool: Tool) -> bool:
        """In a forked run: a call asking exactly what the source run already sent takes that
        effect, its ledger copied from the source (outcome, receipts, idempotency key), instead
        of being sent again. False when the source sent nothing like it."""
        wanted = (action_key(call.name, call.arguments), tool.contract_hash())
        eid = next((e for e, action in self.state.inherited.items() if action == wanted), None)
        if eid is None or self.state.forked_from is None:
            return False
        source = await self.j.store.read(RunId(self.state.forked_from))
        ledger = [
            e
            for e in source
            if isinstance(e, ev.EffectProposed | ev.EffectChanged) and e.effect_id == eid
        ]
        copied: list[ev.Event] = []
        for i, e in enumerate(ledger, start=1):
            if isinstance(e, ev.EffectProposed):
                e = dataclasses.replace(e, call_id=call.id)
            copied.append(
                dataclasses.replace(
                    e,
                    run_id=self.state.run_id,
                    seq=self.state.seq + i,
                    causation_id=None,
                    correlation_id=None,
                )
            )
        await self.j.commit(*copied)
        return True

    async def _continue(self, call: ToolCall, effect: Effect) -> None:
        """Carry an effect on from whatever state the log left it in."""
        tool = self.gw.tools.get(effect.tool)
        state = effect.state
        if state.is_final or state in (EffectState.COMPENSATING,):
            await self._complete_from_effect(call, effect)
            return
        if tool is None:  # cannot happen while the manifest check holds; be explicit anyway
            raise ToolManifestChanged(f"tool {effect.tool} is no longer available")
        parsed = self.gw.parse(call)
        if isinstance(parsed, ToolOutcome):
            raise ToolManifestChanged(
                f"the recorded arguments of {call.id} no longer validate against {tool.name}: "
                f"{parsed.output}"
            )
        _, args = parsed
        if state is EffectState.VALIDATED:
            decided = self.state.policy_by_call[call.id]
            if decided.decision == Decision.DENY:
                await self._settle_refused(call, tool, effect, decided)
            else:
                await self.approval_required(call, tool, effect, decided)
            return
        if state is EffectState.AUTHORISED:
            await self._dispatch(call, tool, args, effect)
            return
        if state is EffectState.DISPATCHED:
            # Recorded as dispatched, never settled: the worker stopped mid-call.
            b = self.batch()
            b.add(
                ev.EffectChanged,
                effect_id=effect.effect_id,
                state=EffectState.OUTCOME_UNKNOWN,
                error_code="outcome_unknown",
                note="the worker stopped after dispatching the call and before its outcome "
                "was recorded",
            )
            await b.commit()
        await self._resolve(call, tool, args, effect)

    async def _settle_refused(
        self, call: ToolCall, tool: Tool, effect: Effect, decided: ev.PolicyDecided
    ) -> None:
        outcome = refusal_outcome(tool.name, PolicyDecision.of(decided))
        b = self.batch()
        b.add(
            ev.EffectChanged,
            effect_id=effect.effect_id,
            state=EffectState.DENIED,
            output=outcome.output,
            error_code=outcome.error_code,
            note="; ".join(decided.reasons),
        )
        self._add_completed(b, call, outcome, effect.effect_id)
        await b.commit()

    async def approval_required(
        self, call: ToolCall, tool: Tool, effect: Effect | None, decided: ev.PolicyDecided
    ) -> None:
        """Policy asked for a person: raise the interrupt once per decision (the run waits,
        holding nothing); once it has been answered, ask policy again, which revalidates the
        approval (or applies the denial), and carry on with that decision."""
        args = await self.reconsider(call, tool, effect, decided)
        if args is None:
            return
        if effect is not None:
            await self._continue(call, self.state.effects[effect.effect_id])
        else:
            await self._run_read(call, tool, args)

    async def reconsider(
        self, call: ToolCall, tool: Tool, effect: Effect | None, decided: ev.PolicyDecided
    ) -> BaseModel | None:
        """The first half of `approval_required`: raise the interrupt, or once it was answered
        record policy's new decision. Returns the call's arguments once decided again; None
        when the run now waits for a person (or the call was completed)."""
        raised = self.state.latest_interrupt(call.id)
        if raised is None or raised.raised_seq < decided.seq:
            b = self.batch()
            b.add(
                ev.InterruptRaised,
                **approval_interrupt(self.state.run_id, self.state.seq + 1, decided),
            )
            await b.commit()
            return None
        parsed = self.gw.parse(call)
        if isinstance(parsed, ToolOutcome):  # the call validated when it was decided on
            await self._complete(call, parsed)
            return None
        _, args = parsed
        decision = await self.gw.decide(self.gw.propose(self.state.run_id, call, tool, args))
        eid = effect.effect_id if effect is not None else None
        b = self.batch()
        b.add(ev.PolicyDecided, **decision.recorded(call.id, tool.name, eid))
        if eid is not None and decision.allowed:
            b.add(ev.EffectChanged, effect_id=eid, state=EffectState.AUTHORISED)
        await b.commit()
        return args

    async def decision(self, call: ToolCall, tool: Tool, args: BaseModel) -> dict[str, Any]:
        """Ask policy about a read call: the fields of its policy_decided event (not recorded)."""
        decision = await self.gw.decide(self.gw.propose(self.state.run_id, call, tool, args))
        return decision.recorded(call.id, tool.name, None)

    @staticmethod
    def completed_fields(call: ToolCall, outcome: ToolOutcome) -> dict[str, Any]:
        """The fields of the tool_completed event that records `outcome` for a read call."""
        return {
            "call_id": call.id,
            "name": call.name,
            "output": outcome.output,
            "is_error": outcome.is_error,
            "error_code": outcome.error_code,
            "duration_ms": outcome.duration_ms,
            "truncated": outcome.truncated,
            "untrusted": outcome.untrusted,
            "effect_id": None,
        }

    async def _dispatch(self, call: ToolCall, tool: Tool, args: BaseModel, effect: Effect) -> None:
        """Send the call (again, with the same key), each attempt recorded before it is made."""
        eid = effect.effect_id
        while True:
            if self.state.ending is not None:
                await self._abandon(effect, "the run is ending; the call was not sent")
                return
            # An earlier attempt whose outcome is unknown may have acted: that call is sent again
            # with its key (its contract allows it), never recorded as not sent.
            unsure = effect.state is EffectState.OUTCOME_UNKNOWN
            attempt = effect.attempts + 1
            b = self.batch()
            b.add(ev.EffectChanged, effect_id=eid, state=EffectState.DISPATCHED, attempt=attempt)
            await b.commit()  # durable before the tool is called: a crash after it is detectable
            if self.state.ending is not None and not unsure:  # the commit folded a request in
                await self._abandon(effect, "the run is ending; the call was not sent")
                return
            ctx = self._context(call, effect, attempt)
            started = now()
            try:
                r = self.gw.render(await self._attempt(tool, args, ctx), tool)
            except (TimeoutError, ToolOutcomeUnknown, ToolCrashed, Ending) as exc:
                # Cut short, or ended abnormally: the call may have acted.
                b = self.batch()
                b.add(
                    ev.EffectChanged,
                    effect_id=eid,
                    state=EffectState.OUTCOME_UNKNOWN,
                    receipts=safe_receipts(ctx.receipts),
                    error_code=exc.code if isinstance(exc, ToolCrashed) else "outcome_unknown",
                    note=_unknown_note(tool, exc),
                )
                await b.commit()
                await self._resolve(call, tool, args, effect)
                return
            except ToolOutputInvalid as exc:
                # The call returned, so it took effect; only its result cannot be shown.
                outcome = unshowable_outcome(tool, exc, ctx.receipts, ms_since(started))
                await self._commit_effect(call, tool, effect, outcome)
                return
            except Exception as exc:
                if await self._retry_after(call, tool, effect, attempt, exc):
                    continue
                outcome = failure_outcome(tool, exc)
                b = self.batch()
                b.add(
                    ev.EffectChanged,
                    effect_id=eid,
                    state=EffectState.FAILED,
                    receipts=safe_receipts(ctx.receipts),
                    output=outcome.output,
                    error_code=outcome.error_code,
                    note=f"{type(exc).__name__} is not declared safe to retry",
                )
                self._add_completed(b, call, outcome, eid)
                await b.commit()
                return
            outcome = ToolOutcome(
                output=r.text,
                truncated=r.truncated,
                receipts={**safe_receipts(ctx.receipts), **r.receipts},
                duration_ms=ms_since(started),
            )
            await self._commit_effect(call, tool, effect, outcome)
            return

    async def _commit_effect(
        self,
        call: ToolCall | None,
        tool: Tool,
        effect: Effect,
        outcome: ToolOutcome,
        note: str = "",
    ) -> None:
        b = self.batch()
        b.add(
            ev.EffectChanged,
            effect_id=effect.effect_id,
            state=EffectState.COMMITTED,
            receipts=outcome.receipts,
            output=outcome.output,
            note=note,
        )
        if tool.verify and tool.reconcile is not None:
            await b.commit()
            try:
                found = await self.gw.reconcile(tool, effect.idempotency_key)
                receipts = None if found is None else self.gw.render(found, tool).receipts
            except Exception as exc:
                receipts, why = None, f"verification could not run: {error_text(exc)}"
            else:
                why = "verification found no record of the call"
            if receipts is not None:
                b.add(
                    ev.EffectChanged,
                    effect_id=effect.effect_id,
                    state=EffectState.VERIFIED,
                    receipts=receipts,
                    note="confirmed through reconcile",
                )
            else:
                outcome = ToolOutcome(
                    output=f"{outcome.output}\n[warning: {why}]", receipts=outcome.receipts
                )
        if call is not None:
            self._add_completed(b, call, outcome, effect.effect_id)
        await b.commit()

    async def _resolve(
        self, call: ToolCall | None, tool: Tool, args: BaseModel | None, effect: Effect
    ) -> bool:
        """Settle an effect whose outcome is unknown; never a blind re-run.

        Returns True when it settled, False when a person has to confirm (the run now waits).
        """
        eid = effect.effect_id
        asked = self.state.latest_interrupt(effect.call_id)
        if (
            asked is not None
            and asked.effect_id == eid
            and asked.kind is InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED
            and asked.status == "answered"
            and asked.answer is not None
        ):
            await self._confirmed(call, effect, asked.answer, who=asked.answered_by or "")
            return True
        if tool.reconcile is not None:
            b = self.batch()
            b.add(ev.EffectChanged, effect_id=eid, state=EffectState.RECONCILING)
            await b.commit()
            try:
                found = await self.gw.reconcile(tool, effect.idempotency_key)
                r = None if found is None else self.gw.render(found, tool)
            except Exception as exc:
                b.add(
                    ev.EffectChanged,
                    effect_id=eid,
                    state=EffectState.OUTCOME_UNKNOWN,
                    error_code="reconcile_failed",
                    note=f"reconcile failed: {error_text(exc)}",
                )
                await b.commit()
            else:
                if r is None:
                    outcome = error_outcome(
                        "not_committed",
                        f"The call to {tool.name} did not take effect (checked with the provider "
                        f"by its idempotency key). Nothing was done; call it again if needed.",
                    )
                    b.add(
                        ev.EffectChanged,
                        effect_id=eid,
                        state=EffectState.FAILED,
                        output=outcome.output,
                        error_code=outcome.error_code,
                        note="reconcile: the provider has no record of the call",
                    )
                    if call is not None:
                        self._add_completed(b, call, outcome, eid)
                    await b.commit()
                    return True
                await self._commit_effect(
                    call,
                    tool,
                    effect,
                    ToolOutcome(output=r.text, truncated=r.truncated, receipts=r.receipts),
                    note="reconcile: the provider has the call",
                )
                return True
        elif (
            tool.idempotent
            and args is not None
            and call is not None
            and effect.attempts < MAX_DISPATCHES
            and self.state.ending is None
        ):
            await self._dispatch(call, tool, args, effect)
            return True
        await self._ask_person(effect, tool)
        return False

    async def _confirmed(
        self, call: ToolCall | None, effect: Effect, answer: dict[str, Any], *, who: str
    ) -> None:
        """Settle an effect as the person who answered its confirmation said: the call is never
        sent again, and the model is told the confirmed outcome."""
        receipt = str(answer.get("receipt") or "")
        settled = confirmation(
            self.state,
            effect.effect_id,
            happened=answer.get("outcome") == "committed",
            actor=f"user:{who}",
            note=str(answer.get("note") or ""),
            receipts={"confirmation": receipt} if receipt else None,
        )
        await self.j.commit(settled)
        if call is not None:
            await self._complete_from_effect(call, self.state.effects[effect.effect_id])

    async def _ask_person(self, effect: Effect, tool: Tool) -> None:
        """Nothing can tell what happened: a person confirms (the run waits, holding nothing)."""
        if any(i.effect_id == effect.effect_id for i in self.state.pending_interrupts.values()):
            return  # already asked; still waiting for the answer
        b = self.batch()
        b.add(
            ev.InterruptRaised,
            interrupt_id=interrupt_id_for(self.state.run_id, self.state.seq + 1),
            kind=InterruptKind.EXTERNAL_CONFIRMATION_REQUIRED.value,
            call_id=effect.call_id,
            effect_id=effect.effect_id,
            payload={
                "question": f"Did the call to {tool.name} take effect? The runtime cannot tell: "
                "it has no way to look the call up and re-sending it is not declared safe.",
                "tool": tool.name,
                "effect_kind": effect.kind,
                "arguments": effect.arguments,
                "idempotency_key": effect.idempotency_key,
                "attempts": effect.attempts,
                "receipts": dict(effect.receipts),
                "answers": ["committed", "failed"],
            },
        )
        await b.commit()

    async def _abandon(self, effect: Effect, why: str) -> None:
        b = self.batch()
        b.add(ev.EffectChanged, **abandoned(effect, why))
        await b.commit()

    # -- shared steps ---------------------------------------------------------------------

    @cached_property
    def containment(self) -> Containment | None:
        """The containment the run acts under (bound once, at its start)."""
        bound = self.state.context
        return RunContext.from_dict(bound.context).containment if bound is not None else None

    def _context(self, call: ToolCall, effect: Effect | None, attempt: int) -> ToolContext:
        asked = self.state.latest_interrupt(call.id)
        answered = asked is not None and asked.status in ("answered", "expired")
        return ToolContext(
            run_id=self.state.run_id,
            call_id=call.id,
            idempotency_key=(
                effect.idempotency_key if effect else idempotency_key(self.state.run_id, call.id)
            ),
            attempt=attempt,
            effect_id=effect.effect_id if effect else None,
            compensates=effect.compensates if effect else None,
            containment=self.containment,
            answer=asked.answer if asked is not None and answered else None,
        )

    async def _attempt(self, tool: Tool, args: BaseModel, ctx: ToolContext) -> Any:
        return await attempt(self.gw, tool, args, ctx, self.j.store, self.state)

    async def _retry_after(
        self,
        call: ToolCall,
        tool: Tool,
        effect: Effect | None,
        attempt: int,
        exc: BaseException,
        failed: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Record a failed attempt (or keep it in `failed`); wait and return True when the
        contract allows another.

        A crash is never retried: no contract declares SystemExit safe to try again.
        """
        again = not isinstance(exc, ToolCrashed) and tool.retry.allows(exc, attempt)
        delay = tool.retry.delay(attempt) if again else 0.0
        fields = {
            "call_id": call.id,
            "tool": tool.name,
            "attempt": attempt,
            "error_type": error_type(exc),
            "error": safe_text(exc) or type(exc).__name__,
            "will_retry": again,
            "delay_s": delay,
            "effect_id": effect.effect_id if effect else None,
        }
        if failed is not None:
            failed.append(fields)
        else:
            b = self.batch()
            b.add(ev.ToolAttemptFailed, **fields)
            await b.commit()
        if again:
            await asyncio.sleep(delay)
        return again

    async def _complete(self, call: ToolCall, outcome: ToolOutcome) -> None:
        b = self.batch()
        self._add_completed(b, call, outcome, None)
        await b.commit()

    async def _complete_from_effect(self, call: ToolCall, effect: Effect) -> None:
        """The effect settled (maybe by a person's answer) but the model was not told yet."""
        ok = effect.state.took_effect or effect.state is EffectState.COMPENSATING
        outcome = ToolOutcome(
            output=effect.output or (f"{effect.tool} " + ("done" if ok else "did not happen")),
            is_error=not ok,
            error_code=None if ok else (effect.error_code or "not_committed"),
            receipts=dict(effect.receipts),
        )
        b = self.batch()
        self._add_completed(b, call, outcome, effect.effect_id)
        await b.commit()

    def _add_completed(
        self, b: _Batch, call: ToolCall, outcome: ToolOutcome, effect_id: str | None
    ) -> None:
        b.add(
            ev.ToolCompleted,
            call_id=call.id,
            name=call.name,
            output=outcome.output,
            is_error=outcome.is_error,
            error_code=outcome.error_code,
            duration_ms=outcome.duration_ms,
            truncated=outcome.truncated,
            untrusted=outcome.untrusted,
            effect_id=effect_id,
        )


def confirmation(
    state: RunState,
    effect_id: str,
    *,
    happened: bool,
    actor: str,
    note: str = "",
    receipts: dict[str, str] | None = None,
    seq: int | None = None,
) -> ev.EffectChanged:
    """The event that settles an effect a person confirmed (the answer to an
    `external_confirmation_required` interrupt): the runner appends it when the run resumes,
    and the model is told the confirmed outcome; the call itself is never re-sent."""
    effect = state.effects[effect_id]
    if not effect.state.in_flight:
        raise ValueError(f"effect {effect_id} is {effect.state}, not waiting for a confirmation")
    said = note or ("confirmed done by a person" if happened else "confirmed not done by a person")
    return ev.EffectChanged(
        run_id=state.run_id,
        seq=seq if seq is not None else state.seq + 1,
        actor=actor,
        effect_id=effect_id,
        state=EffectState.COMMITTED if happened else EffectState.FAILED,
        receipts=dict(receipts or {}),
        output=f"{effect.tool}: {said}",
        error_code=None if happened else "not_committed",
        note=said,
    )


def refused(tool: str, decided: ev.PolicyDecided) -> ToolOutcome:
    """What the model is told about a call a recorded decision refused."""
    return refusal_outcome(tool, PolicyDecision.of(decided))


def _unknown_note(tool: Tool, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"{timeout_message(tool, exc).rstrip('.')}; it may have acted"
    if isinstance(exc, ToolCrashed):
        return f"{tool.name} crashed ({safe_text(exc)}); it may have acted"
    return error_text(exc)


__all__ = [
    "MAX_DISPATCHES",
    "Journal",
    "ToolRunner",
    "confirmation",
    "effect_id_for",
    "idempotency_key",
    "refused",
]
