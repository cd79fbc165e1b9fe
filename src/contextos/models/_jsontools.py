"""Tool calling for models without native tool calls: one JSON decision per turn.

The model is told about the tools in its system prompt and constrained (by a grammar or a JSON
schema response format) to answer with exactly one of

    {"name": "<tool>", "arguments": {...that tool's argument schema...}}
    {"answer": "<final answer>"}      (or the agent's output schema under "answer")

so every response parses either as a final answer or as a schema-valid call of a visible tool.
Used by the embedded model and, in `tool_mode="json"`, by the OpenAI-compatible adapter.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from contextos.errors import ModelProtocolError
from contextos.messages import FinishReason, Message, ToolCall, ToolSpec

ANSWER = "answer"


def visible_tools(tools: Sequence[ToolSpec], tool_choice: str) -> tuple[ToolSpec, ...]:
    """The tools a decision may call under `tool_choice`."""
    if tool_choice == "none":
        return ()
    if tool_choice in ("auto", "required"):
        return tuple(tools)
    return tuple(t for t in tools if t.name == tool_choice)


def decision_schema(
    tools: Sequence[ToolSpec],
    *,
    output_schema: dict[str, Any] | None = None,
    tool_choice: str = "auto",
    answer_only: bool = False,
) -> dict[str, Any]:
    """JSON schema of one decision: a call of a visible tool, or the final answer."""
    defs: dict[str, Any] = {}
    alternatives: list[dict[str, Any]] = []
    callable_tools = () if answer_only else visible_tools(tools, tool_choice)
    for i, t in enumerate(callable_tools):
        alternatives.append(
            _closed_object(
                {"name": {"const": t.name}, "arguments": _hoist(t.parameters, f"t{i}_", defs)},
            )
        )
    must_call = tool_choice not in ("auto", "none") and bool(callable_tools)
    if not must_call:
        answer = _hoist(output_schema, "out_", defs) if output_schema else {"type": "string"}
        alternatives.append(_closed_object({ANSWER: answer}))
    schema: dict[str, Any] = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def system_prompt(
    tools: Sequence[ToolSpec],
    *,
    output_schema: dict[str, Any] | None = None,
    tool_choice: str = "auto",
    answer_only: bool = False,
) -> str:
    """The system text that explains the decision format and lists the tools.

    The shapes are shown with concrete placeholder values: small models follow a concrete
    example far more reliably than an abstract one. When only an answer is allowed, the answer
    placeholder is worded so that it cannot be copied as a plausible answer.
    """
    parts: list[str] = []
    callable_tools = visible_tools(tools, tool_choice)
    if output_schema:
        answer_shape = '{"answer": <a JSON value matching the answer schema below>}'
    elif answer_only:
        answer_shape = '{"answer": "<your answer to the user>"}'
    else:
        answer_shape = '{"answer": "text"}'
    when = (
        "to answer once the tool results tell you what you need"
        if answer_only
        else "when you have the final answer"
    )
    if callable_tools:
        listing = "\n".join(
            json.dumps(
                {"name": t.name, "description": t.description, "parameters": _compact(t.parameters)}
            )
            for t in callable_tools
        )
        parts.append(
            'Reply with JSON only: {"name": "func_name", "arguments": {"argument1": "value1"}} '
            f"to call a tool, or {answer_shape} {when}."
        )
        parts.append(f"You have access to the following tools:\n<tools>\n{listing}\n</tools>")
    else:
        parts.append(f"Reply with JSON only: {answer_shape}.")
    if output_schema:
        parts.append(f"Answer schema: {json.dumps(_compact(output_schema))}")
    return "\n\n".join(parts)


def render_messages(messages: Sequence[Message], system: str) -> list[dict[str, str]]:
    """Plain role/content chat messages: calls and answers as decisions, results as user text.

    Small chat models are trained on system/user/assistant turns only, so a tool result is shown
    as a user turn naming the tool, and earlier assistant turns as the JSON they decided.
    """
    out: list[dict[str, str]] = []
    extra_system = [m.content for m in messages if m.role == "system" and m.content]
    merged_system = "\n\n".join([*extra_system, system]) if system else "\n\n".join(extra_system)
    if merged_system:
        out.append({"role": "system", "content": merged_system})
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "assistant":
            lines = [
                json.dumps({"name": c.name, "arguments": _loads_or_raw(c.arguments)})
                for c in m.tool_calls
            ]
            if m.content and not lines:
                lines.append(json.dumps({ANSWER: _loads_or_raw(m.content, keep_text=True)}))
            out.append({"role": "assistant", "content": "\n".join(lines)})
        elif m.role == "tool":
            text = f"Tool result from {m.name or 'the tool'}: {m.content}"
            _append_user(out, text)
        else:
            _append_user(out, m.content)
    return out


def parse_decision(text: str, *, output_schema: dict[str, Any] | None = None) -> Message:
    """The assistant message a decision stands for (text as is when it is not JSON).

    A call whose name is not a non-empty string, or whose arguments are neither an object nor
    JSON text, is a ModelProtocolError: no tool call is made of it.
    """
    try:
        # Lenient about raw control characters in strings: some servers' grammars allow them.
        data = json.loads(text, strict=False)
    except (json.JSONDecodeError, RecursionError):
        return Message(role="assistant", content=text)
    if isinstance(data, dict) and "name" in data and "arguments" in data:
        name, arguments = data["name"], data["arguments"]
        if not isinstance(name, str) or not name:
            raise ModelProtocolError(
                f"the decision's tool name is a {type(name).__name__}, not a non-empty string"
            )
        if not isinstance(arguments, dict | str):
            raise ModelProtocolError(
                f"the decision's arguments for {name[:100]!r} are a "
                f"{type(arguments).__name__}, not an object"
            )
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call = ToolCall(id="call_0", name=name, arguments=raw)
        return Message(role="assistant", tool_calls=(call,))
    if isinstance(data, dict) and ANSWER in data:
        answer = data[ANSWER]
        content = answer if isinstance(answer, str) and not output_schema else json.dumps(answer)
        return Message(role="assistant", content=content)
    return Message(role="assistant", content=text)


def finish_reason_of(message: Message, *, truncated: bool) -> FinishReason:
    if message.tool_calls:
        return FinishReason.TOOL_CALLS
    return FinishReason.LENGTH if truncated else FinishReason.STOP


def tool_rounds(messages: Sequence[Message]) -> int:
    """Assistant turns that called tools since the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    return sum(1 for m in messages[last_user + 1 :] if m.role == "assistant" and m.tool_calls)


def repeats_answered_call(messages: Sequence[Message], call: ToolCall) -> bool:
    """True when the same call (name and arguments) was already made and answered this turn."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    recent = messages[last_user + 1 :]
    answered = {m.tool_call_id for m in recent if m.role == "tool"}
    wanted = _loads_or_raw(call.arguments)
    return any(
        c.id in answered and c.name == call.name and _loads_or_raw(c.arguments) == wanted
        for m in recent
        if m.role == "assistant"
        for c in m.tool_calls
    )


# -- helpers ------------------------------------------------------------------------------


def _closed_object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _hoist(schema: dict[str, Any] | None, prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Copy `schema` for embedding, moving its `$defs` to the root under prefixed names."""
    if not schema:
        return {"type": "object"}
    schema = copy.deepcopy(schema)
    local = schema.pop("$defs", None) or schema.pop("definitions", None) or {}
    renames = {f"#/$defs/{k}": f"#/$defs/{prefix}{k}" for k in local} | {
        f"#/definitions/{k}": f"#/$defs/{prefix}{k}" for k in local
    }

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (renames.get(v, v) if k == "$ref" and isinstance(v, str) else fix(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    for k, v in local.items():
        defs[f"{prefix}{k}"] = fix(v)
    fixed: dict[str, Any] = fix(schema)
    return fixed


def _compact(schema: dict[str, Any]) -> Any:
    """A schema without titles, for prompts (titles only repeat the property names)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(schema)


def _loads_or_raw(text: str, *, keep_text: bool = False) -> Any:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    if keep_text and not isinstance(value, (dict, list)):
        return text
    return value


def _append_user(out: list[dict[str, str]], text: str) -> None:
    if out and out[-1]["role"] == "user":
        out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + text}
    else:
        out.append({"role": "user", "content": text})
