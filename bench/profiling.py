"""Reading a pyinstrument profile: time per part of the code, and the functions that use it.

A part is a label and the keys that place a frame in it (a function name, or a piece of its
file path). A frame's own time counts towards its innermost part: its own, else that of the
nearest caller in a part (so a middleware layer wrapping the model call is charged for its own
work, not for the layers inside it); what is in no part is "the rest". The loop's idle waits
are counted apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Parts = Sequence[tuple[str, tuple[str, ...]]]
IDLE = "idle: the loop waiting on timers and I/O"
REST = "the loop itself, asyncio and the rest"


def _idle(frame: Any) -> bool:
    return frame.function in ("select", "poll") and "selectors" in (frame.file_path or "")


def split(root: Any, parts: Parts) -> dict[str, float]:
    """Seconds per part (plus IDLE and REST)."""
    out: dict[str, float] = {}

    def part_of(frame: Any) -> str | None:
        path = frame.file_path or ""
        for label, keys in parts:
            if frame.function in keys or any(k in path for k in keys):
                return label
        return None

    def walk(frame: Any, label: str) -> None:
        if _idle(frame):
            out[IDLE] = out.get(IDLE, 0.0) + frame.time
            return
        label = part_of(frame) or label
        own = frame.time - sum(c.time for c in frame.children)
        out[label] = out.get(label, 0.0) + own
        for child in frame.children:
            walk(child, label)

    walk(root, REST)
    return out


def hotspots(root: Any, top: int = 15) -> list[dict[str, Any]]:
    """The functions with the most time of their own (not in what they call), idle left out;
    `share` is of the busy time."""
    own: dict[tuple[str, str], float] = {}

    def walk(frame: Any, caller: tuple[str, str]) -> None:
        if _idle(frame):
            return
        # pyinstrument puts a function's own time in a synthetic `[self]` child; a built-in
        # is named by where it was called from.
        if frame.is_synthetic:
            key = caller
        elif _where(frame) == "built-in":
            key = (frame.function, f"called from {caller[1]}")
        else:
            key = (frame.function, _where(frame))
        own[key] = own.get(key, 0.0) + frame.time - sum(c.time for c in frame.children)
        for child in frame.children:
            walk(child, key)

    walk(root, ("(root)", ""))
    busy = sum(own.values()) or 1.0
    ranked = sorted(own.items(), key=lambda kv: -kv[1])[:top]
    return [{"function": f, "where": w, "share": s / busy} for (f, w), s in ranked]


def _where(frame: Any) -> str:
    """`contextos/store/sqlite.py:267`, `pydantic/type_adapter.py:421`, or a built-in."""
    path, line = frame.file_path or "", frame.line_no
    if not path or path.startswith("<"):
        return "built-in"
    for marker in ("/src/", "/site-packages/", "/lib/python3", "/bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = "stdlib " + path.split("/", 1)[1]
            if marker == "/bench/":
                path = "bench/" + path
            break
    return f"{path}:{line}" if line else path
