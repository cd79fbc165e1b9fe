"""Verifiers decide whether an answer is done; a failed check becomes the next instruction."""

from __future__ import annotations

import hashlib
import inspect
import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """A verifier's answer."""

    passed: bool
    """True when the answer is accepted."""
    gaps: tuple[str, ...] = ()
    """What is missing or wrong, each a sentence the model can act on."""
    structured_output: Any = None
    """The parsed answer, when the verifier parses one."""

    @classmethod
    def ok(cls, structured_output: Any = None) -> Verdict:
        return cls(passed=True, structured_output=structured_output)

    @classmethod
    def fail(cls, *gaps: str) -> Verdict:
        return cls(passed=False, gaps=tuple(gaps))


@runtime_checkable
class Verifier(Protocol):
    name: str

    async def verify(self, output: str) -> Verdict:
        """Judge the final answer text."""
        ...


class FunctionVerifier:
    """Wraps `fn(output) -> Verdict | bool | list[str]` (sync or async); a list lists gaps."""

    def __init__(self, fn: Callable[[str], Any], *, name: str | None = None) -> None:
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "verifier"))

    async def verify(self, output: str) -> Verdict:
        result = self.fn(output)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Verdict):
            return result
        if isinstance(result, bool):
            return Verdict.ok() if result else Verdict.fail(f"{self.name} rejected the answer")
        gaps = tuple(str(g) for g in result or ())
        return Verdict.fail(*gaps) if gaps else Verdict.ok()


class OutputTypeVerifier:
    """Accepts an answer only when it parses as JSON into the agent's output type."""

    def __init__(self, output_type: type[BaseModel]) -> None:
        self.output_type = output_type
        self.name = f"output_type:{output_type.__name__}"

    async def verify(self, output: str) -> Verdict:
        text = _strip_fence(output)
        try:
            value = self.output_type.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors()
            )
            return Verdict.fail(
                f"The answer must be a JSON object matching this schema: "
                f"{json.dumps(self.output_type.model_json_schema())}. Problems: {problems}."
            )
        return Verdict.ok(structured_output=value.model_dump(mode="json"))


def as_verifier(obj: Verifier | Callable[[str], Any] | None) -> Verifier | None:
    if obj is None or isinstance(obj, Verifier):
        return obj
    return FunctionVerifier(obj)


def _strip_fence(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        if t.rstrip().endswith("```"):
            t = t.rstrip()[:-3]
    return t.strip()


def feedback(gaps: tuple[str, ...]) -> str:
    """The message a failed verification sends back to the model."""
    lines = "\n".join(f"- {g}" for g in gaps)
    return f"Your answer is not complete yet. Fix these gaps and answer again:\n{lines}"


async def verify_all(verifiers: list[Verifier], output: str) -> tuple[Verdict, str]:
    """Run verifiers in order; the first failure wins. Returns the verdict and who gave it."""
    structured = None
    for v in verifiers:
        verdict = await v.verify(output)
        if not verdict.passed:
            return verdict, v.name
        if verdict.structured_output is not None:
            structured = verdict.structured_output
    return Verdict.ok(structured_output=structured), ",".join(v.name for v in verifiers)


async def verify_each(verifiers: list[Verifier], output: str) -> list[tuple[Verifier, Verdict]]:
    """Run verifiers in order until one fails; every verdict given, passes included."""
    verdicts: list[tuple[Verifier, Verdict]] = []
    for v in verifiers:
        verdict = await v.verify(output)
        verdicts.append((v, verdict))
        if not verdict.passed:
            break
    return verdicts


def identity(verifier: Verifier) -> tuple[str, str]:
    """What a verifier is and which version of it judged: (kind, version).

    A verifier may declare `version`; a function's version is a hash of its code, so an edited
    function is a different evaluator.
    """
    if isinstance(verifier, OutputTypeVerifier):
        schema = json.dumps(verifier.output_type.model_json_schema(), sort_keys=True)
        return "output_type", hashlib.sha256(schema.encode()).hexdigest()[:12]
    declared = getattr(verifier, "version", None)
    if isinstance(verifier, FunctionVerifier):
        code = getattr(verifier.fn, "__code__", None)
        body = _code_bytes(code) if code is not None else verifier.name.encode()
        return "function", str(declared or hashlib.sha256(body).hexdigest()[:12])
    return type(verifier).__name__, str(declared or "1")


def _code_bytes(code: types.CodeType) -> bytes:
    """A function's bytecode and constants, the same in every process (no addresses)."""
    parts = [code.co_code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_bytes(const))
        elif isinstance(const, frozenset):  # set order changes with the string hash seed
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(repr(const).encode())
    return b"\0".join(parts)
