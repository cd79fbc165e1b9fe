"""The saga: before a run fails or is cancelled, its effects are settled.

Calls still in flight are resolved (never re-sent), calls never sent are abandoned, and
committed reversible writes whose contract names a compensation are undone, newest first. Each
compensation is an effect of its own (key `<original key>/compensate`), so a crash in the middle
of the saga resumes it without undoing anything twice.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

from contextos import events as ev
from contextos.errors import ToolCrashed, ToolOutcomeUnknown, ToolOutputInvalid
from contextos.ledger import (
    MAX_DISPATCHES,
    Effect,
    EffectState,
    compensable,
    effect_id_for,
    never_sent,
)
from contextos.messages import ToolCall
from contextos.tools._invoke import error_text, error_type, safe_text
from contextos.tools.contract import Tool
from contextos.tools.effects import ToolRunner
from contextos.tools.gateway import ToolOutcome, safe_receipts, unshowable_outcome


class Saga:
    """Settles one run's effects through its tool runner."""

    def __init__(self, runner: ToolRunner) -> None:
        self.r = runner

    async def settle(self) -> bool:
        """Resolve unsettled effects, then compensate, newest first; False: a person must
        confirm an effect first."""
        for effect in list(self.r.state.effects.values()):
            if effect.compensates is not None:
                continue
            if never_sent(effect):
                await self.r._abandon(effect, "the run ended before the call was sent")
            elif effect.state.in_flight:
                tool = self.r.gw.tools.get(effect.tool)
                if tool is None:
                    return False
                if effect.state is EffectState.DISPATCHED:
                    b = self.r.batch()
                    b.add(
                        ev.EffectChanged,
                        effect_id=effect.effect_id,
                        state=EffectState.OUTCOME_UNKNOWN,
                        error_code="outcome_unknown",
                        note="the run is ending with this call in flight",
                    )
                    await b.commit()
                if not await self.r._resolve(None, tool, None, effect):
                    return False
        for effect in reversed(list(self.r.state.effects.values())):
            pending = compensable(effect) or effect.state is EffectState.COMPENSATING
            if pending and not await self._compensate(effect):
                return False
        return True

    async def _compensate(self, original: Effect) -> bool:
        comp_tool = self.r.gw.tools.get(original.compensation or "")
        if comp_tool is None:
            return True  # checked at gateway construction; nothing declared, nothing to do
        key = f"{original.idempotency_key}/compensate"
        cid = effect_id_for(key)
        call = ToolCall(
            id=f"{original.call_id}:compensate",
            name=comp_tool.name,
            arguments=json.dumps(self._compensation_arguments(original, comp_tool)),
        )
        if original.state is not EffectState.COMPENSATING:
            b = self.r.batch()
            b.add(
                ev.EffectChanged,
                effect_id=original.effect_id,
                state=EffectState.COMPENSATING,
                note=f"undoing through {comp_tool.name}",
            )
            b.add(
                ev.EffectProposed,
                effect_id=cid,
                call_id=call.id,
                tool=comp_tool.name,
                kind=comp_tool.effect.value,
                idempotency_key=key,
                contract_hash=comp_tool.contract_hash(),
                arguments=comp_tool.redacted(json.loads(call.arguments)),
                compensates=original.effect_id,
            )
            b.add(ev.EffectChanged, effect_id=cid, state=EffectState.VALIDATED)
            b.add(
                ev.EffectChanged,
                effect_id=cid,
                state=EffectState.AUTHORISED,
                note="authorised by the effect it compensates",
            )
            await b.commit()
        comp = self.r.state.effects[cid]
        if not comp.state.is_final:
            parsed = comp_tool.args_model.model_validate_json(call.arguments)
            if comp.state is EffectState.AUTHORISED:
                await self._send_compensation(call, comp_tool, parsed, comp)
            else:
                if comp.state is EffectState.DISPATCHED:
                    b = self.r.batch()
                    b.add(
                        ev.EffectChanged,
                        effect_id=cid,
                        state=EffectState.OUTCOME_UNKNOWN,
                        error_code="outcome_unknown",
                        note="the worker stopped during the compensation",
                    )
                    await b.commit()
                if comp_tool.reconcile is None and comp_tool.idempotent:
                    await self._send_compensation(call, comp_tool, parsed, comp)
                elif not await self.r._resolve(None, comp_tool, parsed, comp):
                    return False
        comp = self.r.state.effects[cid]
        b = self.r.batch()
        if comp.state.took_effect:
            b.add(
                ev.EffectChanged,
                effect_id=original.effect_id,
                state=EffectState.COMPENSATED,
                receipts={f"compensation_{k}": v for k, v in comp.receipts.items()},
                note=f"undone by {comp_tool.name} ({cid})",
            )
        else:
            b.add(
                ev.EffectChanged,
                effect_id=original.effect_id,
                state=EffectState.FAILED,
                error_code="compensation_failed",
                note=f"{comp_tool.name} did not undo it: {comp.output or comp.error_code}",
            )
        await b.commit()
        return True

    async def _send_compensation(
        self, call: ToolCall, tool: Tool, args: BaseModel, comp: Effect
    ) -> None:
        attempt_budget = max(tool.retry.attempts, 1) + (MAX_DISPATCHES if tool.idempotent else 0)
        while comp.attempts < attempt_budget:
            attempt = comp.attempts + 1
            b = self.r.batch()
            b.add(
                ev.EffectChanged,
                effect_id=comp.effect_id,
                state=EffectState.DISPATCHED,
                attempt=attempt,
            )
            await b.commit()
            ctx = self.r._context(call, comp, attempt)
            try:
                r = self.r.gw.render(await self.r.gw.dispatch(tool, args, ctx), tool)
            except ToolOutputInvalid as exc:  # it returned, so it took effect
                outcome = unshowable_outcome(tool, exc, ctx.receipts)
                await self.r._commit_effect(None, tool, comp, outcome)
                return
            except Exception as exc:
                unknown = isinstance(exc, (TimeoutError, ToolOutcomeUnknown, ToolCrashed))
                safe = (not isinstance(exc, ToolCrashed) and tool.retry.allows(exc, attempt)) or (
                    tool.idempotent and unknown
                )
                b.add(
                    ev.ToolAttemptFailed,
                    call_id=call.id,
                    tool=tool.name,
                    attempt=attempt,
                    error_type=error_type(exc),
                    error=safe_text(exc),
                    will_retry=safe,
                    effect_id=comp.effect_id,
                )
                if safe and comp.attempts < attempt_budget:
                    await b.commit()
                    await asyncio.sleep(tool.retry.delay(attempt))
                    continue
                b.add(
                    ev.EffectChanged,
                    effect_id=comp.effect_id,
                    state=EffectState.OUTCOME_UNKNOWN if unknown else EffectState.FAILED,
                    receipts=safe_receipts(ctx.receipts),
                    error_code=type(exc).__name__,
                    output=error_text(exc),
                )
                await b.commit()
                if unknown:
                    await self.r._resolve(None, tool, None, comp)
                return
            await self.r._commit_effect(
                None,
                tool,
                comp,
                ToolOutcome(output=r.text, receipts={**safe_receipts(ctx.receipts), **r.receipts}),
            )
            return

    def _compensation_arguments(self, original: Effect, comp_tool: Tool) -> dict[str, Any]:
        """The original call's arguments and receipts, by the compensation's parameter names."""
        arguments: dict[str, Any] = {}
        call = self.r.state.tool_call(original.call_id)
        if call is not None:
            try:
                arguments = json.loads(call.arguments) or {}
            except ValueError:
                arguments = {}
        pool = {**arguments, **original.receipts}
        return {k: v for k, v in pool.items() if k in comp_tool.args_model.model_fields}
