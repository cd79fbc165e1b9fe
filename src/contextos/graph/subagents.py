"""Delegation from an agent: its model calls `delegate_to_<name>`, and each call is a child run.

The calls of one model turn go through policy like any tool call, then start their child runs
together (the budgets carved in one go), run them concurrently, and record what came back in
call order: `child_run_finished` (the validated result, the evidence) and the `tool_completed`
the model reads, which holds the result and the evidence summary, never the child's transcript.
"""

from __future__ import annotations

import asyncio
from typing import Any

from contextos import events as ev
from contextos.agents import Agent, Subagent
from contextos.delegation import ChildStatus, DelegationContract
from contextos.errors import ConfigError
from contextos.graph.children import (
    WAIT_S,
    ChildHost,
    Delegations,
    child_input,
    outcome_text,
)
from contextos.loop import Driver
from contextos.messages import ToolCall
from contextos.records.decisions import Decision
from contextos.state import RunState
from contextos.tools.effects import ToolRunner, refused
from contextos.tools.gateway import ToolOutcome, error_outcome


class SubagentCalls:
    """The Delegator of one agent run: calls to its subagents' tools become child runs."""

    def __init__(self, agent: Agent, host: ChildHost, *, parent_ref: str | None) -> None:
        self.subagents = {s.tool_name: s for s in agent.delegates}
        self.host = host
        self.parent_ref = parent_ref
        self._delegations: Delegations | None = None

    def handles(self, tool: str) -> bool:
        return tool in self.subagents

    async def run(self, driver: Driver, calls: list[ToolCall]) -> None:
        if self._delegations is None:
            self._delegations = Delegations(driver, self.host, parent_ref=self.parent_ref)
        d = self._delegations
        runner = driver.tools
        runner.check_manifest()
        await self._decide(d, runner, calls)
        cleared = await self._clear(d, runner, calls)
        if cleared is None:
            return  # the run now waits for a person's approval of one of them
        started = await self._start(d, cleared)
        ended = await asyncio.gather(*(self._settle(d, *item) for item in started))
        items: list[tuple[type[Any], dict[str, Any]]] = []
        for (call, sub, contract, _, _), child in zip(started, ended, strict=True):
            if child is None:
                continue
            fields = await d.finished(contract, sub, child)
            failed = fields["status"] is not ChildStatus.COMPLETED
            outcome = ToolOutcome(
                output=outcome_text(fields),
                is_error=failed,
                error_code="child_failed" if failed else None,
            )
            items += [
                (ev.ChildRunFinished, fields),
                (ev.ToolCompleted, runner.completed_fields(call, outcome)),
            ]
        await d.record(*items)
        if any(child is None for child in ended) and not driver.state.is_terminal:
            driver.stop_requested = True
            driver.stop_reason = driver.stop_reason or "waiting for a child run"
            driver.wake_after_s = WAIT_S

    async def _decide(self, d: Delegations, runner: ToolRunner, calls: list[ToolCall]) -> None:
        """Ask policy about every call not decided on yet, in one commit."""
        s = d.state
        if runner.gw.policy is None:
            return
        decisions: list[tuple[type[Any], dict[str, Any]]] = []
        for call in calls:
            if call.id in s.policy_by_call or call.id in s.child_by_call:
                continue
            parsed = runner.gw.parse(call)
            if not isinstance(parsed, ToolOutcome):
                decisions.append((ev.PolicyDecided, await runner.decision(call, *parsed)))
        await d.record(*decisions)

    async def _clear(
        self, d: Delegations, runner: ToolRunner, calls: list[ToolCall]
    ) -> list[tuple[ToolCall, Subagent, str]] | None:
        """The calls cleared to delegate, with their tasks; refused and malformed calls are
        recorded as completed. None when one needs a person's approval first (raised now)."""
        s = d.state
        cleared: list[tuple[ToolCall, Subagent, str]] = []
        done: list[tuple[type[Any], dict[str, Any]]] = []
        pending = {c.id for c in s.pending_tool_calls}
        for call in calls:
            if call.id not in pending:
                continue
            sub = self.subagents[call.name]
            if call.id in s.child_by_call:
                child = s.children[s.child_by_call[call.id]]
                cleared.append((call, sub, child.contract.objective))
                continue
            parsed = runner.gw.parse(call)
            if isinstance(parsed, ToolOutcome):
                done.append((ev.ToolCompleted, runner.completed_fields(call, parsed)))
                continue
            tool, args = parsed
            decided = s.policy_by_call.get(call.id)
            if decided is not None and decided.decision == Decision.REQUIRE_APPROVAL:
                await d.record(*done)
                again = await runner.reconsider(call, tool, None, decided)
                if again is None:
                    return None
                return await self._clear(d, runner, calls)  # decided anew: look again
            if decided is not None and decided.decision == Decision.DENY:
                outcome = refused(tool.name, decided)
                done.append((ev.ToolCompleted, runner.completed_fields(call, outcome)))
                continue
            cleared.append((call, sub, str(getattr(args, "task", ""))))
        await d.record(*done)
        return cleared

    async def _start(
        self, d: Delegations, cleared: list[tuple[ToolCall, Subagent, str]]
    ) -> list[tuple[ToolCall, Subagent, DelegationContract, str, bool]]:
        """Record child_run_started for the calls that have no child yet (budgets carved
        together), and return every cleared call with its contract and child input."""
        s = d.state
        carved: list[DelegationContract] = []
        refusals: list[tuple[type[Any], dict[str, Any]]] = []
        out: list[tuple[ToolCall, Subagent, DelegationContract, str, bool]] = []
        for call, sub, task in cleared:
            fresh = call.id not in s.child_by_call
            if not fresh:
                contract = s.children[s.child_by_call[call.id]].contract
            else:
                try:
                    contract = d.contract(
                        sub,
                        key=call.id,
                        objective=task,
                        input_refs=(f"{s.run_id}#{_seq_of_call(s, call)}",),
                        call_id=call.id,
                        reserved=carved,
                    )
                except ConfigError as exc:
                    outcome = error_outcome("delegation_refused", exc.message)
                    refusals.append((ev.ToolCompleted, ToolRunner.completed_fields(call, outcome)))
                    continue
                carved.append(contract)
            out.append((call, sub, contract, child_input(task), fresh))
        # Not waiting for the disk: each child's creation, a synchronous commit, comes next.
        await d.record(
            *[(ev.ChildRunStarted, {"contract": c}) for c in carved],
            *refusals,
            synchronous=not carved,
        )
        return out

    async def _settle(
        self,
        d: Delegations,
        call: ToolCall,
        sub: Subagent,
        contract: DelegationContract,
        input: str,
        fresh: bool,
    ) -> RunState | None:
        await d.ensure(contract, sub, input, fresh=fresh)
        return await d.settle(contract, sub)


def _seq_of_call(state: RunState, call: ToolCall) -> int:
    """Seq of the model answer that made `call`."""
    for message, seq in zip(reversed(state.messages), reversed(state.message_seqs), strict=True):
        if message.role == "assistant" and any(c.id == call.id for c in message.tool_calls):
            return seq
    return state.seq


__all__ = ["SubagentCalls"]
