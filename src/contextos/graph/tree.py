"""A run and what it started, as a tree: a workflow's nodes and the child runs under them.

A projection of the logs: each node's status, timing and output size from the workflow's own
events, each child's status and spend from the `child_run_finished` its parent recorded (or,
for one still running, from its own log), and its own children below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contextos.delegation import ChildRun, NodeRun, NodeStatus
from contextos.errors import RunNotFound
from contextos.runs import RunId, RunStatus
from contextos.state import RunState
from contextos.store.base import EventStore, load_state

MAX_DEPTH = 6
"""Levels of child runs drawn below a run (deeper ones are summarised, not read)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunTree:
    """One line of the tree and what hangs below it."""

    label: str
    """A node's name or a run's id."""
    kind: str
    """`workflow`, `run`, a node kind (agent, code, map, reduce, gate, loop) or `child`."""
    status: str
    """pending, running, completed, failed, … (a node not started yet is pending; in an
    ended workflow, `not run`, and one it left running `stopped`, or `cancelled` with it)."""
    detail: str = ""
    """The agent a run runs, a fan-out's items, a gate's verdicts, a loop's rounds, why it
    failed."""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens: int = 0
    """Tokens spent below this line (a run's own and its children's)."""
    cost_usd: float = 0.0
    turns: int = 0
    children: tuple[RunTree, ...] = ()

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def child_run_ids(self) -> list[str]:
        """The ids of the child runs below this line, depth first."""
        out: list[str] = []
        for c in self.children:
            if c.kind == "child":
                out.append(c.label)
            out += c.child_run_ids()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "kind": self.kind,
            "status": self.status,
            "detail": self.detail,
            "duration_s": self.duration_s,
            "turns": self.turns,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "children": [c.to_dict() for c in self.children],
        }


async def run_tree(store: EventStore, run_id: RunId, *, depth: int = 0) -> RunTree:
    """The tree below a run: a workflow's nodes (pending ones too) and every child run."""
    state = await load_state(store, run_id)
    children = {k: await _child(store, c, depth) for k, c in state.children.items()}
    if state.workflow is None:
        below = tuple(children.values())
        kind, detail = "run", f"{state.agent_name} v{state.agent_version}"
    else:
        left_out = _skipped(state.workflow.nodes, state.nodes)
        paused = state.status is RunStatus.PAUSED
        stopped = state.status.value if state.is_terminal or paused else None
        below = tuple(
            _node(
                spec,
                state.nodes.get(str(spec["name"])),
                children,
                spec["name"] in left_out,
                stopped,
            )
            for spec in state.workflow.nodes
        )
        kind, detail = "workflow", f"{state.workflow.workflow} v{state.agent_version}"
    usage = state.usage + state.child_usage
    # The children still under way (running, paused, waiting for a person) count what their
    # own logs say they spent so far; the finished ones are in `child_usage`.
    under_way = [children[k] for k, c in state.children.items() if not c.finished]
    return RunTree(
        label=state.run_id,
        kind=kind,
        status=state.status.value,
        detail=_why(detail, state),
        started_at=state.created_at,
        finished_at=state.updated_at if state.is_terminal else None,
        tokens=usage.total_tokens + sum(c.tokens for c in under_way),
        cost_usd=usage.cost_usd + sum(c.cost_usd for c in under_way),
        turns=state.turns + state.child_turns + sum(c.turns for c in under_way),
        children=below,
    )


def _why(detail: str, state: RunState) -> str:
    if state.failure_reason is None:
        return detail
    return f"{detail} · {state.failure_reason.value}: {state.failure_message or ''}".strip()


def _skipped(specs: Sequence[dict[str, Any]], nodes: dict[str, NodeRun]) -> set[str]:
    """The nodes a route left out: targets it did not choose, and what reads them."""
    out: set[str] = set()
    deciders = {t: spec["name"] for spec in specs for t in spec.get("routes", ())}
    for spec in specs:
        name, after = spec["name"], [a in out for a in spec["after"]]
        source = deciders.get(name)
        decided = nodes.get(source) if source is not None else None
        if (after and (all(after) if spec["kind"] == "join" else any(after))) or (
            source in out or (decided is not None and decided.route not in (None, name))
        ):
            out.add(name)
    return out


def _node(
    spec: dict[str, Any],
    node: NodeRun | None,
    children: dict[str, RunTree],
    skipped: bool,
    stopped: str | None,
) -> RunTree:
    """A node's line; `stopped`: how its workflow ended, if it did (a node it left unfinished
    was stopped, cancelled with it; one it never reached did not run), or `paused` (a node
    under way is paused with it; the others wait)."""
    name = str(spec["name"])
    if node is None:
        waits = stopped in (None, "paused")
        status = "skipped" if skipped else "pending" if waits else "not run"
        return RunTree(label=name, kind=str(spec["kind"]), status=status)
    status = node.status.value
    if stopped is not None and node.status is NodeStatus.RUNNING:
        status = stopped if stopped in ("cancelled", "paused") else "stopped"
    below = tuple(children[k] for k in node.children if k in children)
    detail = _node_detail(node, spec)
    if node.reason:
        detail = f"{detail} · {node.reason}: {node.message or ''}".strip(" ·")
    return RunTree(
        label=name,
        kind=node.kind,
        status=status,
        detail=detail,
        started_at=node.started_at,
        finished_at=node.finished_at,
        tokens=sum(c.tokens for c in below),
        cost_usd=sum(c.cost_usd for c in below),
        turns=sum(c.turns for c in below),
        children=below,
    )


def _node_detail(node: NodeRun, spec: dict[str, Any]) -> str:
    parts: list[str] = []
    if "effect" in spec:
        parts.append(f"effect {spec['effect']}")
    if node.items is not None:
        parts.append(_counted(len(node.items), "item"))
    if spec.get("merge") == "collect" and isinstance(node.output, dict):
        results, failed = node.output.get("results", []), node.output.get("failed", [])
        parts.append(f"{_counted(len(results), 'result')}, {len(failed)} failed")
    elif spec.get("merge") == "first" and node.status is NodeStatus.COMPLETED:
        parts.append("took the first result")
    if node.kind == "gate" and isinstance(node.output, dict):
        passed, rejected = node.output.get("passed", []), node.output.get("rejected", [])
        parts.append(f"{len(passed)} passed, {len(rejected)} rejected")
    if node.rounds:
        how = {True: ", converged", False: ", did not converge", None: ""}[node.converged]
        parts.append(_counted(len(node.rounds), "round") + how)
    if node.route is not None:
        parts.append(f"routed to {node.route}")
    if node.reconciled:
        parts.append("reconciled: it had acted")
    retried = sum(node.failed_attempts.values())
    if retried:
        parts.append(f"{_counted(retried, 'attempt')} failed and tried again")
    return ", ".join(parts)


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


async def _child(store: EventStore, child: ChildRun, depth: int) -> RunTree:
    c = child.contract
    nested: tuple[RunTree, ...] = ()
    status, turns, detail = child.status.value, child.turns, c.agent_name
    tokens, cost = child.usage.total_tokens, child.usage.cost_usd
    finished_at = child.finished_at
    if depth < MAX_DEPTH and (not child.finished or child.evidence.get("children")):
        try:
            sub = await run_tree(store, c.child_run_id, depth=depth + 1)
        except RunNotFound:  # started in the parent's log, not created yet
            sub = None
        if sub is not None:
            nested = sub.children
            if not child.finished:  # what it spent so far, from its own log
                status, turns = sub.status, sub.turns
                tokens, cost = sub.tokens, sub.cost_usd
    if child.reason:
        detail = f"{detail} · {child.reason}: {child.message or ''}".strip()
    return RunTree(
        label=c.child_run_id,
        kind="child",
        status=status,
        detail=detail,
        started_at=child.started_at,
        finished_at=finished_at,
        tokens=tokens,
        cost_usd=cost,
        turns=turns,
        children=nested,
    )


__all__ = ["RunTree", "run_tree"]
