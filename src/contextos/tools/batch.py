"""Independent read calls of one model turn, run at the same time.

A turn's tool calls run one after another, except that consecutive calls to read-only tools,
not yet decided on and counted by no policy limit, run together: their policy decisions are
recorded first, in one commit; then the calls run concurrently; then every result is recorded
in call order, in one commit, so the log reads the same whichever call finished first. A call
that needs a person stays pending for the one-at-a-time path, and a batch never reaches past a
call with an effect: writes keep their order.

A crash while a batch runs loses only results that were never recorded; reads have no effect,
so they are simply run again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from contextos import events as ev
from contextos.messages import ToolCall
from contextos.records.decisions import Decision
from contextos.tools.effects import ToolRunner, refused
from contextos.tools.gateway import ToolOutcome


def independent_reads(runner: ToolRunner, pending: Sequence[ToolCall]) -> list[ToolCall]:
    """The leading pending calls that may run together: two or more, or none."""
    together: list[ToolCall] = []
    for call in pending:
        if not _independent(runner, call):
            break
        together.append(call)
    return together if len(together) > 1 else []


def _independent(runner: ToolRunner, call: ToolCall) -> bool:
    tool = runner.gw.tools.get(call.name)
    s = runner.state
    if tool is None or tool.has_effect:
        return False
    if call.id in s.policy_by_call or s.latest_interrupt(call.id) is not None:
        return False  # under way on the one-at-a-time path (an approval, a person's answer)
    hook = runner.gw.policy
    if hook is None:
        return True
    counts = getattr(hook, "counts", None)
    # A hook that cannot say whether its limits count this call is asked one call at a time.
    return callable(counts) and not counts(call.name)


async def run_together(runner: ToolRunner, calls: Sequence[ToolCall]) -> None:
    """Decide, run and record `calls` (from `independent_reads`) as described above."""
    runner.check_manifest()
    parsed = {call.id: runner.gw.parse(call) for call in calls}
    if runner.gw.policy is not None:
        b = runner.batch()
        for call in calls:
            p = parsed[call.id]
            if not isinstance(p, ToolOutcome):
                b.add(ev.PolicyDecided, **await runner.decision(call, *p))
        await b.commit(synchronous=False)  # the results' commit flushes it
    decided = runner.state.policy_by_call

    async def one(call: ToolCall) -> tuple[list[dict[str, Any]], ToolOutcome | None]:
        p = parsed[call.id]
        if isinstance(p, ToolOutcome):
            return [], p
        tool, args = p
        d = decided.get(call.id)
        if d is not None and d.decision == Decision.DENY:
            return [], refused(tool.name, d)
        if d is not None and d.decision == Decision.REQUIRE_APPROVAL:
            return [], None  # left pending: the one-at-a-time path asks the person
        failed: list[dict[str, Any]] = []
        return failed, await runner.dispatch_read(call, tool, args, failed)

    results = await asyncio.gather(*(one(call) for call in calls))
    b = runner.batch()
    for call, (failed, outcome) in zip(calls, results, strict=True):
        for fields in failed:
            b.add(ev.ToolAttemptFailed, **fields)
        if outcome is not None:
            b.add(ev.ToolCompleted, **runner.completed_fields(call, outcome))
    await b.commit()


__all__ = ["independent_reads", "run_together"]
