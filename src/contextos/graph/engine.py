"""A workflow run, driven node by node from its folded state.

Every node records `node_started`, then its work (child runs started and finished, loop rounds),
then `node_completed` with its output, validated against the node's type before any node after
it reads it. Resuming is "fold the log, run what is not completed": a completed node is read
back from its recorded output and never runs again; a child run that finished is read back, one
in flight is resumed. Nodes that read only completed nodes run at the same time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from contextos import events as ev
from contextos.agents import Subagent
from contextos.delegation import (
    ChildRun,
    ChildStatus,
    DelegationContract,
    MergePolicy,
    NodeStatus,
)
from contextos.errors import ConcurrencyConflict, RunNotFound
from contextos.events import utcnow
from contextos.graph.children import WAIT_S, ChildHost, Delegations, child_input, remaining
from contextos.graph.code import NodeCode, NodeFailed
from contextos.graph.declared import type_name
from contextos.graph.effects import ASKED, Acted, Outcomes
from contextos.graph.review import Reviews, Revise, revision_key
from contextos.graph.workflow import ClaimCheck, Node, Route, Workflow
from contextos.records.interrupts import interrupt_id_for
from contextos.runs import FailureReason, RunStatus
from contextos.state import RunState, apply
from contextos.store.base import EventStore, append_after, load_state

_REQUESTS = (ev.RunEnding, ev.RunPauseRequested)
"""What a person may append to a workflow while a driver has it: the driver takes them in."""


class _Ending(Exception):
    """Internal: someone asked the workflow to end (`RunEnding`); it stops its nodes and ends."""


class _Waiting:
    """A node that cannot finish now: a child run waits for a person, or this process stops."""


WAITING = _Waiting()


class _Skipped:
    """A node a route left out: it does not run, and gives nothing."""


SKIPPED = _Skipped()

NOT_RUN = _Skipped()
"""An item of a `first` map not started: an item before it gave a result already."""


class _Answered(Exception):
    """Internal: a `first` map's item waited for budget until an item gave the result."""


async def _together(work: Iterable[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Run `work` concurrently, each one's result in order; the first to fail stops the others.

    What failed is raised as itself, not in a group (a node's failure ahead of the rest), so
    that the callers above can tell a failed node, a workflow asked to end, a run another
    writer took and a crash apart by their type.
    """
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(w) for w in work]
    except BaseExceptionGroup as failed:
        first = (failed.subgroup(NodeFailed) or failed).exceptions[0]
        raise first from None
    return [t.result() for t in tasks]


class WorkflowDriver:
    """Drives one workflow run until it ends, or waits on a child run."""

    def __init__(
        self,
        *,
        store: EventStore,
        workflow: Workflow,
        state: RunState,
        worker_id: str,
        host: ChildHost,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.workflow = workflow
        self.state = state
        self.worker_id = worker_id
        self.actor = f"worker:{worker_id}"
        self.clock = clock
        self.step_started = time.monotonic()
        self.stop_requested = False
        self.unpausing = False
        """Resumed after a pause: its paused children are driven on."""
        self._asking = False
        """A question was put to a person in this drive (see `may_ask`)."""
        self._ending = False
        self.stop_reason: str | None = None
        self.wake_after_s: float | None = None
        self.on_commit: Callable[[tuple[ev.Event, ...]], Awaitable[None]] | None = None
        self.children = Delegations(self, host, parent_ref=state.agent_ref)
        self.code = NodeCode(self)
        self.reviews = Reviews(self, may_ask=self.may_ask)
        self.outcomes = Outcomes(self, self.code, may_ask=self.may_ask)
        self._admit = asyncio.Condition()
        """Taken to carve a child's budget: one at a time, and only once the budget allows."""
        self._starting: list[DelegationContract] = []
        """Contracts carved and not recorded yet: what they may spend is held already."""
        self._answered: set[str] = set()
        """The `first` maps that have their result: no item of theirs starts any more."""

    # -- recording --------------------------------------------------------------------------

    def event(self, cls: type[Any], offset: int = 1, **fields: Any) -> Any:
        fields.setdefault("actor", self.actor)
        seq = self.state.seq + offset
        if cls is ev.InterruptRaised:  # its id names the seq it gets
            fields["interrupt_id"] = interrupt_id_for(self.state.run_id, seq)
        return cls(run_id=self.state.run_id, seq=seq, **fields)

    async def commit(self, *events: ev.Event, synchronous: bool = True) -> None:
        """Append events (the fence), then fold them in with a person's requests that came in
        meanwhile."""
        events = await append_after(
            self.store, self.state, events, requests=_REQUESTS, synchronous=synchronous
        )
        for e in events:
            apply(self.state, e)
        if self.on_commit is not None:
            await self.on_commit(events)
        self._take_in_requests()

    def _take_in_requests(self) -> None:
        """`_Ending` once someone asked the workflow to end; once asked to pause, it starts
        nothing new and pauses when what runs has stopped."""
        if self.state.ending is not None and not self.state.is_terminal and not self._ending:
            raise _Ending
        if self.state.pause_requested is not None and not self.stop_requested:
            self.stop_requested = True
            self.stop_reason = "paused"

    async def record(self, cls: type[Any], synchronous: bool = True, **fields: Any) -> None:
        await self.children.record((cls, fields), synchronous=synchronous)

    async def after_run(self) -> None:
        """A workflow has no middleware stack to tell."""

    # -- the run ----------------------------------------------------------------------------

    async def drive(self) -> RunState:
        s = self.state
        try:
            await self._begin()
            if s.ending is not None and not s.is_terminal:
                raise _Ending  # asked to end while nobody drove it
            if s.status is RunStatus.RUNNING:
                await self._run()
        except _Ending:
            await self._end()
        return s

    async def _run(self) -> None:
        s = self.state
        try:
            result = await self._graph()
        except NodeFailed as failure:
            await self._fail(failure)
            return
        if isinstance(result, _Waiting):
            await self._requests_since()
            if s.pause_requested is not None and not s.pending_interrupts:
                asked = s.pause_requested
                paused = self.event(
                    ev.RunPaused, reason=asked.reason, actor=asked.actor, causation_id=asked.seq
                )
                await self.commit(paused)
                return
            if s.pending_interrupts:
                return  # a person is asked; their answer queues the workflow again
            if not self.stop_requested:
                self.stop_requested = True
                self.stop_reason = "waiting for a child run that waits for a person"
                self.wake_after_s = WAIT_S
            return
        node = self.workflow.output_node
        data = node.adapter.dump_python(result, mode="json")
        await self.record(
            ev.RunCompleted, output=node.adapter.dump_json(result).decode(), structured_output=data
        )

    async def _requests_since(self) -> None:
        """Fold in what a person asked while the workflow appended nothing (it waited on its
        children); anything else appended means another writer has the run."""
        tail = await self.store.read(self.state.run_id, after_seq=self.state.seq)
        if not all(isinstance(e, _REQUESTS) for e in tail):
            raise ConcurrencyConflict(self.state.run_id, self.state.seq, tail[-1].seq)
        for e in tail:
            apply(self.state, e)
        self._take_in_requests()

    async def _pause_asked_meanwhile(self) -> bool:
        """Whether someone asked the workflow to pause since its last commit (which folds a
        request in); a child created meanwhile was not there for the request to pause."""
        if self.stop_requested:
            return True
        if (await self.store.get_run(self.state.run_id)).last_seq == self.state.seq:
            return False
        tail = await self.store.read(self.state.run_id, after_seq=self.state.seq)
        if any(isinstance(e, ev.RunPauseRequested) for e in tail):
            self.stop_requested, self.stop_reason = True, "paused"
        return self.stop_requested

    async def _begin(self) -> None:
        s = self.state
        if s.status in (RunStatus.QUEUED, RunStatus.PAUSED):
            # Resumed after a pause: the children it paused with it are driven on.
            self.unpausing = s.status is RunStatus.PAUSED or s.unpaused
            await self.commit(self.event(ev.RunStarted, worker_id=self.worker_id))
        elif s.status is RunStatus.RUNNING and s.worker_id != self.worker_id:
            await self.commit(
                self.event(ev.RuntimeCrashDetected, previous_worker_id=s.worker_id, last_seq=s.seq),
                self.event(ev.RunStarted, offset=2, worker_id=self.worker_id, recovered=True),
            )

    async def _graph(self) -> Any:
        """Run every wave of nodes; the output node's value, or WAITING."""
        values: dict[str, Any] = {"input": self.workflow.read_input(self.state.input)}
        for wave in self.workflow.levels():
            self.step_started = time.monotonic()
            deadline = self.state.deadline_at
            if deadline is not None and self.clock() >= deadline:
                raise NodeFailed(None, FailureReason.TIMEOUT, "the workflow's deadline passed")
            values.update({n.name: SKIPPED for n in wave if self._skipped(n, values)})
            wave = [n for n in wave if n.name not in values]
            results = await _together(self._node(n, values) for n in wave)
            if any(isinstance(r, _Waiting) for r in results) or self.stop_requested:
                return WAITING
            values.update({n.name: r for n, r in zip(wave, results, strict=True)})
        output = self.workflow.output_node.name
        if values[output] is SKIPPED:
            raise NodeFailed(
                None,
                FailureReason.NODE_FAILED,
                f"the output node {output} was skipped: a route took another branch; bring "
                "the branches together with flow.join and make that the output",
            )
        return values[output]

    def _skipped(self, node: Node[Any], values: dict[str, Any]) -> bool:
        """Whether a route left the node out: it is a target not chosen, or it reads a skipped
        node (a join only when every branch it joins was skipped)."""
        upstream = [values[a] is SKIPPED for a in node.after]
        if all(upstream) if node.kind == "join" else any(upstream):
            return True
        route = self.workflow.route_into(node.name)
        if route is None:
            return False
        source = self.state.nodes.get(route.source)
        return source is None or source.route != node.name

    async def _fail(self, failure: NodeFailed) -> None:
        """Stop every child still running, record what they became, then the failure."""
        s = self.state
        if s.ending is not None:  # a child failed because the workflow is being ended
            await self._end()
            return
        items = await self._stop_children(
            f"workflow {s.run_id} failed" + (f" at node {failure.node}" if failure.node else "")
        )
        if failure.node is not None and failure.node not in s.nodes:
            # It failed before it started (the function that lists a map's items raised).
            kind = self.workflow.node(failure.node).kind
            items.append((ev.NodeStarted, {"node": failure.node, "kind": kind}))
        if failure.node is not None:
            items.append(
                (
                    ev.NodeFailed,
                    {
                        "node": failure.node,
                        "reason": failure.reason,
                        "message": failure.message,
                        "errors": failure.errors,
                    },
                )
            )
        error = {"code": failure.reason.value, "node": failure.node}
        items.append(
            (ev.RunFailed, {"reason": failure.reason, "message": failure.message, "error": error})
        )
        await self.children.record(*items)

    async def _end(self) -> None:
        """Finish a workflow someone asked to end (`RunEnding`): stop its children, record
        what they became, so their spend counts in the workflow's, then the end."""
        s = self.state
        ending = s.ending
        assert ending is not None
        self._ending = True  # what follows is the ending itself
        items = await self._stop_children(f"workflow {s.run_id} was {ending.outcome}")
        if ending.outcome == "cancelled":
            items.append((ev.RunCancelled, {"reason": ending.reason, "actor": ending.actor}))
        else:  # only a cancel asks a workflow to end today; any other end is a failure
            failed = FailureReason.NODE_FAILED
            why = ending.message or ending.reason
            error = {"code": failed.value, **ending.error}
            items.append((ev.RunFailed, {"reason": failed, "message": why, "error": error}))
        await self.children.record(*items)

    async def _stop_children(self, reason: str) -> list[tuple[type[Any], dict[str, Any]]]:
        """Cancel the children still running; what each ended child became, to record."""
        await self.children.cancel_running(reason)
        items: list[tuple[type[Any], dict[str, Any]]] = []
        for child in self.state.children.values():
            if child.finished:
                continue
            spec = self._spec_of(child)
            try:
                ended = await load_state(self.store, child.contract.child_run_id)
            except RunNotFound:
                continue  # recorded as started, never created (paused or stopped just then)
            if ended.is_terminal and spec is not None:
                items.append(
                    (ev.ChildRunFinished, await self.children.finished(child.contract, spec, ended))
                )
        return items

    def _spec_of(self, child: ChildRun) -> Subagent | None:
        node = child.contract.node
        return self.workflow.node(node).spec if node is not None else None

    # -- nodes ------------------------------------------------------------------------------

    async def _node(self, node: Node[Any], values: dict[str, Any]) -> Any:
        """The node's output: read back when completed, else run to completion (or WAITING)."""
        done = self.state.nodes.get(node.name)
        if done is not None and done.status is NodeStatus.COMPLETED:
            return node.adapter.validate_python(done.output)
        args = [values[a] for a in node.after]
        match node.kind:
            case "code" if node.effect is not None:
                return await self._at_most_once(node, args)
            case "code" | "reduce":
                await self._started(node)
                return await self._complete(node, await self.code.work(node, "", *args))
            case "agent":
                await self._started(node)
                child = await self._child(node, node.name, 0, args[0], self._ref(node.after[0]))
                if child is None:
                    return WAITING
                return await self._complete(node, _result(node, child))
            case "map" | "gate":
                return await self._fan_out(node, args[0])
            case "loop":
                return await self._loop(node, args[0])
            case "join":
                await self._started(node)
                return await self._complete(node, next(a for a in args if a is not SKIPPED))
            case _:
                raise AssertionError(node.kind)

    async def _started(self, node: Node[Any], items: list[Any] | None = None) -> None:
        if node.name not in self.state.nodes:
            # Nothing outside waits on it, so it need not wait for the disk (the next commit
            # flushes it).
            await self.record(ev.NodeStarted, False, node=node.name, kind=node.kind, items=items)

    async def _at_most_once(self, node: Node[Any], args: list[Any]) -> Any:
        """Run a code node that declares an effect at most once: its intent is on disk before
        its code runs; an intent found without an outcome means it may have acted, and only
        its reconcile or a person can say whether it did (see `effects`)."""
        started = self.state.nodes.get(node.name)
        if started is not None:
            found = await self.outcomes.of(node, started)
            if found is ASKED:
                return WAITING
            if isinstance(found, Acted):
                return await self._complete(node, found.output)
        await self.record(ev.NodeStarted, node=node.name, kind=node.kind, effect=node.effect)
        return await self._complete(node, await self.code.work(node, "", *args))

    def may_ask(self) -> bool:
        """Whether the workflow may put a question to a person now: one at a time, as
        answering one queues it again (the next is asked then)."""
        if self.state.pending_interrupts or self._asking:
            return False
        self._asking = True
        return True

    async def _complete(self, node: Node[Any], value: Any, **extra: Any) -> Any:
        """Validate the output against the node's type, then record it."""
        try:
            checked = node.adapter.validate_python(value)
        except ValidationError as exc:
            errors = _problems(exc)
            raise NodeFailed(
                node.name,
                FailureReason.OUTPUT_INVALID,
                f"node {node.name} gave output that is not a valid {type_name(node.output)}: "
                + "; ".join(errors),
                errors,
            ) from None
        output = node.adapter.dump_python(checked, mode="json")
        route = self.workflow.route_of(node.name)
        if route is not None:
            extra["route"] = await self._choose(node, route, checked)
        await self.record(ev.NodeCompleted, node=node.name, output=output, **extra)
        return checked

    async def _choose(self, node: Node[Any], route: Route, output: Any) -> str:
        """The node a route takes for this output: asked once, then recorded with it."""
        for predicate, target in route.cases:
            holds = await self.code.call(node, predicate, output)
            if not isinstance(holds, bool):
                raise NodeFailed(
                    node.name,
                    FailureReason.NODE_FAILED,
                    f"a route predicate of node {node.name} returned {type(holds).__name__}, "
                    "not a bool",
                )
            if holds:
                return target
        if route.otherwise is None:
            raise NodeFailed(
                node.name,
                FailureReason.NODE_FAILED,
                f"no route out of node {node.name} holds for its output; add otherwise=NODE "
                "to the route",
            )
        return route.otherwise

    def _ref(self, node: str) -> str:
        """Where in this run's log a node's input is kept (`RUN#SEQ`)."""
        s = self.state
        done = s.nodes.get(node)
        return f"{s.run_id}#{done.completed_seq if done is not None else 1}"

    # -- child runs -------------------------------------------------------------------------

    async def _child(
        self, node: Node[Any], key: str, index: int, given: Any, ref: str
    ) -> ChildRun | None:
        """One child run of a node, from start to its recorded finish, and then each revision
        a person asked for; None while one waits."""
        revise: Revise | None = None
        while True:
            taken = await self._revision(node, key, index, given, ref, revise)
            if not isinstance(taken, Revise):
                return taken
            revise = taken

    async def _revision(
        self, node: Node[Any], base: str, index: int, given: Any, ref: str, revise: Revise | None
    ) -> ChildRun | Revise | None:
        """One revision of a node's child (the first, or the one `revise` asks for), from
        start to its recorded finish and review."""
        assert node.spec is not None
        spec = node.spec
        d = self.children
        number = 1 if revise is None else revise.number
        key = revision_key(base, number)
        child = self.state.children.get(key)
        if child is not None and child.finished:
            return await self.reviews.taken_in(node, child, number=number)
        if child is None:
            objective = _objective(node, given)
            if revise is not None:
                objective = revise.objective(objective)
            contract = await self._start(node, spec, key, index, objective, ref)
            if self.stop_requested:
                return None  # pausing or stopping: the run is created on resume
        else:
            contract = child.contract
        text = child_input(contract.objective, given)
        await d.ensure(contract, spec, text, fresh=child is None)
        if child is None and await self._pause_asked_meanwhile():
            # The request came in while the child was being created, too late for it.
            await d.pause(contract, f"its workflow {self.state.run_id} was paused")
            return None
        if node.name in self._answered:
            # A sibling gave the map's result while this child was being created: the cancel
            # of the children still running did not find it yet.
            await d.cancel(contract, f"another item of node {node.name} gave the result first")
        ended = await d.settle(contract, spec, wake_paused=self.unpausing)
        if ended is None:
            return None
        # Not waiting for the disk: lost, it is recorded again from the ended child.
        fields = await d.finished(contract, spec, ended)
        await d.record((ev.ChildRunFinished, fields), synchronous=False)
        async with self._admit:
            self._admit.notify()  # what it did not spend is back: the next in line may start
        return await self.reviews.taken_in(node, self.state.children[key], number=number)

    async def _start(
        self, node: Node[Any], spec: Subagent, key: str, index: int, objective: str, ref: str
    ) -> Any:
        """Record child_run_started; a child whose budget would be cut short while siblings
        hold part of the workflow's waits for one of them to give its unspent part back.

        The waiting children are woken one at a time, each passing the turn on once it
        starts: woken all at once, every one of a large map's would work out the budget left
        at each sibling's end, which grows with the square of the map."""
        declared = spec.budget or spec.agent.budget
        async with self._admit:
            while self._running() and _short(remaining(self.state, self._starting), declared):
                await self._admit.wait()
            self._admit.notify()
            if node.name in self._answered:
                raise _Answered
            contract = self.children.contract(
                spec,
                key=key,
                objective=objective,
                input_refs=(ref,),
                node=node.name,
                index=index,
                reserved=self._starting,
                merge_policy=MergePolicy.PERSON_REVIEWS
                if node.review
                else MergePolicy.PARENT_VALIDATES,
            )
            self._starting.append(contract)
        try:
            # The child's creation, a synchronous commit after this one, makes it durable.
            await self.children.record(
                (ev.ChildRunStarted, {"contract": contract}), synchronous=False
            )
        finally:
            self._starting.remove(contract)
        return contract

    def _running(self) -> bool:
        return bool(self._starting) or bool(self.state.running_children)

    # -- fan-out, gates, loops --------------------------------------------------------------

    async def _fan_out(self, node: Node[Any], upstream: Any) -> Any:
        items = await self._items(node, upstream)
        ref = f"{self.state.run_id}#{self.state.nodes[node.name].started_seq}"
        slots = asyncio.Semaphore(node.concurrency)
        # `first` starts no item once one has given a result, and cancels the children still
        # running (on resume too: one found in flight is cancelled, then read back ended).
        if node.merge == "first" and any(
            c.contract.node == node.name and c.status is ChildStatus.COMPLETED
            for c in self.state.children.values()
        ):
            await self._took_first(node)

        async def one(i: int, item: Any) -> Any:
            async with slots:
                key = f"{node.name}.{i}"
                answered = node.name in self._answered
                if answered and (node.spec is None or key not in self.state.children):
                    return NOT_RUN
                if self.stop_requested and (node.spec is None or key not in self.state.children):
                    return WAITING  # pausing or stopping: no item starts now
                try:
                    if node.spec is None:
                        output = await self.code.on_item(node, i, item)
                    else:
                        child = await self._child(node, key, i, item, ref)
                        output = WAITING if child is None else _result(node, child, each=True)
                except NodeFailed as failure:
                    if node.merge == "all" or failure.reason is FailureReason.TIMEOUT:
                        raise
                    return failure
                except _Answered:
                    return NOT_RUN
                answers = node.merge == "first" and not isinstance(output, _Waiting)
                if answers and node.name not in self._answered:
                    await self._took_first(node, i)
                return output

        outputs = await _together(one(i, item) for i, item in enumerate(items))
        if any(isinstance(o, _Waiting) for o in outputs):
            if node.review:  # the results that wait for review, in one question
                await self.reviews.ask_together(node)
            return WAITING
        if node.kind == "map":
            return await self._complete(node, _merged(node, items, outputs))
        return await self._complete(node, _gated(items, outputs))

    async def _took_first(self, node: Node[Any], index: int | None = None) -> None:
        """A `first` map has its result: its children still running are not needed."""
        self._answered.add(node.name)
        which = f"item {index}" if index is not None else "an item"
        await self.children.cancel_running(
            f"{which} of node {node.name} gave the result first", node=node.name
        )

    async def _items(self, node: Node[Any], upstream: Any) -> list[Any]:
        """The items of a map or gate: recorded when it started, so every resume has the same
        ones in the same order, whatever the function that lists them does."""
        started = self.state.nodes.get(node.name)
        if started is not None and started.items is not None:
            return list(node.items_adapter.validate_python(started.items))
        if node.over is None:
            raw = upstream
        elif isinstance(node.over, str):
            raw = getattr(upstream, node.over, None)
        else:
            raw = await self.code.call(node, node.over, upstream)
        not_list = f"the items of node {node.name} are not a list of {type_name(node.item)}"
        if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
            raise NodeFailed(
                node.name, FailureReason.OUTPUT_INVALID, f"{not_list}: got {type(raw).__name__}"
            )
        try:
            items = list(node.items_adapter.validate_python(list(raw)))
        except (ValidationError, TypeError) as exc:
            raise NodeFailed(
                node.name, FailureReason.OUTPUT_INVALID, f"{not_list}: {exc}"
            ) from None
        await self._started(node, node.items_adapter.dump_python(items, mode="json"))
        return items

    async def _loop(self, node: Node[Any], state: Any) -> Any:
        await self._started(node)
        rounds = self.state.nodes[node.name].rounds
        value = node.adapter.validate_python(rounds[-1]) if rounds else state
        done = len(rounds)
        assert node.until is not None
        while True:
            if done and await self.code.call(node, node.until, value):
                return await self._complete(node, value, converged=True)
            if done >= node.max_rounds:
                if node.on_limit == "accept":
                    return await self._complete(node, value, converged=False)
                raise NodeFailed(
                    node.name,
                    FailureReason.NOT_CONVERGED,
                    f"node {node.name} did not converge in {node.max_rounds} rounds",
                )
            if self.stop_requested and f"{node.name}.r{done + 1}" not in self.state.children:
                return WAITING  # pausing or stopping: the next round starts on resume
            done += 1
            if node.spec is None:
                value = await self.code.work(node, f"round {done}", value)
            else:
                ref = (
                    self._ref(node.after[0])
                    if done == 1
                    else f"{self.state.run_id}#{self.state.seq}"
                )
                child = await self._child(node, f"{node.name}.r{done}", done, value, ref)
                if child is None:
                    return WAITING
                value = _result(node, child)
            try:
                value = node.adapter.validate_python(value)
            except ValidationError as exc:
                raise NodeFailed(
                    node.name,
                    FailureReason.OUTPUT_INVALID,
                    f"round {done} of node {node.name} gave state that is not a valid "
                    f"{type_name(node.output)}: {exc.error_count()} problem(s)",
                ) from None
            output = node.adapter.dump_python(value, mode="json")
            await self.record(ev.NodeRoundCompleted, node=node.name, round=done, output=output)


def _result(node: Node[Any], child: ChildRun, *, each: bool = False) -> Any:
    """A finished child's validated result, or the node's failure."""
    if child.status is ChildStatus.COMPLETED:
        return child.result
    invalid = child.status is ChildStatus.REJECTED or child.reason == FailureReason.OUTPUT_INVALID
    reason = FailureReason.OUTPUT_INVALID if invalid else FailureReason.CHILD_FAILED
    which = f" (item {child.contract.index})" if each else ""
    raise NodeFailed(
        node.name,
        reason,
        f"child run {child.contract.child_run_id}{which} of node {node.name} ended "
        f"{child.status.value}" + (f" ({child.reason}): {child.message}" if child.reason else ""),
    )


FAILURES_SHOWN = 3
"""How many of its items' failures the message of a `first` map that found nothing quotes."""


def _merged(node: Node[Any], items: list[Any], outputs: list[Any]) -> Any:
    """A map's output from its items' outputs (and failures), by its merge policy."""
    if node.merge == "all":
        return outputs
    failed = [
        (item, o) for item, o in zip(items, outputs, strict=True) if isinstance(o, NodeFailed)
    ]
    results = [o for o in outputs if not isinstance(o, NodeFailed | _Skipped)]
    if node.merge == "collect":
        return {
            "results": results,
            "failed": [
                {"item": item, "reason": f.reason.value, "message": f.message} for item, f in failed
            ],
        }
    if results:
        return results[0]
    shown = "; ".join(f.message for _, f in failed[:FAILURES_SHOWN])
    if len(failed) > FAILURES_SHOWN:
        shown += f"; and {len(failed) - FAILURES_SHOWN} more"
    raise NodeFailed(
        node.name,
        failed[0][1].reason if failed else FailureReason.NODE_FAILED,
        f"no item of node {node.name} gave a result: {shown or 'it has no items'}",
    )


def _gated(items: list[Any], verdicts: list[Any]) -> dict[str, Any]:
    """A gate's output from each item's verdict (a ClaimCheck, its data, or a bool)."""
    passed: list[Any] = []
    rejected: list[dict[str, Any]] = []
    for item, verdict in zip(items, verdicts, strict=True):
        check = (
            ClaimCheck(holds=verdict)
            if isinstance(verdict, bool)
            else ClaimCheck.model_validate(verdict)
        )
        if check.holds:
            passed.append(item)
        else:
            rejected.append({"item": item, "reason": check.reason})
    return {"passed": passed, "rejected": rejected}


def _problems(exc: ValidationError) -> tuple[str, ...]:
    return tuple(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )


def _objective(node: Node[Any], given: Any) -> str:
    said = node.objective(given) if callable(node.objective) else node.objective
    if node.kind == "gate":
        claim = f": {said}" if said else ""
        return (
            f"Try to disprove the claim about the item below{claim}. Answer holds=false, with "
            "the evidence as the reason, if you can; holds=true if it survives every check."
        )
    return said or f"Do the {node.name} step for the input below."


def _short(left: Any, declared: Any) -> bool:
    """Whether a child would get less than it declares out of what is left."""
    if left.max_turns < declared.max_turns:
        return True
    for name in ("max_tokens", "max_cost_usd"):
        # A child that declares no cap of its own takes what is left: it waits for nobody.
        mine, theirs = getattr(declared, name), getattr(left, name)
        if mine is not None and theirs is not None and theirs < mine:
            return True
    return False


__all__ = ["WorkflowDriver"]
