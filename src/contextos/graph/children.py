"""Child runs under delegation contracts: carve, start, drive or await, and take back.

A parent (an agent run delegating to a subagent, or a workflow's node) starts a child in three
recorded steps: `child_run_started` in its own log, with the contract and the budget carved out
of what it has left; the child run itself, created with that contract bound; and, once the
child has ended, `child_run_finished` with its validated result and an evidence summary derived
from its log. Child run ids are derived from the delegation, so a parent resumed after a crash
finds its children again: a finished one is never run again, one in flight is resumed.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import pydantic_core
from pydantic import BaseModel, ValidationError

from contextos import events as ev
from contextos.agents import Agent, Subagent, has_effect_class
from contextos.delegation import MAX_DEPTH, ChildStatus, DelegationContract, MergePolicy
from contextos.errors import ConfigError, RunNotFound
from contextos.evidence.record import record_hash
from contextos.policy.identity import RunContext
from contextos.policy.narrowing import intersect_context
from contextos.runs import Budget, FailureReason, RunId, RunStatus
from contextos.state import RunState
from contextos.store.base import EventStore, load_state
from contextos.tools.contract import Tool

INHERITED_METADATA = ("tenant_id", "user_id")
"""Labels a child run takes from its parent. Who pays for it is not one of them: the runtime
keys a run's usage on its bound principal, which a child takes from its parent's context."""

WAIT_S = 5.0
"""While a child waits for a person, its parent is handed back and looks again this often."""

_POLL_S = (0.02, 1.0)
"""How often a parent looks at a child another process drives: from, to (doubling)."""


class Journal(Protocol):
    """What a parent's driver lends its delegations: the folded state and a fenced commit."""

    state: RunState
    stop_requested: bool

    def event(self, cls: type[Any], offset: int = 1, **fields: Any) -> Any: ...

    async def commit(self, *events: ev.Event, synchronous: bool = True) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildStart:
    """What the host needs to create one child run."""

    agent: Agent
    contract: DelegationContract
    input: str
    agent_ref: str | None
    context: RunContext | None
    """The authority it acts under; None when neither its parent nor its declaration bound
    any (it is as ungoverned as its parent)."""
    metadata: dict[str, Any]
    fresh: bool = False
    """Started in this process just now: it cannot exist yet."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildHost:
    """What the runtime lends a parent to start and drive child runs (so this package never
    imports the runtime that imports it)."""

    store: EventStore
    create: Callable[[ChildStart], Awaitable[bool]]
    """Create the child run, queued, with its contract bound; False when it existed."""
    held: Callable[[RunId], bool]
    """Whether this process created the child and holds it, to drive it at once."""
    drive: Callable[[RunId, Agent, bool], Awaitable[RunState | None]]
    """Drive the child in this process if nobody holds it (or, with the flag, whoever holds
    it) and say where it stands then; None when another process drives it."""
    log: Callable[[RunId], list[ev.Event] | None]
    """The whole log of a child this process drove from its creation to its end, once (None:
    read it from the store)."""
    cancel: Callable[[RunId, str, Agent | None], Awaitable[None]]
    """Cancel a child run (and its own children); its agent settles what it started."""
    pause: Callable[[RunId, str], Awaitable[None]]
    """Pause a child run this process created and has not driven (its parent was asked to
    pause while it was being created)."""
    clock: Callable[[], datetime]
    take_over: bool = False
    """The parent was resumed by hand: it takes over the children it had started before."""
    handoff_s: float = 0.0
    """How long a new child is left to other workers before this process drives it itself
    (0 when no other process could hear of it)."""


_Item = tuple[type[Any], dict[str, Any]]
"""An event to record: its class and its fields."""


class Delegations:
    """One parent's side of its child runs: contracts, the recorded steps, the waiting."""

    def __init__(self, journal: Journal, host: ChildHost, *, parent_ref: str | None) -> None:
        self.j = journal
        self.host = host
        self.parent_ref = parent_ref
        self._queued: list[tuple[list[_Item], bool, asyncio.Future[None]]] = []
        self._writer: asyncio.Future[None] | None = None
        self.specs: dict[str, Subagent] = {}
        """The declaration of each child this process created or drove, by delegation id."""
        self.created: set[str] = set()
        """Delegations whose child run this process created."""

    @property
    def state(self) -> RunState:
        return self.j.state

    async def record(self, *items: _Item, synchronous: bool = True) -> None:
        """Append events (class and fields) together, and return once they are committed.

        Children run concurrently and each records its steps in the one log: what is asked
        for while a commit is in flight goes into the next one, in the order asked, so a wide
        fan-out costs a few commits, not one per child. `synchronous=False`: these events
        need not wait for the disk (the next synchronous commit flushes them). The commits are
        made by a task of their own, so a caller cancelled meanwhile leaves the others waiting
        on nothing; what it asked for is dropped if not written yet.
        """
        if not items:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((list(items), synchronous, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())
        await done

    async def _write(self) -> None:
        await asyncio.sleep(0)  # siblings asking in this same turn of the loop join in
        while self._queued:
            batch = [b for b in self._queued if not b[2].done()]
            self._queued = []
            fields = [item for items, _, _ in batch for item in items]
            if not fields:
                continue
            events = [self.j.event(cls, offset=i, **f) for i, (cls, f) in enumerate(fields, 1)]
            try:
                await self.j.commit(*events, synchronous=any(sync for _, sync, _ in batch))
            except BaseException as exc:  # every caller hears of it
                for _, _, done in [*batch, *self._queued]:
                    if done.done():
                        continue
                    if isinstance(exc, Exception):
                        done.set_exception(exc)
                    else:
                        done.cancel()
                self._queued = []
                if not isinstance(exc, Exception):
                    raise
                return
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)

    # -- contracts --------------------------------------------------------------------------

    def contract(
        self,
        spec: Subagent,
        *,
        key: str,
        objective: str,
        input_refs: tuple[str, ...] = (),
        node: str | None = None,
        call_id: str | None = None,
        index: int = 0,
        reserved: Sequence[DelegationContract] = (),
        merge_policy: MergePolicy = MergePolicy.PARENT_VALIDATES,
    ) -> DelegationContract:
        """The contract for one delegation, its budget carved out of what the parent has left
        (`reserved`: contracts about to start alongside it). ConfigError when it would nest
        deeper than MAX_DEPTH."""
        s = self.state
        parent_depth = s.delegation.depth if s.delegation is not None else 0
        if parent_depth >= MAX_DEPTH:
            raise ConfigError(
                f"run {s.run_id} is {parent_depth} delegations deep: it may not delegate further",
                run_id=s.run_id,
            )
        wanted = spec.expected_output
        now = self.host.clock()
        budget, deadline = carve(s, spec.budget or spec.agent.budget, now, reserved=reserved)
        return DelegationContract(
            delegation_id=key,
            parent_run_id=s.run_id,
            child_run_id=RunId(f"{s.run_id}.{key}"),
            root_run_id=s.delegation.root if s.delegation is not None else None,
            agent_name=spec.agent.name,
            objective=objective,
            input_refs=input_refs,
            allowed_tools=child_tools(spec, parent_context(s)),
            forbidden_effects=tuple(spec.forbidden_effects),
            budget=budget,
            deadline_at=deadline,
            expected_output=wanted.__name__ if wanted is not None else None,
            expected_output_schema=wanted.model_json_schema() if wanted is not None else None,
            node=node,
            call_id=call_id,
            index=index,
            depth=parent_depth + 1,
            merge_policy=merge_policy,
        )

    def child_ref(self, spec: Subagent) -> str | None:
        return f"{self.parent_ref}#{spec.name}" if self.parent_ref else None

    # -- the child's life -------------------------------------------------------------------

    async def ensure(
        self, contract: DelegationContract, spec: Subagent, input: str, *, fresh: bool = False
    ) -> None:
        """Create the child run if it does not exist yet (after a crash between the parent's
        record and the creation, the same contract creates it now); a child that exists
        already is one this process may take over (see ChildHost.take_over)."""
        self.specs[contract.delegation_id] = spec
        parent = parent_context(self.state)
        reach = tuple(t for t in passed_down(spec, parent) if t not in contract.allowed_tools)
        context = None
        if self.state.context is not None or _narrows(spec, contract):
            context = intersect_context(
                parent,
                parent_run_id=self.state.run_id,
                tools=(*contract.allowed_tools, *reach),
                scopes=spec.scopes,
                clearance=spec.clearance,
                containment=spec.containment,
            )
        metadata = {k: v for k, v in self.state.metadata.items() if k in INHERITED_METADATA}
        start = ChildStart(
            agent=spec.child_agent,
            contract=contract,
            input=input,
            agent_ref=self.child_ref(spec),
            context=context,
            metadata=metadata,
            fresh=fresh,
        )
        if await self.host.create(start):
            self.created.add(contract.delegation_id)

    async def settle(
        self, contract: DelegationContract, spec: Subagent, *, wake_paused: bool = False
    ) -> RunState | None:
        """Drive the child here, or wait while another process does, until it ends; None when
        it waits for a person or is paused (or this process is stopping) and the parent must
        wait too. With `wake_paused` (its parent was paused with it, and resumed) a paused
        child is driven on."""
        child_id = contract.child_run_id
        pause = _POLL_S[0]
        take_over = self.host.take_over and contract.delegation_id not in self.created
        handoff = self.host.handoff_s if contract.delegation_id in self.created else 0.0
        if self.host.held(child_id) and not self.j.stop_requested:  # nobody else can have it
            driven = await self.host.drive(child_id, spec.child_agent, take_over)
            if driven is not None:
                return driven if driven.is_terminal else None
        while True:
            summary = await self.host.store.get_run(child_id)
            if summary.status.is_terminal:
                return await load_state(self.host.store, child_id)
            woken = wake_paused and summary.status is RunStatus.PAUSED
            if (summary.status.is_idle and not woken) or self.j.stop_requested:
                return None  # a person has it, or paused it
            if handoff:  # let an idle worker elsewhere claim it first
                await asyncio.sleep(handoff)
                handoff = 0.0
                continue
            driven = await self.host.drive(child_id, spec.child_agent, take_over)
            if driven is not None:
                # ended, waiting for a person, or handed back (this process is stopping)
                return driven if driven.is_terminal else None
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])

    async def finished(
        self, contract: DelegationContract, spec: Subagent, child: RunState
    ) -> dict[str, Any]:
        """The fields of `child_run_finished` for an ended child: its result, validated against
        the contract's expected output (merge policy `parent_validates`), its evidence, and
        the hash of its DecisionRecord (a child stores none: its parent's log vouches for it,
        and the parent's own stored record for that)."""
        log = self.host.log(contract.child_run_id)
        return await finished_fields(self.host.store, contract, child, spec.expected_output, log)

    async def pause(self, contract: DelegationContract, reason: str) -> None:
        await self.host.pause(contract.child_run_id, reason)

    async def cancel_running(self, reason: str, *, node: str | None = None) -> None:
        """Cancel every child still running (the parent is failing or being cancelled), or
        only those of one node."""
        for child in list(self.state.children.values()):
            if not child.finished and node in (None, child.contract.node):
                await self.cancel(child.contract, reason)

    async def cancel(self, contract: DelegationContract, reason: str) -> None:
        """Cancel one child run (one not created yet is not found, and stays to be seen to)."""
        spec = self.specs.get(contract.delegation_id)
        agent = spec.child_agent if spec is not None else None
        await self.host.cancel(contract.child_run_id, reason, agent)


# -- budgets --------------------------------------------------------------------------------


def remaining(state: RunState, reserved: Sequence[DelegationContract] = ()) -> Budget:
    """What a run has left to hand out: its budget minus what it and its finished children
    spent, and minus what its running children (and `reserved`) may still spend."""
    b = state.budget
    running = [state.children[key].contract for key in state.running_children]
    holds = [*running, *reserved]
    turns = b.max_turns - state.turns - state.child_turns - sum(c.budget.max_turns for c in holds)
    tokens = cost = None
    if b.max_tokens is not None:
        spent = state.usage.total_tokens + state.child_usage.total_tokens
        tokens = b.max_tokens - spent - sum(c.budget.max_tokens or 0 for c in holds)
    if b.max_cost_usd is not None:
        spent_usd = state.usage.cost_usd + state.child_usage.cost_usd
        cost = b.max_cost_usd - spent_usd - sum(c.budget.max_cost_usd or 0.0 for c in holds)
    return replace(
        b,
        max_turns=max(turns, 0),
        max_tokens=None if tokens is None else max(tokens, 0),
        max_cost_usd=None if cost is None else max(cost, 0.0),
    )


def carve(
    state: RunState,
    declared: Budget,
    now: datetime,
    *,
    reserved: Sequence[DelegationContract] = (),
) -> tuple[Budget, datetime | None]:
    """A child's budget and deadline: what it declares, cut to what the parent has left."""
    left = remaining(state, reserved)
    deadline = state.deadline_at
    if declared.deadline_s is not None:
        own = now + timedelta(seconds=declared.deadline_s)
        deadline = own if deadline is None else min(deadline, own)
    budget = replace(
        declared,
        max_turns=min(declared.max_turns, left.max_turns),
        max_tokens=_least(declared.max_tokens, left.max_tokens),
        max_cost_usd=_least(declared.max_cost_usd, left.max_cost_usd),
        deadline_s=None if deadline is None else max((deadline - now).total_seconds(), 0.0),
    )
    return budget, deadline


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


# -- authority ------------------------------------------------------------------------------


def _narrows(spec: Subagent, contract: DelegationContract) -> bool:
    """Whether a delegation from an unbound parent narrows anything (then the child is bound
    to the local operator's authority cut down to it)."""
    declared = (spec.scopes, spec.clearance, spec.containment)
    every_tool = {t.name for t in spec.child_agent.tool_list}
    return any(d is not None for d in declared) or set(contract.allowed_tools) != every_tool


def parent_context(state: RunState) -> RunContext:
    """The authority a run acts under (the local operator's for a run bound to none, which is
    what a child of it is checked against)."""
    if state.context is None:
        return RunContext.local()
    return RunContext.from_dict(state.context.context)


def child_tools(spec: Subagent, parent: RunContext) -> tuple[str, ...]:
    """The child agent's tools it may call: declared allowed, of no forbidden effect class,
    and allowed to the parent."""
    return tuple(
        t.name
        for t in spec.child_agent.tool_list
        if (spec.tools is None or any(fnmatch.fnmatchcase(t.name, g) for g in spec.tools))
        and _permitted(t, spec.forbidden_effects, parent)
    )


def passed_down(spec: Subagent, parent: RunContext) -> tuple[str, ...]:
    """The tools of the child's own subagents (and theirs) it may hand down: of no forbidden
    effect class and allowed to the parent. Its allowlist holds them so that a grandchild can
    be given them; the child itself has no such tools to call."""
    out: dict[str, None] = {}
    todo = list(spec.child_agent.delegates)
    while todo:
        sub = todo.pop()
        for t in sub.child_agent.tool_list:
            if _permitted(t, spec.forbidden_effects, parent):
                out[t.name] = None
        todo.extend(sub.child_agent.delegates)
    return tuple(out)


def _permitted(t: Tool, forbidden: Sequence[str], parent: RunContext) -> bool:
    return not has_effect_class(t, forbidden) and parent.allows_tool(t.name)


# -- what comes back ------------------------------------------------------------------------


async def finished_fields(
    store: EventStore,
    contract: DelegationContract,
    child: RunState,
    expected: type[BaseModel] | None,
    log: Sequence[ev.Event] | None = None,
) -> dict[str, Any]:
    """The fields of `child_run_finished` for an ended child (`log`: its events, when at hand)."""
    status, result, reason, message = merge(child, expected)
    if log is None:
        log = await store.read(contract.child_run_id)
    return {
        "delegation_id": contract.delegation_id,
        "child_run_id": contract.child_run_id,
        "status": status,
        "result": result,
        "evidence": evidence(child),
        "usage": child.usage + child.child_usage,
        "turns": child.turns + child.child_turns,
        "reason": reason,
        "message": message,
        "record_hash": await record_hash(log, child),
    }


async def ended_children(store: EventStore, parent: RunState) -> list[dict[str, Any]]:
    """`child_run_finished` fields for each child of `parent` that ended while its parent did
    not take it in (nobody drove the parent, which is being cancelled): so that what they
    spent counts in the parent's. A completed child's result is taken as it is, unvalidated:
    the parent ends without using it."""
    found: list[dict[str, Any]] = []
    for key in parent.running_children:
        contract = parent.children[key].contract
        try:
            child = await load_state(store, contract.child_run_id)
        except RunNotFound:  # its start was cut short before it was created
            continue
        if child.is_terminal:
            found.append(await finished_fields(store, contract, child, None))
    return found


def merge(
    child: RunState, expected: type[BaseModel] | None
) -> tuple[ChildStatus, Any, str | None, str]:
    """(status, result, reason, message) of an ended child as its parent takes it in.

    The parent validates: a completed child's result that does not match `expected` is
    rejected, and a child that failed because its answer never matched it failed with
    `output_invalid` (not a verifier's judgement on a well-formed answer)."""
    if child.status is RunStatus.COMPLETED:
        if expected is None:
            return ChildStatus.COMPLETED, child.output, None, ""
        try:
            value = expected.model_validate(child.structured_output)
        except ValidationError as exc:
            return (
                ChildStatus.REJECTED,
                None,
                FailureReason.OUTPUT_INVALID.value,
                f"the result is not a valid {expected.__name__}: {_problems(exc)}",
            )
        return ChildStatus.COMPLETED, value.model_dump(mode="json"), None, ""
    status = {
        RunStatus.FAILED: ChildStatus.FAILED,
        RunStatus.CANCELLED: ChildStatus.CANCELLED,
        RunStatus.EXPIRED: ChildStatus.EXPIRED,
    }[child.status]
    reason = child.failure_reason.value if child.failure_reason else child.status.value
    failed_check = child.failure_reason is FailureReason.VERIFICATION_FAILED
    if failed_check and expected is not None and not _answers(child, expected):
        reason = FailureReason.OUTPUT_INVALID.value
    return status, None, reason, child.failure_message or ""


def _answers(child: RunState, expected: type[BaseModel]) -> bool:
    """Whether the child's last answer is a valid `expected` (as JSON, fenced or not)."""
    last = child.last_message
    text = last.content.strip() if last is not None and last.role == "assistant" else ""
    text = text.removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        expected.model_validate_json(text)
    except ValidationError:
        return False
    return True


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )


def evidence(child: RunState) -> dict[str, Any]:
    """What a child did, from its folded log: never a message of its transcript (its spend
    and status are recorded beside it)."""
    calls: dict[str, int] = {}
    for m in child.messages:
        if m.role == "tool" and m.name:
            calls[m.name] = calls.get(m.name, 0) + 1
    return {
        "tool_calls": calls,
        "tool_errors": child.tool_errors,
        "denied": sum(1 for d in child.policy_by_call.values() if d.decision == "deny"),
        "effects": {e.effect_id: f"{e.tool}: {e.state.value}" for e in child.effects.values()},
        "children": len(child.children),
        "events": child.seq,
    }


def child_input(objective: str, given: Any = None) -> str:
    """The text a child run starts from: its objective and what it is given, nothing else."""
    if given is None:
        return objective
    data = pydantic_core.to_json(given).decode()
    return f"{objective}\n\nInput ({type(given).__name__}):\n{data}"


def outcome_text(finished: dict[str, Any]) -> str:
    """What a planner's model is told about a finished delegation (the fields of its
    child_run_finished): the result or why there is none, and the evidence summary (JSON)."""
    body: dict[str, Any] = {"status": str(finished["status"])}
    if finished["status"] is ChildStatus.COMPLETED:
        body["result"] = finished["result"]
    else:
        body["reason"] = finished["reason"]
        body["message"] = finished["message"]
    usage = finished["usage"]
    body["spent"] = {
        "turns": finished["turns"],
        "tokens": usage.total_tokens,
        "cost_usd": usage.cost_usd,
    }
    body["evidence"] = finished["evidence"]
    return json.dumps(body, ensure_ascii=False, sort_keys=True)


__all__ = [
    "INHERITED_METADATA",
    "WAIT_S",
    "ChildHost",
    "ChildStart",
    "Delegations",
    "Journal",
    "carve",
    "child_input",
    "child_tools",
    "evidence",
    "passed_down",
    "merge",
    "outcome_text",
    "parent_context",
    "remaining",
]
