"""The graph layer: workflows of typed nodes, and child runs under delegation contracts.

    from contextos.graph import Workflow

A workflow is declared with `Workflow` (see `contextos.graph.workflow`) and run like an agent:
`Runtime.run(flow, input)`. Its agent nodes, and an agent's subagents (`Agent(subagents=…)`),
run as child runs under recorded delegation contracts (`contextos.graph.children`).
"""

from contextos.graph.tree import RunTree
from contextos.graph.workflow import (
    ClaimCheck,
    Collected,
    Gated,
    ItemFailure,
    Node,
    Rejected,
    Workflow,
    load_runnable,
)

__all__ = [
    "ClaimCheck",
    "Collected",
    "Gated",
    "ItemFailure",
    "Node",
    "Rejected",
    "RunTree",
    "Workflow",
    "load_runnable",
]
