"""A workflow node's own code: run as a tool's call is (a coroutine function in a task of its
own, a plain one on a daemon thread, so the children in flight keep going), let go at the
workflow's deadline, tried again as the node's retry policy allows (each failed attempt
recorded first), and each finished item of a map or gate recorded, so that a resume reads it
back instead of calling the function on it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from pydantic_core import PydanticSerializationError, to_jsonable_python

from contextos import events as ev
from contextos.delegation import NodeRun
from contextos.graph.declared import KEY
from contextos.graph.workflow import Node
from contextos.runs import FailureReason
from contextos.state import RunState
from contextos.tools._invoke import CallTimedOut, error_text, error_type, invoke, safe_text

NO_DEADLINE_S = 1e9
"""The time limit of a node's code in a workflow without a deadline: none that matters."""


class NodeFailed(Exception):
    """A node failed; the workflow fails with its reason (internal to the graph layer)."""

    def __init__(
        self, node: str | None, reason: FailureReason, message: str, errors: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason
        self.message = message
        self.errors = errors


class CodeJournal(Protocol):
    """What a workflow's driver lends its nodes' code: the folded state, the clock, and a
    recording of events."""

    state: RunState
    clock: Callable[[], datetime]

    async def record(self, cls: type[Any], synchronous: bool = True, **fields: Any) -> None: ...


class NodeCode:
    """Runs the code of one workflow run's nodes."""

    def __init__(self, journal: CodeJournal) -> None:
        self.j = journal

    async def call(self, node: Node[Any], fn: Any, *args: Any) -> Any:
        """Run user code (sync in a thread, so children in flight keep going); what it raises
        is the node's failure."""
        try:
            return await self._in_time(node, fn, *args)
        except NodeFailed:
            raise
        except Exception as exc:
            raise _raised(node, exc) from exc

    async def _in_time(self, node: Node[Any], fn: Any, *args: Any, **kwargs: Any) -> Any:
        """User code's value, as a tool's call runs: a coroutine function in a task of its
        own, a plain one on a daemon thread (so the children in flight keep going), both let
        go at the workflow's deadline, which fails the workflow `timeout`; code is not started
        once the deadline passed."""
        deadline = self.j.state.deadline_at
        limit = NO_DEADLINE_S if deadline is None else (deadline - self.j.clock()).total_seconds()
        try:
            if limit <= 0:
                raise CallTimedOut()
            return await invoke(f"node {node.name}", fn, args, kwargs, limit)
        except CallTimedOut:
            raise NodeFailed(
                node.name,
                FailureReason.TIMEOUT,
                f"the workflow's deadline passed while node {node.name} ran",
            ) from None

    async def work(self, node: Node[Any], where: str, *args: Any) -> Any:
        """The node's function on `args` (`where`: which of its calls), tried again as its
        retry policy allows, each failed attempt recorded first: a resume counts on from the
        attempts its log holds, so no call is tried more often than the policy says. A
        function that takes one gets its intent's idempotency key."""
        retry = node.retry
        run = self.j.state.nodes[node.name]
        attempt = run.failed_attempts.get(where, 0) + 1
        key = {KEY: intent_key(self.j.state, run)} if node.keyed else {}
        while True:
            try:
                return await self._in_time(node, node.fn, *args, **key)
            except NodeFailed:
                raise
            except Exception as exc:
                if not retry.allows(exc, attempt):
                    tried = f" (attempt {attempt} of {retry.attempts})" if attempt > 1 else ""
                    raise _raised(node, exc, tried) from exc
                delay = retry.delay(attempt)
                await self.j.record(
                    ev.NodeAttemptFailed,
                    node=node.name,
                    where=where,
                    attempt=attempt,
                    error_type=error_type(exc),
                    error=safe_text(exc),
                    delay_s=delay,
                )
            await self._in_time(node, asyncio.sleep, delay)
            attempt += 1

    async def reconcile(self, node: Node[Any]) -> tuple[str, Any]:
        """The key of the node's latest intent, and what its `reconcile` found of that call:
        None when it did not act, else what it gave (raising what `reconcile` raised, or
        NodeFailed at the deadline)."""
        assert node.reconcile is not None
        key = intent_key(self.j.state, self.j.state.nodes[node.name])
        return key, await self._in_time(node, node.reconcile, key)

    async def on_item(self, node: Node[Any], index: int, item: Any) -> Any:
        """A code map's or gate's function on one item, read back when an earlier drive
        recorded it; its failure names the item."""
        done = self.j.state.nodes[node.name].item_outputs
        if index in done:
            return done[index]
        try:
            output = await self.work(node, f"item {index}", item)
            data = to_jsonable_python(output)
        except NodeFailed as failure:
            message = f"{failure.message} (item {index})"
            raise NodeFailed(failure.node, failure.reason, message, failure.errors) from None
        except PydanticSerializationError as exc:
            raise NodeFailed(
                node.name,
                FailureReason.OUTPUT_INVALID,
                f"node {node.name} gave item {index} an output that is not JSON data: {exc}",
            ) from None
        # Not waiting for the disk: lost, the item is worked on again.
        await self.j.record(
            ev.NodeItemCompleted, synchronous=False, node=node.name, index=index, output=data
        )
        return data


def intent_key(state: RunState, node: NodeRun) -> str:
    """The idempotency key of a code node's call: one per intent (`node_started`), so a
    call run again under a new intent gets a new one."""
    return f"{state.run_id}/{node.node}#{node.started_seq}"


def _raised(node: Node[Any], exc: Exception, tried: str = "") -> NodeFailed:
    """The node's failure, for an error its code raised."""
    text = f"node {node.name} raised {error_text(exc)}{tried}"
    return NodeFailed(node.name, FailureReason.NODE_FAILED, text)
