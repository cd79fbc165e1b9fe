"""The JSON decision that small models and json-mode servers answer with, and its parsing."""

from __future__ import annotations

import json

from pydantic import BaseModel

from contextos import tool
from contextos.messages import Message, ToolCall
from contextos.models import _jsontools as jt
from contextos.models.local import _AnswerText


class Address(BaseModel):
    street: str
    city: str


def ship(order_id: str, to: Address) -> str:
    """Ship an order to an address."""
    return "shipped"


def test_decision_schema_hoists_definitions_of_each_tool() -> None:
    spec = tool(ship).spec()
    assert "$defs" in spec.parameters
    schema = jt.decision_schema([spec])
    call, answer = schema["oneOf"]
    assert call["properties"]["name"] == {"const": "ship"}
    ref = call["properties"]["arguments"]["properties"]["to"]["$ref"]
    assert ref == "#/$defs/t0_Address"
    assert set(schema["$defs"]) == {"t0_Address"}
    assert answer["properties"] == {"answer": {"type": "string"}}


def test_tool_choice_shapes_the_decision() -> None:
    spec = tool(ship).spec()
    required = jt.decision_schema([spec], tool_choice="required")
    assert "oneOf" not in required and required["required"] == ["name", "arguments"]
    none = jt.decision_schema([spec], tool_choice="none")
    assert none["required"] == ["answer"]
    only_answer = jt.decision_schema([spec], answer_only=True)
    assert only_answer["required"] == ["answer"]


def test_decisions_parse_into_calls_and_answers() -> None:
    call = jt.parse_decision('{"name": "ship", "arguments": {"order_id": "7"}}')
    assert call.tool_calls[0].name == "ship"
    assert json.loads(call.tool_calls[0].arguments) == {"order_id": "7"}
    assert jt.parse_decision('{"answer": "done"}').content == "done"
    structured = jt.parse_decision('{"answer": {"ok": true}}', output_schema={"type": "object"})
    assert json.loads(structured.content) == {"ok": True}
    assert jt.parse_decision('{"answer": "trunc').content == '{"answer": "trunc'


def test_history_is_rendered_as_plain_chat() -> None:
    call = ToolCall(id="c1", name="ship", arguments='{"order_id": "7"}')
    rendered = jt.render_messages(
        (
            Message(role="system", content="Be kind."),
            Message(role="user", content="Ship 7"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content="shipped", tool_call_id="c1", name="ship"),
        ),
        "PROTOCOL",
    )
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"] == "Be kind.\n\nPROTOCOL"
    assert json.loads(rendered[2]["content"]) == {"name": "ship", "arguments": {"order_id": "7"}}
    assert rendered[3]["content"] == "Tool result from ship: shipped"


def test_repeated_calls_and_rounds_are_counted_since_the_last_user_message() -> None:
    call = ToolCall(id="c1", name="ship", arguments='{"order_id": "7"}')
    history = (
        Message(role="user", content="Ship 7"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content="shipped", tool_call_id="c1", name="ship"),
    )
    same = ToolCall(id="x", name="ship", arguments='{ "order_id" : "7" }')
    other = ToolCall(id="y", name="ship", arguments='{"order_id": "8"}')
    assert jt.repeats_answered_call(history, same)
    assert not jt.repeats_answered_call(history, other)
    assert jt.tool_rounds(history) == 1
    again = (*history, Message(role="user", content="Ship 7 again"))
    assert not jt.repeats_answered_call(again, same)
    assert jt.tool_rounds(again) == 0


def test_answer_text_streams_out_of_a_partial_decision() -> None:
    extract = _AnswerText()
    chunks = ['{"ans', 'wer": "Hel', "lo \\", "n", "ew \\u00e9", 't\\"s', '"}']
    deltas = [extract.feed(c) for c in chunks]
    assert "".join(deltas) == json.loads('"Hello \\new \\u00e9t\\"s"')
    assert extract.text == "".join(deltas)
    call = _AnswerText()
    assert call.feed('{"name": "x", "arguments": {"answer": "no"}}') == ""
