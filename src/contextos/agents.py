"""The Agent definition, its subagents, its identity hash, and loading an agent from a
reference string."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contextos.errors import ConfigError
from contextos.middleware.base import Middleware, stack_identity, stack_tools, validate_stack
from contextos.middleware.platform import check_opt_out, platform_stack
from contextos.models.base import ModelAdapter
from contextos.policy.containment import Containment
from contextos.runs import Budget
from contextos.tools.contract import EffectKind, Tool, as_tool, manifest_hash, tool
from contextos.verify import OutputTypeVerifier, Verifier, as_verifier

DELEGATE_PREFIX = "delegate_to_"
"""The tool an agent's model calls to delegate to a subagent is named this plus its name."""

EFFECT_CLASSES = ("write", *(e.value for e in EffectKind if e is not EffectKind.READ))
"""What a delegation may forbid: `write` (every tool that is not read-only), or one effect."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,48}")


@dataclass(frozen=True, kw_only=True)
class Agent:
    """What to run: model, instructions, tools, limits and the definition of done."""

    name: str
    """Stable name, recorded on every run."""
    model: str | ModelAdapter = "local"
    """A model string (`"local"`, `"openai:gpt-4.1-mini"`, …) or an adapter object."""
    instructions: str = ""
    """The system prompt."""
    tools: Sequence[Tool | Callable[..., Any]] = ()
    """Tools, or plain typed functions (read-only tools)."""
    version: str = "1"
    """Bump when you change behaviour on purpose."""
    budget: Budget = field(default_factory=Budget)
    """Limits per run."""
    verifier: Verifier | Callable[[str], Any] | None = None
    """Decides when an answer is done; failures become the next instruction."""
    output_type: type[BaseModel] | None = None
    """Structured answer type; the final answer must parse into it."""
    middleware: Sequence[Middleware] = ()
    """The context stack, outermost first: platform layers in their order, then domain ones.
    The budget gate, PII redaction and the sanitizer are added with their defaults when not
    listed (see `stack`)."""
    opt_out: Mapping[str, str] = field(default_factory=dict)
    """Default platform layers left out, by name, each with the reason (recorded per call)."""
    subagents: Sequence[Subagent | Agent] = ()
    """Agents this one may delegate to: its model calls each as a tool, `delegate_to_<name>`,
    and each call runs as a child run under a contract derived from the declaration."""
    conversation: bool = False
    """Keep each run open for the person's next message: an answer that passes the verifier
    leaves the run waiting (`input_required`) instead of completing it, and
    `Runtime.send` continues it as the same run."""
    stack: tuple[Middleware, ...] = field(init=False, repr=False, compare=False, default=())
    """The stack the agent runs under: `middleware` plus the default layers not opted out."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(as_tool(t) for t in self.tools))
        object.__setattr__(self, "verifier", as_verifier(self.verifier))
        object.__setattr__(self, "middleware", tuple(self.middleware))
        subs = tuple(s if isinstance(s, Subagent) else Subagent(agent=s) for s in self.subagents)
        object.__setattr__(self, "subagents", subs)
        object.__setattr__(self, "opt_out", {k: str(v) for k, v in self.opt_out.items()})
        validate_stack(self.middleware)
        check_opt_out(self.middleware, self.opt_out)
        object.__setattr__(self, "stack", platform_stack(self.middleware, self.opt_out))
        names = [s.name for s in subs]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent {self.name!r} declares two subagents with the same name")

    @property
    def tool_list(self) -> tuple[Tool, ...]:
        """The agent's tools, those its middleware adds (e.g. reading a skill), and one
        `delegate_to_<name>` tool per subagent."""
        delegates = tuple(s.tool for s in self.delegates)
        return (*self.tools, *stack_tools(self.stack), *delegates)  # type: ignore[arg-type]

    @property
    def delegates(self) -> tuple[Subagent, ...]:
        """The subagents, each as its declaration (a bare Agent given is wrapped in one)."""
        return tuple(s for s in self.subagents if isinstance(s, Subagent))

    def subagent(self, name: str) -> Subagent:
        """The subagent declared under `name` (ConfigError when there is none)."""
        for sub in self.delegates:
            if sub.name == name:
                return sub
        raise ConfigError(f"agent {self.name!r} has no subagent named {name!r}", name=name)

    def agent_named(self, name: str) -> Agent:
        """The agent a child run of the subagent `name` runs (see `load_ref`)."""
        return self.subagent(name).child_agent

    @property
    def verifiers(self) -> list[Verifier]:
        out: list[Verifier] = []
        if self.output_type is not None:
            out.append(OutputTypeVerifier(self.output_type))
        if self.verifier is not None:
            out.append(self.verifier)  # type: ignore[arg-type]
        return out

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.name

    def identity(self) -> dict[str, Any]:
        """Everything that changes behaviour, as JSON data."""
        return {
            "name": self.name,
            "version": self.version,
            "model": self.model_name,
            "instructions": self.instructions,
            "tools": manifest_hash(self.tool_list),
            "budget": {k: getattr(self.budget, k) for k in type(self.budget).__dataclass_fields__},
            "verifiers": [v.name for v in self.verifiers],
            "output_schema": (
                self.output_type.model_json_schema() if self.output_type is not None else None
            ),
            # The stack's order is part of the behaviour; left out when empty so agents without
            # middleware keep the hash they had.
            **({"middleware": stack_identity(self.middleware)} if self.middleware else {}),
            **({"opt_out": dict(sorted(self.opt_out.items()))} if self.opt_out else {}),
            **({"subagents": [s.identity() for s in self.delegates]} if self.subagents else {}),
            **({"conversation": True} if self.conversation else {}),
        }

    def identity_hash(self) -> str:
        return self._identity_hash

    @cached_property
    def _identity_hash(self) -> str:
        # An agent is frozen: what its identity covers cannot change once it is built.
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Subagent:
    """An agent another agent may delegate to, and the limits each delegation runs under.

    What is declared here is a request: the child run gets the intersection of it with its
    parent's authority and what is left of its parent's budget, never more.
    """

    agent: Agent
    """The agent the child run runs."""
    name: str = ""
    """What the planner calls it (`delegate_to_<name>`); the agent's name by default."""
    description: str = ""
    """When to delegate to it, for the planner's model; the agent's instructions by default."""
    tools: tuple[str, ...] | None = None
    """The agent's tools (names or globs) the child may use; None: all of them."""
    forbidden_effects: tuple[str, ...] = ()
    """Effect classes the child may not use (see EFFECT_CLASSES): its tools with them are
    neither shown to its model nor allowed."""
    budget: Budget | None = None
    """What one delegation may spend (the agent's budget by default), cut to what the parent
    has left."""
    output_type: type[BaseModel] | None = None
    """The type the child must answer with (the agent's output type by default); the parent
    validates it before its model sees it."""
    scopes: tuple[str, ...] | None = None
    """Scopes to delegate (None: the parent's)."""
    clearance: str | None = None
    """A lower data clearance than the parent's, if any."""
    containment: Containment | None = None
    """Narrower filesystem roots and network destinations, if any."""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.agent.name)
        if not _NAME.fullmatch(self.name):
            raise ConfigError(
                f"subagent name {self.name!r} cannot name a tool: use 1 to 48 letters, digits, "
                "_ or -",
                name=self.name,
            )
        check_effect_classes(self.forbidden_effects)
        names = [t.name for t in self.agent.tool_list]
        for allowed in self.tools or ():
            if not any(fnmatch.fnmatchcase(n, allowed) for n in names):
                raise ConfigError(
                    f"subagent {self.name!r} allows the tool {allowed!r}, which none of agent "
                    f"{self.agent.name!r}'s tools is: {', '.join(names) or 'it has none'}",
                    name=self.name,
                )

    @property
    def tool_name(self) -> str:
        return DELEGATE_PREFIX + self.name

    @property
    def expected_output(self) -> type[BaseModel] | None:
        return self.output_type or self.agent.output_type

    @cached_property
    def child_agent(self) -> Agent:
        """The agent as a child run runs it: answering with the expected output type."""
        wanted = self.expected_output
        if wanted is self.agent.output_type:
            return self.agent
        return replace(self.agent, output_type=wanted)

    @cached_property
    def tool(self) -> Tool:
        """The tool the planner's model calls to delegate (its runs are driven by the runtime)."""
        about = self.description or self.agent.instructions or f"the {self.name} agent"
        wanted = self.expected_output

        def delegate(task: str) -> str:
            raise ConfigError(f"{DELEGATE_PREFIX}{self.name} runs only inside a runtime's run")

        delegate.__doc__ = (
            f"Delegate a task to the {self.name} subagent: {about.strip()} It sees only the "
            "task you write here, never this conversation, so include everything it needs. "
            + (f"It answers with a {wanted.__name__}." if wanted is not None else "")
        ).strip()
        return tool(name=self.tool_name)(delegate)

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "agent": self.child_agent.identity_hash(),
            "tools": list(self.tools) if self.tools is not None else None,
            "forbidden_effects": list(self.forbidden_effects),
            "budget": _fields(self.budget) if self.budget is not None else None,
            "scopes": list(self.scopes) if self.scopes is not None else None,
            "clearance": self.clearance,
            "containment": self.containment.to_dict() if self.containment else None,
        }


def check_effect_classes(classes: Sequence[str]) -> None:
    """ConfigError for an effect class no tool can have."""
    unknown = [c for c in classes if c not in EFFECT_CLASSES]
    if unknown:
        raise ConfigError(
            f"unknown effect class {unknown[0]!r}: forbid one of {', '.join(EFFECT_CLASSES)}",
            effect=unknown[0],
        )


def has_effect_class(tool: Tool, classes: Sequence[str]) -> bool:
    """Whether `tool` has one of the effect classes (`write`: any effect but read)."""
    effect = tool.effect.value
    return effect in classes or ("write" in classes and tool.effect is not EffectKind.READ)


def _fields(budget: Budget) -> dict[str, Any]:
    return {k: getattr(budget, k) for k in type(budget).__dataclass_fields__}


def load_agent(ref: str) -> Agent:
    """Import an agent from `path/to/file.py:attr` or `package.module:attr` (`#name` after it
    names an agent the first one holds by name: a subagent, a workflow's node)."""
    obj = load_ref(ref)
    if not isinstance(obj, Agent):
        raise ConfigError(
            f"bad agent reference {ref!r}: it names a {type(obj).__name__}, not an Agent", ref=ref
        )
    return obj


def load_ref(ref: str) -> Any:
    """The object a reference names: `path.py:attr` or `module:attr` (an object, or a function
    that returns it), then `#name` for each agent held by name in the one before."""
    head, *names = ref.split("#")
    obj = _load_attr(head)
    for name in names:
        holder = getattr(obj, "agent_named", None)
        if holder is None:
            raise ConfigError(
                f"bad agent reference {ref!r}: a {type(obj).__name__} holds no agents by name",
                ref=ref,
            )
        obj = holder(name)
    return obj


def _unloadable(ref: str, source: object, exc: Exception) -> ConfigError:
    return ConfigError(
        f"bad agent reference {ref!r}: running {source} failed ({type(exc).__name__}: {exc})",
        ref=ref,
    )


def _load_attr(ref: str) -> Any:
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(
            f"bad agent reference {ref!r}: use path/to/file.py:attr or package.module:attr",
            ref=ref,
        )
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"bad agent reference {ref!r}: no file {path}", ref=ref)
        module_name = (
            f"_contextos_agent_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
        )
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"bad agent reference {ref!r}: cannot import {path}", ref=ref)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                # Not kept half-run: the next load runs the file again and says the same.
                del sys.modules[module_name]
                raise _unloadable(ref, path, exc) from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"bad agent reference {ref!r}: {exc}", ref=ref) from exc
        except Exception as exc:
            raise _unloadable(ref, target, exc) from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(
            f"bad agent reference {ref!r}: {target} has no attribute {attr!r}", ref=ref
        )
    if isinstance(obj, type):
        raise ConfigError(
            f"bad agent reference {ref!r}: it names the class {obj.__name__}; name an agent, a "
            "workflow, or a function that returns one",
            ref=ref,
        )
    if callable(obj) and not isinstance(obj, Agent):
        obj = obj()
    return obj
