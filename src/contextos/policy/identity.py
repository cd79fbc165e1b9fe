"""Who a run acts for, with what delegated authority: `Principal` and `RunContext`.

A run's context is bound when the run starts and recorded in its log. A child run's context is
derived from its parent's and may only be narrower: fewer scopes, tools, roots and hosts, a lower
data clearance, the same tenant.
"""

from __future__ import annotations

import fnmatch
import functools
import getpass
import hashlib
import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from contextos.errors import AuthorityWidened
from contextos.events import ContextBound
from contextos.policy.containment import Containment


class PrincipalKind(StrEnum):
    USER = "user"
    SERVICE = "service"
    AGENT = "agent"
    AUTOMATION = "automation"


CLASSIFICATIONS: tuple[str, ...] = ("public", "internal", "confidential", "restricted")
"""Data classification levels, from least to most sensitive."""


def classification_rank(level: str) -> int:
    """Position of a level in CLASSIFICATIONS; unknown levels rank as the most sensitive."""
    try:
        return CLASSIFICATIONS.index(level)
    except ValueError:
        return len(CLASSIFICATIONS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """An authenticated actor: a person, a service, an agent or an automation."""

    kind: PrincipalKind
    """user, service, agent or automation."""
    id: str
    """Stable identifier within the tenant."""
    tenant: str = "default"
    """The tenant it belongs to."""
    scopes: tuple[str, ...] = ()
    """Scopes it holds (`payments:refund`, `files:*`, `*`)."""
    roles: tuple[str, ...] = ()
    """Roles it holds, as asserted by the authentication that produced it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PrincipalKind(self.kind))

    @property
    def ref(self) -> str:
        """`kind:id@tenant`, used as the actor of events it causes."""
        return f"{self.kind.value}:{self.id}@{self.tenant}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "id": self.id,
            "tenant": self.tenant,
            "scopes": list(self.scopes),
            "roles": list(self.roles),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Principal:
        return cls(
            kind=PrincipalKind(data["kind"]),
            id=str(data["id"]),
            tenant=str(data.get("tenant", "default")),
            scopes=tuple(data.get("scopes", ())),
            roles=tuple(data.get("roles", ())),
        )

    @classmethod
    def user(cls, id: str, *, tenant: str = "default", scopes: tuple[str, ...] = ()) -> Principal:
        return cls(kind=PrincipalKind.USER, id=id, tenant=tenant, scopes=scopes)

    @classmethod
    def service(
        cls, id: str, *, tenant: str = "default", scopes: tuple[str, ...] = ()
    ) -> Principal:
        """A service account: a job or a system that runs on its own behalf."""
        return cls(kind=PrincipalKind.SERVICE, id=id, tenant=tenant, scopes=scopes)

    @classmethod
    def local(cls) -> Principal:
        """The person at this terminal: every scope, for local development."""
        return cls(kind=PrincipalKind.USER, id=_login(), tenant="default", scopes=("*",))


@functools.cache
def _login() -> str:
    """This process's login name (looked up once: every child run of a local parent asks)."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "local"


def scope_grants(held: str, wanted: str) -> bool:
    """`payments:*` grants `payments:refund`; `*` grants everything."""
    return fnmatch.fnmatchcase(wanted, held)


def scopes_grant(held: tuple[str, ...], wanted: str) -> bool:
    return any(scope_grants(h, wanted) for h in held)


def _tool_pattern_within(pattern: str, allowed: tuple[str, ...]) -> bool:
    if pattern in allowed or "*" in allowed:
        return True
    has_glob = any(c in pattern for c in "*?[")
    return not has_glob and any(fnmatch.fnmatchcase(pattern, a) for a in allowed)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunContext:
    """The authority a run acts under, bound at start and recorded in the run's log."""

    principal: Principal
    """Who the run acts for."""
    scopes: tuple[str, ...] | None = None
    """Scopes delegated to the run; None delegates all the principal's scopes."""
    tools: tuple[str, ...] | None = None
    """Tool names (globs) the run may call; None allows every tool in the agent's manifest."""
    clearance: str = "internal"
    """Most sensitive data classification the run may touch."""
    containment: Containment | None = None
    """Filesystem roots and network destinations; None leaves each built-in tool's own."""
    safety_mode: str = "standard"
    """Free label recorded with the run (`standard`, `read_only`, `strict`, …)."""
    principal_chain: tuple[str, ...] = ()
    """Refs of the principals and runs this authority was delegated through, outermost first."""
    parent_run_id: str | None = None
    """The run that started this one, for child runs."""

    @property
    def tenant(self) -> str:
        return self.principal.tenant

    @property
    def effective_scopes(self) -> tuple[str, ...]:
        """Delegated scopes, cut down to what the principal holds."""
        if self.scopes is None:
            return self.principal.scopes
        return tuple(s for s in self.scopes if scopes_grant(self.principal.scopes, s))

    def has_scope(self, wanted: str) -> bool:
        return scopes_grant(self.effective_scopes, wanted)

    def allows_tool(self, name: str) -> bool:
        return self.tools is None or any(fnmatch.fnmatchcase(name, t) for t in self.tools)

    def clears(self, classification: str) -> bool:
        return classification_rank(classification) <= classification_rank(self.clearance)

    # -- delegation -------------------------------------------------------------------------

    def delegate(
        self,
        *,
        run_id: str | None = None,
        scopes: tuple[str, ...] | None = None,
        tools: tuple[str, ...] | None = None,
        clearance: str | None = None,
        containment: Containment | None = None,
        safety_mode: str | None = None,
    ) -> RunContext:
        """A context for a child run: the same principal, equal or narrower authority.

        Asking for anything the parent does not have raises AuthorityWidened.
        """
        child = replace(
            self,
            scopes=scopes if scopes is not None else self.effective_scopes,
            tools=tools if tools is not None else self.tools,
            clearance=clearance or self.clearance,
            containment=containment if containment is not None else self.containment,
            safety_mode=safety_mode or self.safety_mode,
            principal_chain=(*self.principal_chain, f"run:{run_id}" if run_id else "run"),
            parent_run_id=run_id,
        )
        child.check_narrows(self)
        return child

    def check_narrows(self, parent: RunContext) -> None:
        """Raise AuthorityWidened unless this context is within `parent`."""
        problems: list[str] = []
        if self.principal.ref != parent.principal.ref:
            problems.append(f"principal {self.principal.ref} is not {parent.principal.ref}")
        if any(not scopes_grant(parent.principal.scopes, s) for s in self.principal.scopes):
            problems.append("the principal holds scopes its parent's does not")
        asked = self.scopes if self.scopes is not None else self.principal.scopes
        wider = [s for s in asked if not parent.has_scope(s)]
        if wider:
            problems.append(f"scopes not delegated by the parent: {', '.join(wider)}")
        if parent.tools is not None:
            if self.tools is None:
                problems.append("every tool requested, the parent has an allowlist")
            else:
                extra = [t for t in self.tools if not _tool_pattern_within(t, parent.tools)]
                if extra:
                    problems.append(f"tools outside the parent's allowlist: {', '.join(extra)}")
        if classification_rank(self.clearance) > classification_rank(parent.clearance):
            problems.append(f"clearance {self.clearance} above the parent's {parent.clearance}")
        if parent.containment is not None and (
            self.containment is None or not self.containment.narrows(parent.containment)
        ):
            problems.append("containment wider than the parent's (roots or network)")
        if problems:
            raise AuthorityWidened(
                "a child run cannot have more authority than its parent: " + "; ".join(problems),
                problems=problems,
            )

    # -- records ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "principal": self.principal.to_dict(),
            "scopes": list(self.scopes) if self.scopes is not None else None,
            "tools": list(self.tools) if self.tools is not None else None,
            "clearance": self.clearance,
            "containment": self.containment.to_dict() if self.containment else None,
            "safety_mode": self.safety_mode,
            "principal_chain": list(self.principal_chain),
            "parent_run_id": self.parent_run_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunContext:
        scopes, tools = data.get("scopes"), data.get("tools")
        return cls(
            principal=Principal.from_dict(data["principal"]),
            scopes=tuple(scopes) if scopes is not None else None,
            tools=tuple(tools) if tools is not None else None,
            clearance=str(data.get("clearance", "internal")),
            containment=(
                Containment.from_dict(data["containment"]) if data.get("containment") else None
            ),
            safety_mode=str(data.get("safety_mode", "standard")),
            principal_chain=tuple(data.get("principal_chain", ())),
            parent_run_id=data.get("parent_run_id"),
        )

    def hash(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def of_run(cls, bound: ContextBound | None) -> RunContext:
        """The context a run's `ContextBound` event recorded; the local one for a run that
        bound none."""
        return cls.from_dict(bound.context) if bound is not None else cls.local()

    @classmethod
    def local(cls, *, containment: Containment | None = None) -> RunContext:
        """The context of a run started from this terminal without an explicit principal."""
        return cls(principal=Principal.local(), clearance="restricted", containment=containment)
