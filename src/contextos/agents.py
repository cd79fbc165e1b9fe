"""The Agent definition, its identity hash, and loading an agent from a reference string."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contextos.errors import ConfigError
from contextos.middleware.base import Middleware, stack_identity, stack_tools, validate_stack
from contextos.middleware.platform import check_opt_out, platform_stack
from contextos.models.base import ModelAdapter
from contextos.runs import Budget
from contextos.tools.contract import Tool, as_tool, manifest_hash
from contextos.verify import OutputTypeVerifier, Verifier, as_verifier


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
    stack: tuple[Middleware, ...] = field(init=False, repr=False, compare=False, default=())
    """The stack the agent runs under: `middleware` plus the default layers not opted out."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(as_tool(t) for t in self.tools))
        object.__setattr__(self, "verifier", as_verifier(self.verifier))
        object.__setattr__(self, "middleware", tuple(self.middleware))
        object.__setattr__(self, "opt_out", {k: str(v) for k, v in self.opt_out.items()})
        validate_stack(self.middleware)
        check_opt_out(self.middleware, self.opt_out)
        object.__setattr__(self, "stack", platform_stack(self.middleware, self.opt_out))

    @property
    def tool_list(self) -> tuple[Tool, ...]:
        """The agent's tools and those its middleware adds (e.g. reading a skill)."""
        return (*self.tools, *stack_tools(self.stack))  # type: ignore[arg-type]

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
        }

    def identity_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def load_agent(ref: str) -> Agent:
    """Import an agent from `path/to/file.py:attr` or `package.module:attr`."""
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
            spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"bad agent reference {ref!r}: {exc}", ref=ref) from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise ConfigError(
            f"bad agent reference {ref!r}: {target} has no attribute {attr!r}", ref=ref
        )
    if callable(obj) and not isinstance(obj, Agent):
        obj = obj()
    if not isinstance(obj, Agent):
        raise ConfigError(
            f"bad agent reference {ref!r}: {attr} is a {type(obj).__name__}, not an Agent", ref=ref
        )
    return obj
