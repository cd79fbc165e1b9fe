"""Path-scoped instructions: an `AGENTS.md` in a directory applies to the paths under it.

The root's file applies from the first call; a deeper directory's file joins the context once a
tool call of the run names a path under that directory, outermost first, each with the path
and the call that brought it in. Files that do not fit the token bound are left out, and the
manifest says which and why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from contextos.context.compiled import (
    ContextItem,
    Entry,
    ItemType,
    TrustClass,
    estimate_tokens,
    sha,
)
from contextos.middleware.base import BaseMiddleware, ModelCall, ModelHandler, ModelResult


class PathInstructions(BaseMiddleware):
    """Adds the instruction file of every directory, from `root` down, that the run has touched."""

    name = "path_instructions"

    def __init__(
        self, root: str | Path, *, filename: str = "AGENTS.md", max_tokens: int = 2_000
    ) -> None:
        self.root = Path(root).resolve()
        self.filename = filename
        self.max_tokens = max_tokens

    def fingerprint(self) -> dict[str, Any]:
        return {"root": str(self.root), "filename": self.filename, "max_tokens": self.max_tokens}

    def touched(self, history: Sequence[Entry]) -> dict[Path, str]:
        """Each directory under the root the run reached, with the first path and call that did."""
        out: dict[Path, str] = {self.root: "the whole tree under the root"}
        for entry in history:
            for call in entry.message.tool_calls:
                for text in _strings(call.arguments):
                    target = self._inside(text)
                    if target is None:
                        continue
                    start = target if target.is_dir() else target.parent
                    for d in (start, *start.parents):
                        if d == self.root or self.root not in d.parents:
                            break
                        out.setdefault(d, f"{text} (named by {call.name} [{call.id}])")
        return out

    def _inside(self, text: str) -> Path | None:
        if not text or len(text) > 1_024 or "\n" in text or "\x00" in text:
            return None
        try:
            target = (self.root / text).resolve()  # an absolute path stays itself
        except (OSError, RuntimeError, ValueError):
            return None
        if target != self.root and self.root not in target.parents:
            return None
        return target if target.exists() or target.parent.is_dir() else None

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        touched = self.touched(call.context.history)
        context = call.context
        used = 0
        # Outermost first: a deeper file is read after (and may refine) the one above it.
        for d in sorted(touched, key=lambda p: len(p.parts)):
            path = d / self.filename
            if not path.is_file():
                continue
            rel = path.relative_to(self.root).as_posix()
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            why = f"applies to {touched[d]}"
            if used + estimate_tokens(text) > self.max_tokens:
                row = {"id": f"path:{rel}", "type": ItemType.PATH_INSTRUCTION.value}
                context = context.drop(
                    {**row, "source": rel, "why": f"{why}; over the {self.max_tokens}-token bound"}
                )
                continue
            item = ContextItem(
                id=f"path:{rel}",
                type=ItemType.PATH_INSTRUCTION,
                content=f"Instructions for {d.relative_to(self.root).as_posix() or '.'}/ "
                f"(from {rel}):\n{text}",
                source=rel,
                version=sha(text)[:12],
                trust=TrustClass.DEVELOPER,
                why=why,
            )
            used += item.tokens
            context = context.add(item)
        result = await call_next(call.with_context(context))
        return result.with_telemetry(**{"path_instructions.tokens": used})


def _strings(arguments: str) -> Iterator[str]:
    """Every string value in a tool call's JSON arguments (nothing when they do not parse)."""
    try:
        stack: list[Any] = [json.loads(arguments or "{}")]
    except ValueError:
        return
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
