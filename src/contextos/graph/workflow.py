"""Workflows: typed nodes joined by edges that carry validated data, declared in plain Python.

    flow = Workflow("kb-scan", input=ScanRequest)
    found = flow.map("scan", scanner, over="folders", output=Findings, concurrency=3)
    links = flow.reduce("dedup", dedupe)              # plain code, no model
    checked = flow.gate("recheck", disprove, over="links", claim="this link is dead")
    report = flow.agent("report", writer, output=Report)

Each call declares a node and returns its handle, a `Node[T]` whose `T` is what it gives the
nodes after it. A node reads the node declared just before it (the workflow's input for the
first) unless `after=` names others. Agent nodes run their agent as a child run under a
delegation contract; code, reduce and loop bodies are functions; a gate's verifier is a
function or an agent that tries to disprove a claim about each item. Types are checked when
the workflow is declared (a function's parameters against what the nodes it reads give) and
again at run time, when every output is validated before a node after it runs.

The structure (nodes, kinds, edges, types, functions' code, agents' identities) is the
workflow's identity: a run never resumes under a different graph.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Generic, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from contextos.agents import Agent, Subagent, load_ref
from contextos.errors import ConfigError
from contextos.graph.declared import (
    accepts,
    check_list_field,
    check_params,
    code_of,
    positive,
    problems,
    returns_of,
    schema,
    takes_key,
    type_hints_of,
    type_name,
)
from contextos.graph.outputs import ClaimCheck, Collected, Gated, ItemFailure, Rejected
from contextos.runs import Budget
from contextos.tools.contract import EffectKind, RetryPolicy

T = TypeVar("T")

NodeKind = Literal["agent", "code", "map", "reduce", "gate", "loop", "join"]
OnLimit = Literal["fail", "accept"]
Merge = Literal["all", "collect", "first"]
"""How a map takes in its items' results: `all` must give one (a failed item fails the node),
`collect` keeps the results there are and the failures beside them, `first` takes the result
of the first item (in item order) that gives one and starts no item after that."""

DEFAULT_BUDGET = Budget(max_turns=1000)
"""A workflow's budget when it declares none: what all its child runs together may spend."""
REVISIONS = 3
"""How many times, by default, a person reviewing a node's child may send its result back."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,47}")


@dataclass(frozen=True, eq=False, kw_only=True)
class Node(Generic[T]):
    """A declared node. `T` is its output's type: what the nodes after it receive."""

    name: str
    kind: NodeKind | Literal["input"]
    output: Any
    """The output's type (a Pydantic model, a list of them, `str`, …)."""
    after: tuple[str, ...] = ()
    """The nodes whose outputs it reads, in the order its function takes them."""
    fn: Callable[..., Any] | None = None
    """Code: the function (per item for map and gate, per round for loop)."""
    spec: Subagent | None = None
    """An agent node's child run, or the agent a map, gate or loop runs per item or round."""
    over: str | Callable[[Any], Any] | None = None
    """Map and gate: where the items come from (a field of the input, or a function of it)."""
    item: Any = None
    """Map and gate: the type of one item."""
    objective: str | Callable[[Any], str] | None = None
    """Agent work: what the child run is told to do (a text, or a function of its input)."""
    until: Callable[[Any], bool] | None = None
    """Loop: the stop condition, asked after each round."""
    max_rounds: int = 0
    """Loop: rounds at most."""
    on_limit: OnLimit = "fail"
    """Loop: what reaching `max_rounds` without converging does (fail the workflow, or accept
    the last round's state)."""
    concurrency: int = 1
    """Map and gate: items worked on at once."""
    merge: Merge = "all"
    """Map: how it takes in its items' results."""
    effect: EffectKind | None = None
    """Code: what its function does to the world, when it does anything (then it runs at most
    once: an intent is recorded first, and a resume that finds no outcome does not run it)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Code: when a call of its function that raised is tried again (by default never)."""
    review: bool = False
    """Agent, or map of an agent: a person reviews each child's result before anything
    uses it (merge policy `person_reviews`)."""
    revisions: int = REVISIONS
    """Under review: how many times a person may send a child's result back to be revised
    (each revision a child run of its own, given the earlier result and the comments)."""
    reconcile: Callable[[str], Any] | None = None
    """Code with an effect: `reconcile(idempotency_key)` (sync or async) says whether a call
    stopped before its output was recorded acted: None when it did not, else what the node
    gave."""

    @cached_property
    def keyed(self) -> bool:
        """Whether the function takes the call's `idempotency_key` (a keyword-only one)."""
        return self.fn is not None and takes_key(self.fn)

    @cached_property
    def adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(self.output)

    @cached_property
    def items_adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(list[self.item])  # type: ignore[name-defined]

    def identity(self) -> dict[str, Any]:
        """Everything about the node that changes what a run does, as JSON data."""
        identity: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "after": list(self.after),
            "output": schema(self.output),
            "fn": code_of(self.fn),
            "agent": self.spec.identity() if self.spec is not None else None,
            "over": self.over if isinstance(self.over, str) else code_of(self.over),
            "objective": self.objective
            if isinstance(self.objective, str)
            else code_of(self.objective),
            "until": code_of(self.until),
            "max_rounds": self.max_rounds,
            "on_limit": self.on_limit,
        }
        if self.merge != "all":  # absent otherwise: a node keeps the hash it had
            identity["merge"] = self.merge
        if self.effect is not None:
            identity["effect"] = self.effect.value
        if self.retry != RetryPolicy():  # absent otherwise: a node keeps the hash it had
            identity["retry"] = self.retry.identity()
        if self.reconcile is not None:
            identity["reconcile"] = code_of(self.reconcile)
        if self.review:
            identity["review"] = True
            if self.revisions != REVISIONS:
                identity["revisions"] = self.revisions
        return identity


@dataclass(frozen=True, kw_only=True)
class Route:
    """Conditional edges out of one node: after it completes, the first case whose predicate
    holds for its output names the one node that runs next; the other targets are skipped."""

    source: str
    """The node whose output decides."""
    cases: tuple[tuple[Callable[[Any], bool], str], ...]
    """(predicate on the source's output, target node), asked in order."""
    otherwise: str | None = None
    """The target when no predicate holds (None: that fails the workflow)."""

    @property
    def targets(self) -> tuple[str, ...]:
        return (*(t for _, t in self.cases), *filter(None, [self.otherwise]))

    def identity(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "cases": [[code_of(p), t] for p, t in self.cases],
            "otherwise": self.otherwise,
        }


@dataclass(kw_only=True)
class _Build:
    nodes: dict[str, Node[Any]] = field(default_factory=dict)
    output: str | None = None
    routes: dict[str, Route] = field(default_factory=dict)
    """Conditional edges, by source node."""


class Workflow:
    """A graph of typed nodes; run it like an agent (`Runtime.run(flow, input)`)."""

    def __init__(
        self,
        name: str,
        *,
        input: Any,
        version: str = "1",
        budget: Budget | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"workflow name {name!r}: use letters, digits, _ and -", name=name)
        self.name = name
        self.input_type = input
        """The type of the workflow's input: a Pydantic model, or any type Pydantic checks."""
        self.version = version
        """Bump when you change behaviour on purpose."""
        self.budget = budget or DEFAULT_BUDGET
        """What the whole workflow may spend: every child run's budget is carved out of it."""
        self.start: Node[Any] = Node(name="input", kind="input", output=input)
        """The workflow's input, as a node others can read (`after=flow.start`)."""
        try:
            self.start.adapter  # noqa: B018 (built now, so a type it cannot check fails here)
        except Exception:
            raise ConfigError(
                f"workflow {name}: its input type {type_name(input)} is not one Pydantic can "
                "check; use a BaseModel subclass or a type such as int or list[str]",
                workflow=name,
            ) from None
        self._build = _Build()

    # -- declaring --------------------------------------------------------------------------

    def code(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        after: Node[Any] | Sequence[Node[Any]] | None = None,
        output: Any = None,
        effect: EffectKind | str | None = None,
        retry: RetryPolicy | None = None,
        reconcile: Callable[[str], Any] | None = None,
    ) -> Node[Any]:
        """A node that runs `fn` (sync or async) on the outputs of the nodes it reads.

        A function that acts on the world declares it (`effect="write"`, `"reversible_write"`
        or `"irreversible"`) and runs at most once: its intent is recorded before it runs,
        and a workflow stopped after that and before its output was recorded does not run it
        again on resume. `reconcile(idempotency_key)` (sync or async), when given, looks up
        what became of that call: None when it did not act (the node runs again, under a new
        key), else the node's output. Without one, or when it raises, a person is asked
        whether it acted (`input_required`); left unanswered, it fails `outcome_unknown`. A
        function with a keyword-only `idempotency_key` parameter gets its call's key (stable
        for one intent) to hand to the service it calls.

        `retry` tries a call that raised again, up to `retry.attempts` in all, when the error
        is one of `retry.safe_on` (one the function raises only when it did nothing), each
        failed attempt recorded; by default a raise fails the node at once."""
        try:
            kind = EffectKind(effect) if effect is not None else None
        except ValueError:
            raise ConfigError(
                f"node {name!r}: effect is one of {', '.join(e.value for e in EffectKind)}",
                node=name,
            ) from None
        if kind is EffectKind.READ:
            kind = None
        keyed = "reconcile" if reconcile is not None else "idempotency_key" if takes_key(fn) else ""
        if kind is None and keyed:
            raise ConfigError(
                f"node {name!r}: {keyed} is for a function that acts on the world; declare "
                "its effect (effect='write')",
                node=name,
            )
        return self._code("code", name, fn, after, output, kind, retry, reconcile)

    def reduce(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        after: Node[Any] | Sequence[Node[Any]] | None = None,
        output: Any = None,
        retry: RetryPolicy | None = None,
    ) -> Node[Any]:
        """A code node that folds a fan-out's list of outputs into one (deduplicate, merge);
        `retry` as for `code`."""
        upstream = self._after(name, after, 1)
        source = self._build.nodes.get(upstream[0]) or self.start
        if get_origin(source.output) is not list:
            raise ConfigError(
                f"node {name!r} reduces a list, but {source.name!r} gives "
                f"{type_name(source.output)}; read a map or a node that gives a list",
                node=name,
            )
        return self._code("reduce", name, fn, after, output, retry=retry)

    def agent(
        self,
        name: str,
        agent: Agent | Subagent,
        *,
        after: Node[Any] | None = None,
        output: Any = None,
        objective: str | Callable[[Any], str] | None = None,
        review: bool = False,
        revisions: int = REVISIONS,
    ) -> Node[Any]:
        """A node run by an agent as a child run: it is given the input (and `objective`)
        only, under a contract narrowed from the workflow's authority and budget. With
        `review`, a person accepts or rejects its result before anything uses it (the
        workflow waits, `input_required`); a rejected result fails the node; one sent back
        with comments is revised by a new child run, up to `revisions` times."""
        spec = self._spec(name, agent, output)
        _check_review(name, spec, review, revisions)
        out = spec.expected_output or str
        return self._add(
            Node(
                name=name,
                kind="agent",
                output=out,
                after=self._after(name, after, 1),
                spec=spec,
                objective=objective,
                review=review,
                revisions=revisions,
            )
        )

    def map(
        self,
        name: str,
        worker: Agent | Subagent | Callable[[Any], Any],
        *,
        over: str | Callable[[Any], Any] | None = None,
        item: Any = None,
        after: Node[Any] | None = None,
        output: Any = None,
        objective: str | Callable[[Any], str] | None = None,
        concurrency: int = 4,
        merge: Merge = "all",
        retry: RetryPolicy | None = None,
        review: bool = False,
        revisions: int = REVISIONS,
    ) -> Node[Any]:
        """Fan out: run `worker` (an agent, as one child run per item, or a function) on each
        item, `concurrency` at a time. With `merge="all"` the node gives the list of outputs,
        in item order, and an item that fails fails the node; `"collect"` gives
        `Collected[item, output]`; `"first"` gives the output of the first item that has one.
        `retry` (a function worker's) as for `code`, counted per item; `review` and
        `revisions` (an agent worker's) as for `agent`, per item: a rejected item is a
        failed one."""
        if merge not in ("all", "collect", "first"):
            raise ConfigError(f"node {name!r}: merge is 'all', 'collect' or 'first'", node=name)
        upstream = self._after(name, after, 1)
        item_type = self._item_type(name, upstream[0], over, item)
        spec = fn = None
        if isinstance(worker, Agent | Subagent):
            spec = self._spec(name, worker, output)
            each = spec.expected_output or str
        else:
            fn = worker
            each = output or returns_of(name, worker)
            check_params(name, worker, [item_type])
        _no_retry_for_agents(name, spec, retry)
        _check_review(name, spec, review, revisions)
        merged: Any = each  # first
        if merge == "all":
            merged = list[each]  # type: ignore[valid-type]
        elif merge == "collect":
            merged = Collected[item_type, each]  # type: ignore[valid-type]
        return self._add(
            Node(
                name=name,
                kind="map",
                output=merged,
                after=upstream,
                fn=fn,
                spec=spec,
                over=over,
                item=item_type,
                objective=objective,
                concurrency=positive(name, concurrency),
                merge=merge,
                retry=_retry(name, retry),
                review=review,
                revisions=revisions,
            )
        )

    def gate(
        self,
        name: str,
        check: Agent | Subagent | Callable[[Any], Any],
        *,
        over: str | Callable[[Any], Any] | None = None,
        item: Any = None,
        after: Node[Any] | None = None,
        claim: str | Callable[[Any], str] | None = None,
        concurrency: int = 4,
        retry: RetryPolicy | None = None,
    ) -> Node[Any]:
        """A verification gate: for each item, `check` tries to disprove a claim about it (a
        function returning a ClaimCheck or a bool, or an agent answering a ClaimCheck, one
        child run per item); the node gives `Gated[item]`: what passed, what was rejected.
        `retry` (a function's) as for `code`, counted per item."""
        upstream = self._after(name, after, 1)
        item_type = self._item_type(name, upstream[0], over, item)
        spec = fn = None
        if isinstance(check, Agent | Subagent):
            spec = self._spec(name, check, ClaimCheck)
        else:
            fn = check
            check_params(name, check, [item_type])
        _no_retry_for_agents(name, spec, retry)
        return self._add(
            Node(
                name=name,
                kind="gate",
                output=Gated[item_type],  # type: ignore[valid-type]
                after=upstream,
                fn=fn,
                spec=spec,
                over=over,
                item=item_type,
                objective=claim,
                concurrency=positive(name, concurrency),
                retry=_retry(name, retry),
            )
        )

    def loop(
        self,
        name: str,
        body: Agent | Subagent | Callable[[Any], Any],
        *,
        until: Callable[[Any], bool],
        max_rounds: int,
        after: Node[Any] | None = None,
        on_limit: OnLimit = "fail",
        objective: str | Callable[[Any], str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> Node[Any]:
        """A convergence loop: `body` turns the state into the next one (a function, or an
        agent as one child run per round) until `until(state)` holds, at most `max_rounds`
        times; then `on_limit` decides: fail the workflow, or accept the last state. `retry`
        (a function body's) as for `code`, counted per round."""
        upstream = self._after(name, after, 1)
        state_type = (self._build.nodes.get(upstream[0]) or self.start).output
        spec = fn = None
        if isinstance(body, Agent | Subagent):
            spec = self._spec(name, body, state_type)
        else:
            fn = body
            check_params(name, body, [state_type])
        _no_retry_for_agents(name, spec, retry)
        if on_limit not in ("fail", "accept"):
            raise ConfigError(f"node {name!r}: on_limit is 'fail' or 'accept'", node=name)
        return self._add(
            Node(
                name=name,
                kind="loop",
                output=state_type,
                after=upstream,
                fn=fn,
                spec=spec,
                objective=objective,
                until=until,
                max_rounds=positive(name, max_rounds),
                on_limit=on_limit,
                retry=_retry(name, retry),
            )
        )

    def route(
        self,
        source: Node[T],
        *cases: tuple[Callable[[T], bool], Node[Any]],
        otherwise: Node[Any] | None = None,
    ) -> Route:
        """Conditional edges: once `source` completes, the first `(predicate, node)` whose
        predicate holds for its output names the one node that runs next; the other targets,
        and every node that reads a skipped one (a join: all it joins), are skipped. No
        predicate holding takes `otherwise` (without one, the workflow fails). The choice is
        recorded with the source's output, so a resumed run takes the same branch; `flow.join`
        brings the branches back together."""
        if self._build.nodes.get(source.name) is not source:
            raise ConfigError(f"{source.name!r} is not a node of {self.name}", node=source.name)
        if source.name in self._build.routes:
            raise ConfigError(f"node {source.name!r} has its routes already", node=source.name)
        targets = [node for _, node in cases] + ([otherwise] if otherwise is not None else [])
        if not cases:
            raise ConfigError(f"the route out of {source.name!r} needs at least one case")
        taken = {t for r in self._build.routes.values() for t in r.targets}
        for target in targets:
            if self._build.nodes.get(target.name) is not target or source.name not in target.after:
                raise ConfigError(
                    f"{target.name!r} is not a node that reads {source.name!r}: declare it with "
                    f"after={source.name} before routing to it",
                    node=target.name,
                )
            if target.name in taken or targets.count(target) > 1:
                raise ConfigError(f"node {target.name!r} is the target of two routes")
        for predicate, _ in cases:
            check_params(source.name, predicate, [source.output])
            answer = type_hints_of(predicate).get("return")
            if answer is not None and answer is not bool:
                raise ConfigError(
                    f"the route out of {source.name!r}: a predicate returns bool, not "
                    f"{type_name(answer)}",
                    node=source.name,
                )
        route = Route(
            source=source.name,
            cases=tuple((predicate, node.name) for predicate, node in cases),
            otherwise=otherwise.name if otherwise is not None else None,
        )
        self._build.routes[source.name] = route
        return route

    def join(self, name: str, after: Sequence[Node[Any]], *, output: Any = None) -> Node[Any]:
        """Where routed branches meet: gives the output of the first node of `after` that
        ran (they give the same type, or `output=` names one they all fit)."""
        upstream = self._after(name, after, None)
        given = [(self._build.nodes.get(a) or self.start).output for a in upstream]
        out = output if output is not None else given[0]
        if not all(accepts(out, g) for g in given):
            raise ConfigError(
                f"join {name!r}: its branches give {', '.join(type_name(g) for g in given)}; "
                "pass output=TYPE that each of them fits",
                node=name,
            )
        return self._add(Node(name=name, kind="join", output=out, after=upstream))

    def output(self, node: Node[Any]) -> None:
        """Make `node`'s output the workflow's (by default the last node declared gives it)."""
        if self._build.nodes.get(node.name) is not node:
            raise ConfigError(f"{node.name!r} is not a node of {self.name}", node=node.name)
        self._build.output = node.name

    # -- reading ----------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node[Any], ...]:
        """The nodes in declaration order (which is an order that respects every edge)."""
        return tuple(self._build.nodes.values())

    def node(self, name: str) -> Node[Any]:
        found = self._build.nodes.get(name)
        if found is None:
            raise ConfigError(f"workflow {self.name} has no node {name!r}", node=name)
        return found

    @property
    def output_node(self) -> Node[Any]:
        if not self._build.nodes:
            raise ConfigError(f"workflow {self.name} has no nodes; declare some")
        return self._build.nodes[self._build.output or next(reversed(self._build.nodes))]

    def levels(self) -> list[list[Node[Any]]]:
        """The nodes in waves: each reads only nodes of earlier waves, so a wave runs at once."""
        depth: dict[str, int] = {"input": 0}
        waves: list[list[Node[Any]]] = []
        for node in self.nodes:
            d = depth[node.name] = 1 + max(depth[a] for a in node.after)
            while len(waves) < d:
                waves.append([])
            waves[d - 1].append(node)
        return waves

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(self._build.routes.values())

    def route_of(self, source: str) -> Route | None:
        """The conditional edges out of node `source`, if it has any."""
        return self._build.routes.get(source)

    def route_into(self, target: str) -> Route | None:
        """The conditional edges that decide whether node `target` runs, if any do."""
        return next((r for r in self._build.routes.values() if target in r.targets), None)

    def agent_named(self, name: str) -> Agent:
        """The agent the child runs of node `name` run (for `load_ref`, `path:flow#node`)."""
        spec = self.node(name).spec
        if spec is None:
            raise ConfigError(f"node {name!r} of {self.name} runs no agent", node=name)
        return spec.child_agent

    def identity(self) -> dict[str, Any]:
        """Everything that changes what a run does, as JSON data: its structure included."""
        identity = {
            "name": self.name,
            "version": self.version,
            "input": schema(self.input_type),
            "budget": {k: getattr(self.budget, k) for k in type(self.budget).__dataclass_fields__},
            "nodes": [n.identity() for n in self.nodes],
            "output": self.output_node.name,
        }
        if self.routes:  # absent otherwise: a graph without routes keeps the hash it had
            identity["routes"] = [r.identity() for r in self.routes]
        return identity

    def identity_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def structure(self) -> tuple[dict[str, Any], ...]:
        """The graph as recorded when a run starts (what `contextos show` draws)."""
        nodes = []
        for n in self.nodes:
            shape: dict[str, Any] = {"name": n.name, "kind": n.kind, "after": list(n.after)}
            shape["output"] = type_name(n.output)
            route = self.route_of(n.name)
            if route is not None:
                shape["routes"] = list(route.targets)
            if n.merge != "all":
                shape["merge"] = n.merge
            if n.effect is not None:
                shape["effect"] = n.effect.value
            nodes.append(shape)
        return tuple(nodes)

    def input_text(self, value: Any) -> str:
        """A run's input, validated against the input type, as the JSON its log keeps: text
        is read as JSON, unless the input type is text itself."""
        adapter = self.start.adapter
        try:
            if isinstance(value, str | bytes) and self.input_type is not str:
                parsed = adapter.validate_json(value)
            else:
                parsed = adapter.validate_python(value)
        except ValidationError as exc:
            raise ConfigError(
                f"the input of workflow {self.name} is not a valid "
                f"{type_name(self.input_type)}: {problems(exc)}",
                workflow=self.name,
            ) from None
        return adapter.dump_json(parsed).decode()

    def read_input(self, text: str) -> Any:
        """A run's input as the node `input` gives it, from the JSON its log keeps."""
        return self.start.adapter.validate_json(text)

    # -- helpers ----------------------------------------------------------------------------

    def _code(
        self,
        kind: NodeKind,
        name: str,
        fn: Callable[..., Any],
        after: Node[Any] | Sequence[Node[Any]] | None,
        output: Any,
        effect: EffectKind | None = None,
        retry: RetryPolicy | None = None,
        reconcile: Callable[[str], Any] | None = None,
    ) -> Node[Any]:
        upstream = self._after(name, after, None)
        given = [(self._build.nodes.get(a) or self.start).output for a in upstream]
        check_params(name, fn, given)
        return self._add(
            Node(
                name=name,
                kind=kind,
                output=output or returns_of(name, fn),
                after=upstream,
                fn=fn,
                effect=effect,
                retry=_retry(name, retry),
                reconcile=reconcile,
            )
        )

    def _add(self, node: Node[Any]) -> Node[Any]:
        self._build.nodes[node.name] = node
        return node

    def _after(
        self, name: str, after: Node[Any] | Sequence[Node[Any]] | None, count: int | None
    ) -> tuple[str, ...]:
        """The names of the nodes a new node reads (checking the new node's name first)."""
        if not _NAME.fullmatch(name) or name == "input":
            raise ConfigError(
                f"node name {name!r}: start with a letter; use letters, digits, _ and - "
                "(and not 'input')",
                node=name,
            )
        if name in self._build.nodes:
            raise ConfigError(f"workflow {self.name} has two nodes named {name!r}")
        if after is None:
            nodes = self.nodes
            upstream: tuple[str, ...] = (nodes[-1].name if nodes else "input",)
        elif isinstance(after, Node):
            upstream = (after.name,)
        else:
            upstream = tuple(a.name for a in after)
        for a in upstream:
            known = self._build.nodes.get(a) or (self.start if a == "input" else None)
            if known is None:
                raise ConfigError(f"node {name!r} reads {a!r}, which is not declared before it")
        if count is not None and len(upstream) != count:
            raise ConfigError(f"node {name!r} reads exactly {count} node(s)", node=name)
        return upstream

    def _spec(self, name: str, worker: Agent | Subagent, output: Any) -> Subagent:
        spec = worker if isinstance(worker, Subagent) else Subagent(agent=worker)
        wanted = output if output is not None else spec.expected_output
        if wanted is not None and not (isinstance(wanted, type) and issubclass(wanted, BaseModel)):
            raise ConfigError(
                f"node {name!r}: an agent answers with a Pydantic model, not {type_name(wanted)}",
                node=name,
            )
        return replace(spec, name=name, output_type=wanted)

    def _item_type(
        self, name: str, upstream: str, over: str | Callable[[Any], Any] | None, item: Any
    ) -> Any:
        source = (self._build.nodes.get(upstream) or self.start).output
        if isinstance(over, str):
            check_list_field(name, source, over)
        if item is not None:
            return item
        if over is None:
            found = get_args(source)[0] if get_origin(source) is list else None
        elif isinstance(over, str):
            annotation = source.model_fields[over].annotation
            found = get_args(annotation)[0] if get_origin(annotation) is list else None
        else:
            ret = type_hints_of(over).get("return")
            found = get_args(ret)[0] if get_args(ret) else None
        if found is None:
            raise ConfigError(
                f"node {name!r}: cannot tell the type of one item; pass item=TYPE", node=name
            )
        return found


def _retry(name: str, retry: RetryPolicy | None) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(
            f"node {name!r}: retry is a RetryPolicy, not {type(retry).__name__}", node=name
        )
    return retry


def _no_retry_for_agents(name: str, spec: Subagent | None, retry: RetryPolicy | None) -> None:
    if spec is not None and retry is not None:
        raise ConfigError(
            f"node {name!r}: retry is for a function; an agent's child run retries through "
            "its model's and its tools' own policies",
            node=name,
        )


def _check_review(name: str, spec: Subagent | None, review: bool, revisions: int) -> None:
    if review and spec is None:
        raise ConfigError(
            f"node {name!r}: review is of a child run's result; a function's output is "
            "the workflow's own code",
            node=name,
        )
    if not isinstance(revisions, int) or isinstance(revisions, bool) or revisions < 0:
        raise ConfigError(
            f"node {name!r}: revisions is a whole number of at least 0, not {revisions!r}",
            node=name,
        )
    if revisions != REVISIONS and not review:
        raise ConfigError(
            f"node {name!r}: revisions are asked for by a person reviewing the result; "
            "add review=True",
            node=name,
        )


def load_runnable(ref: str) -> Agent | Workflow:
    """Import an agent or a workflow from `path/to/file.py:attr` or `package.module:attr`."""
    obj = load_ref(ref)
    if not isinstance(obj, Agent | Workflow):
        raise ConfigError(
            f"bad agent reference {ref!r}: it names a {type(obj).__name__}, not an Agent or a "
            "Workflow",
            ref=ref,
        )
    return obj


__all__ = [
    "DEFAULT_BUDGET",
    "ClaimCheck",
    "Collected",
    "Gated",
    "ItemFailure",
    "Merge",
    "Node",
    "NodeKind",
    "Rejected",
    "Route",
    "Workflow",
]
