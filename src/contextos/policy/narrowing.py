"""A child run's authority: the intersection of what it is declared with and what its parent has.

`RunContext.delegate` refuses a request wider than the parent's; a delegation declared in code
(a subagent, a workflow node) is instead cut down to the intersection, so the child can never
hold more than its parent whatever its declaration says, and the result is checked with
`check_narrows` all the same.
"""

from __future__ import annotations

from dataclasses import replace

from contextos.policy.containment import Containment
from contextos.policy.identity import RunContext, classification_rank, scope_grants
from contextos.policy.network import NetworkPolicy


def intersect_scopes(declared: tuple[str, ...], held: tuple[str, ...]) -> tuple[str, ...]:
    """The scopes both grant: a declared scope the parent holds stays, and a parent's scope
    that a wider declared one covers (`payments:*` declared, `payments:refund` held) stays."""
    out: list[str] = []
    for d in declared:
        for h in held:
            kept = d if scope_grants(h, d) else h if scope_grants(d, h) else None
            if kept is not None and kept not in out:
                out.append(kept)
    return tuple(out)


def intersect_network(a: NetworkPolicy, b: NetworkPolicy) -> NetworkPolicy:
    """Hosts both reach: each allow pattern of one that the other's allow list covers, and both
    deny lists. Conservative where two globs overlap only in part: such a pair reaches none."""
    allow: list[str] = []
    for mine, theirs in ((a, b), (b, a)):
        for pattern in mine.allow:
            within = NetworkPolicy(allow=(pattern,)).narrows(NetworkPolicy(allow=theirs.allow))
            if within and pattern not in allow:
                allow.append(pattern)
    deny = tuple(dict.fromkeys((*a.deny, *b.deny)))
    return NetworkPolicy(allow=tuple(allow), deny=deny)


def intersect_containment(a: Containment | None, b: Containment | None) -> Containment | None:
    """What both containments permit (None stands for "no walls of its own").

    Access changes only at a root, so the intersection is exact when taken at every root of
    either: a path is writable where both let it be written, readable where both let it be
    read, and out of reach below any root only one of them has.
    """
    if a is None or b is None:
        return b if a is None else a
    roots: list[str] = []
    read_only: list[str] = []
    for point in dict.fromkeys((*a.roots, *a.read_only, *b.roots, *b.read_only)):
        held = (a.root_of(point), b.root_of(point))
        if held[0] is None or held[1] is None:
            continue
        if held[0][1] == "write" and held[1][1] == "write":
            roots.append(point)
        else:
            read_only.append(point)
    return Containment(
        roots=tuple(roots),
        read_only=tuple(read_only),
        network=intersect_network(a.network, b.network),
        allow_hard_links=a.allow_hard_links and b.allow_hard_links,
    )


def intersect_context(
    parent: RunContext,
    *,
    parent_run_id: str,
    tools: tuple[str, ...],
    scopes: tuple[str, ...] | None = None,
    clearance: str | None = None,
    containment: Containment | None = None,
) -> RunContext:
    """The context of a child of `parent`: the same principal, and for every other dimension
    the intersection of the declared value (None: not narrowed) with the parent's.

    `tools` are the exact names the child may call, already cut to the parent's allowlist.
    """
    held = parent.effective_scopes
    lower = clearance is not None and classification_rank(clearance) < classification_rank(
        parent.clearance
    )
    child = replace(
        parent,
        scopes=held if scopes is None else intersect_scopes(scopes, held),
        tools=tuple(t for t in tools if parent.allows_tool(t)),
        clearance=clearance if lower and clearance is not None else parent.clearance,
        containment=intersect_containment(containment, parent.containment),
        principal_chain=(*parent.principal_chain, f"run:{parent_run_id}"),
        parent_run_id=parent_run_id,
    )
    child.check_narrows(parent)  # by construction; a failure here is a bug, and stops loudly
    return child


__all__ = [
    "intersect_containment",
    "intersect_context",
    "intersect_network",
    "intersect_scopes",
]
