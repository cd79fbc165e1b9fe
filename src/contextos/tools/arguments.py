"""What a model may send as a tool's arguments: bounded in size and nesting, finite numbers only.

Checked before the text is parsed and again after validation, without recursion, so arguments
built to exhaust the stack or to slip NaN past a comparison go back to the model as a
correctable error and never reach policy, limits or the frozen action's hash.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from contextos.errors import ToolArgumentsInvalid
from contextos.numbers import finite

MAX_DEPTH = 32
"""Deepest nesting of objects and arrays a tool's arguments may have (the object itself is 1)."""
MAX_BYTES = 256 * 1024
"""Largest a tool's arguments may be, in bytes of JSON text."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class _NotFinite(ValueError):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


def decode(text: str, *, tool: str, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value of a model's argument text (ToolArgumentsInvalid says what to fix)."""
    # a character is at least one byte: text with too many characters needs no encoding
    size = len(text) if len(text) > max_bytes else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ToolArgumentsInvalid(
            f"The arguments for {tool} are more than {max_bytes} bytes of JSON. Send less "
            "(refer to large content instead of inlining it).",
            tool=tool,
        )
    if _too_deep(text, max_depth):
        raise ToolArgumentsInvalid(
            f"The arguments for {tool} are nested more than {max_depth} levels deep. Send a "
            "flatter JSON object.",
            tool=tool,
        )
    try:
        return _DECODER.decode(text) if text.strip() else {}
    except _NotFinite as exc:
        raise ToolArgumentsInvalid(
            f"The arguments for {tool} hold {exc.literal}, which is not a finite number. Send "
            "finite numbers only and call the tool again.",
            tool=tool,
        ) from None
    except json.JSONDecodeError as exc:
        raise ToolArgumentsInvalid(
            f"The arguments for {tool} are not valid JSON ({exc.msg} at position {exc.pos}). "
            "Send a JSON object matching the tool's schema.",
            tool=tool,
        ) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will convert
        raise ToolArgumentsInvalid(
            f"The arguments for {tool} cannot be read: {exc}. Correct them and call the tool "
            "again.",
            tool=tool,
        ) from None


def check_finite(value: Any, *, tool: str) -> None:
    """Refuse validated arguments holding NaN or an infinity (a string a float field took in)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if not finite(item):
            raise ToolArgumentsInvalid(
                f"The arguments for {tool} hold {item!r} at {path or '(root)'}, which is not a "
                "finite number. Send finite numbers only and call the tool again.",
                tool=tool,
            )
        if isinstance(item, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(item))


def _too_deep(text: str, max_depth: int) -> bool:
    if text.count("[") + text.count("{") <= max_depth:
        return False  # no deeper than its opening brackets, those inside strings included
    level = 0
    for bracket in _BRACKET.finditer(_STRING.sub("", text)):
        level += 1 if bracket.group() in "[{" else -1
        if level > max_depth:
            return True
    return False


def _refuse(literal: str) -> Any:
    raise _NotFinite(literal)


def _float(literal: str) -> float:
    number = float(literal)
    if not finite(number):  # 1e400 parses to infinity
        raise _NotFinite(literal)
    return number


# Built once: `json.loads` with hooks builds a new decoder, and its scanner, on every call.
_DECODER = json.JSONDecoder(parse_constant=_refuse, parse_float=_float)
