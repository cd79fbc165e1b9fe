"""The rendered prompt of every model call, kept in the run's own log and content-addressed.

Each model call records its messages as a delta on the run's previous call: how many leading
messages of that call it kept, the keys of the ones it added, and the body of every message whose
key the run has not recorded yet. A message sent as the run's log holds it (no layer rewrote it)
is keyed by the seq of the event that added it (`#12`) and has no body of its own: the log is
its body. Any other message (the system prompt, a redacted or spotlighted copy) is keyed by its
sha256. Consecutive calls share their system prefix and history, so a turn records only what is
new and storage per turn stays flat; `rendered_calls` replays the deltas, with the messages of
the log, to give back exactly the messages each call sent.

Each delta also carries the digest of its call's whole list of keys. The run's state keeps the
last call's (count, digest), so a driver that takes a run over (a resume after a crash or after a
person answered) recognises the prompt it starts from without reading the log, and its first
call records only what is new too instead of the whole conversation again.
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


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""What `json.dumps` with these options writes, without building an encoder per message (a
resumed long run keys its whole history at its first call)."""


def _key(blob: Mapping[str, Any]) -> str:
    return hashlib.sha256(_CANONICAL.encode(blob).encode()).hexdigest()


DIGEST_CHARS = 32
"""Hex characters of a prompt's digest kept in its delta: 128 bits, beyond finding another list of
messages with the same digest, at a third of the bytes per call."""


def _digest(keys: Iterable[str]) -> Any:
    """sha256 of message keys in order (each ended by a newline, which no key holds), open to
    more keys."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(_fed(key))
    return digest


def _fed(key: str) -> bytes:
    return key.encode() + b"\n"


def _logged_key(seq: int) -> str:
    """The key of a message sent as the event at `seq` added it to the run's log."""
    return f"#{seq}"


Log = tuple[Sequence[Message], Sequence[int]]
"""A run's messages and the seq of the event that added each (as its folded state holds them)."""


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

    `last` is the run's last recorded call as its state keeps it (message count and digest): a
    driver that takes a run over starts from it, so its first call records only what is new
    when it begins with that call's messages (a run whose prompts were never recorded, or whose
    history was rewritten since, has its first call recorded in full).
    """

    def __init__(self, last: tuple[int, str] | None = None) -> None:
        self.known: set[str] = set()
        self.previous: list[str] = []
        self._last = last
        self._digest = _digest(())  # of `previous`, to extend call by call
        self._messages: tuple[Message, ...] = ()  # the last call's messages, beside their keys

    def record(
        self, messages: Sequence[Message], tools: Iterable[str], log: Log | None = None
    ) -> dict[str, Any]:
        """The delta of one call on the previous one (JSON data for its event's `context`);
        messages that are the very objects of the run's `log` are keyed by their seq."""
        # Consecutive calls send the same message objects for the history, so the messages the
        # last call began with are found by comparing references, and only the rest is keyed.
        messages = tuple(messages)
        same = _common_prefix(messages, self._messages)
        keys = self.previous[:same]
        bodies: dict[str, dict[str, Any]] = {}
        logged = _newest(log, len(messages) - same)
        for m in messages[same:]:
            seq = logged.get(id(m))
            if seq is not None and seq[0] is m:
                keys.append(_logged_key(seq[1]))
                continue
            blob = _blob(m)
            key = _key(blob)
            keys.append(key)
            bodies[key] = blob
        keep, digest = self._kept(keys, same)
        for key in keys[keep:]:
            digest.update(_fed(key))
        new_blobs = {k: bodies[k] for k in keys[keep:] if k in bodies and k not in self.known}
        delta = {
            "keep": keep,
            "add": keys[keep:],
            "blobs": new_blobs,
            "tools": list(tools),
            "digest": digest.hexdigest()[:DIGEST_CHARS],
        }
        self.known.update(new_blobs)
        self.previous = keys
        self._digest = digest
        self._messages = messages
        return delta

    def _kept(self, keys: list[str], same: int) -> tuple[int, Any]:
        """How many leading messages of this call the previous call recorded (`keys[:same]` are
        known to be), and the digest of their keys."""
        keep = same
        for old, new in zip(self.previous[same:], keys[same:], strict=False):
            if old != new:
                break
            keep += 1
        if self.previous:
            if keep == len(self.previous):
                return keep, self._digest.copy()
            return keep, _digest(keys[:keep])
        last, self._last = self._last, None
        if last is not None:  # the first call of a driver that took the run over
            count, digest = last
            if count <= len(keys):
                kept = _digest(keys[:count])
                if kept.hexdigest()[:DIGEST_CHARS] == digest:
                    self.known.update(keys[:count])  # their bodies are in the log already
                    return count, kept
        return 0, _digest(())


def _newest(log: Log | None, count: int) -> dict[int, tuple[Message, int]]:
    """The last `count` messages of the log by identity: those a call adds, when it adds what the
    run added since its last call."""
    if log is None or count <= 0:
        return {}
    messages, seqs = log
    return {id(m): (m, seq) for m, seq in zip(messages[-count:], seqs[-count:], strict=True)}


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


def rendered_calls(events: Iterable[Mapping[str, Any]], log: Log = ((), ())) -> list[RenderedCall]:
    """Every model call of a run whose prompt was recorded, from its events as JSON data and the
    messages of its log (its folded state's)."""
    logged = {_logged_key(seq): m for m, seq in zip(*log, strict=True)}
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
        if keep > len(previous) or any(k not in blobs and k not in logged for k in keys):
            raise EventDecodeError(
                str(e.get("run_id", "")), seq, "its prompt names messages the run never recorded"
            )
        previous = keys
        out.append(
            RenderedCall(
                seq=seq,
                turn=turn,
                messages=tuple(logged[k] if k in logged else _message(blobs[k]) for k in keys),
                tools=tuple(delta.get("tools", ())),
                manifest=tuple(context.get("manifest", ())),
                context_hash=str(e.get("context_hash") or ""),
                stack=tuple(context.get("stack", ())),
                opted_out=dict(context.get("opted_out", {})),
            )
        )
    return out
