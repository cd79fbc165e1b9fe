"""The rendered prompt of every model call, kept in the run's own log and content-addressed.

Each model call records its messages as a delta on the run's previous call: how many leading
messages of that call it kept, the keys (sha256) of the ones it added, and the body of every
message whose key the run has not recorded yet. Consecutive calls share their system prefix and
history, so a turn records only what is new and storage per turn stays flat; `rendered_calls`
replays the deltas to give back exactly the messages each call sent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextos.errors import EventDecodeError
from contextos.messages import Message, ToolCall


def _blob(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name:
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [[c.id, c.name, c.arguments] for c in m.tool_calls]
    return out


def _key(blob: Mapping[str, Any]) -> str:
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _message(blob: Mapping[str, Any]) -> Message:
    return Message(
        role=blob["role"],
        content=blob.get("content", ""),
        name=blob.get("name"),
        tool_call_id=blob.get("tool_call_id"),
        tool_calls=tuple(
            ToolCall(id=i, name=n, arguments=a) for i, n, a in blob.get("tool_calls", ())
        ),
    )


class RenderedLog:
    """What one driver has recorded of a run's prompts: the keys known and the last call's list.

    A new driver (a resume) starts empty, so its first call is recorded in full.
    """

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.previous: list[str] = []
        self._messages: tuple[Message, ...] = ()  # the last call's messages, beside their keys

    def record(self, messages: Sequence[Message], tools: Iterable[str]) -> dict[str, Any]:
        """The delta of one call on the previous one (JSON data for its event's `context`)."""
        # Consecutive calls send the same message objects for the history, so the messages the
        # last call began with are found by comparing references, and only the rest is hashed.
        messages = tuple(messages)
        keep = _common_prefix(messages, self._messages)
        keys = self.previous[:keep]
        new_blobs: dict[str, dict[str, Any]] = {}
        for m in messages[keep:]:
            blob = _blob(m)
            key = _key(blob)
            keys.append(key)
            if key not in self.known:
                new_blobs[key] = blob
        for old, new in zip(self.previous[keep:], keys[keep:], strict=False):
            if old != new:
                break
            keep += 1
        delta = {
            "keep": keep,
            "add": keys[keep:],
            "blobs": new_blobs,
            "tools": list(tools),
        }
        self.known.update(new_blobs)
        self.previous = keys
        self._messages = messages
        return delta


def _common_prefix(a: tuple[Message, ...], b: tuple[Message, ...]) -> int:
    """How many leading messages `a` and `b` share (sequence comparison checks `is` first)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # the largest k with a[:k] == b[:k]; hi never holds
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, kw_only=True, slots=True)
class RenderedCall:
    """One model call as the model received it, with the lineage recorded beside it."""

    seq: int
    """The `model_responded` event that recorded the call."""
    turn: int
    """Which model call of the run it was, from 1."""
    messages: tuple[Message, ...]
    """Exactly the messages sent."""
    tools: tuple[str, ...]
    """Names of the tools the model was shown."""
    manifest: tuple[dict[str, Any], ...]
    """Lineage: one row per block included, and per block left out (`dropped`)."""
    context_hash: str
    """Hash of the manifest."""
    stack: tuple[str, ...]
    """The middleware the call went through, outermost first."""
    opted_out: Mapping[str, str]
    """Default platform layers the agent left out, with its reasons."""


def rendered_calls(events: Iterable[Mapping[str, Any]]) -> list[RenderedCall]:
    """Every model call of a run whose prompt was recorded, from its events as JSON data."""
    blobs: dict[str, dict[str, Any]] = {}
    previous: list[str] = []
    out: list[RenderedCall] = []
    turn = 0
    for e in events:
        if e.get("type") != "model_responded":
            continue
        turn += 1
        context = e.get("context") or {}
        delta = context.get("rendered")
        if not isinstance(delta, Mapping):
            continue  # recorded before prompts were kept
        seq = int(e["seq"])
        blobs.update(delta.get("blobs", {}))
        keep = int(delta.get("keep", 0))
        keys = previous[:keep] + list(delta.get("add", ()))
        if keep > len(previous) or any(k not in blobs for k in keys):
            raise EventDecodeError(
                str(e.get("run_id", "")), seq, "its prompt names messages the run never recorded"
            )
        previous = keys
        out.append(
            RenderedCall(
                seq=seq,
                turn=turn,
                messages=tuple(_message(blobs[k]) for k in keys),
                tools=tuple(delta.get("tools", ())),
                manifest=tuple(context.get("manifest", ())),
                context_hash=str(e.get("context_hash") or ""),
                stack=tuple(context.get("stack", ())),
                opted_out=dict(context.get("opted_out", {})),
            )
        )
    return out
