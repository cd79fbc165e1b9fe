"""A tool call in flight: one dispatch, cut short when another process starts ending its run.

The call runs in the caller's task. Only a call still running after `CANCEL_POLL_S` gets a
watcher that polls the run's log for `run_ending`, so a quick call costs no extra task or
status read.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from contextos import events as ev
from contextos.state import RunState
from contextos.store.base import EventStore
from contextos.tools._invoke import stray_cancellation
from contextos.tools.contract import Tool, ToolContext
from contextos.tools.gateway import Gateway

CANCEL_POLL_S = 0.25
"""How often an in-flight tool call checks whether its run is being ended."""


class Ending(Exception):
    """Internal: the run is being ended (RunEnding arrived) while a tool was in flight."""


async def attempt(
    gw: Gateway, tool: Tool, args: BaseModel, ctx: ToolContext, store: EventStore, state: RunState
) -> Any:
    """One dispatch of `tool` for the run whose folded `state` is given, cut short (Ending)
    if another process starts ending the run meanwhile; within the run's deadline."""
    deadline = state.deadline_at
    remaining = (deadline - now()).total_seconds() if deadline is not None else None
    task = asyncio.current_task()
    assert task is not None
    watcher = _EndingWatcher(store, state, task)
    handle = asyncio.get_running_loop().call_later(CANCEL_POLL_S, watcher.start)
    try:
        result = await gw.dispatch(tool, args, ctx, timeout_s=remaining)
    except asyncio.CancelledError:
        if not watcher.cut:
            if task.cancelling():
                raise  # the runtime is stopping this run (cancel, lease lost, shutdown)
            # raised by code around the call (a middleware), not by the runtime
            raise stray_cancellation(tool.name) from None
    finally:
        handle.cancel()
        watcher.stop()
    if watcher.cut:
        task.uncancel()  # the cancellation was ours, not the caller's
        raise Ending("the run is being ended; the call was cancelled in flight")
    return result


async def ending_requested(store: EventStore, state: RunState) -> bool:
    """Whether someone appended `run_ending` to the run since `state` was folded."""
    summary = await store.get_run(state.run_id)
    if summary.last_seq <= state.seq:
        return False
    tail = await store.read(state.run_id, after_seq=state.seq)
    return any(isinstance(e, ev.RunEnding) for e in tail)


class _EndingWatcher:
    """Polls a run's log while a slow call is in flight; cancels the call if the run is ending."""

    def __init__(self, store: EventStore, state: RunState, task: asyncio.Task[Any]) -> None:
        self.store = store
        self.state = state
        self.task = task
        self.cut = False
        self.polling: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.polling = asyncio.ensure_future(self._poll())

    def stop(self) -> None:
        if self.polling is not None and not self.polling.done():
            self.polling.cancel()

    async def _poll(self) -> None:
        while True:
            try:
                ending = await ending_requested(self.store, self.state)
            except Exception:
                return  # the store is unreachable: the call's own commit will say so
            if ending:
                self.cut = True
                self.task.cancel()
                return
            await asyncio.sleep(CANCEL_POLL_S)


def now() -> datetime:
    return datetime.now(UTC)


def ms_since(started: datetime) -> float:
    return (now() - started).total_seconds() * 1000
