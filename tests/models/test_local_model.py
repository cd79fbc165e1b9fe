"""The embedded llama.cpp model: real weights, real sampling, constrained tool calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from contextos import Agent, Budget, FailureReason, RunStatus, Runtime, tool
from contextos.errors import ConfigError
from contextos.messages import FinishReason, Message, ToolCall
from contextos.models import resolve_model
from contextos.models.base import ModelRequest, ModelResponse, StreamingModelAdapter
from contextos.models.local import LocalModel, load_model, loaded_models
from contextos.models.pricing import Price

pytestmark = pytest.mark.local_model


@pytest.fixture(autouse=True)
def _needs_the_model(model_path: Path) -> None:
    """Every test here runs the real model: skip without it locally, fail under CI."""


def get_weather(city: str) -> dict[str, object]:
    """Get the current weather for a city."""
    return {"city": city, "temp_c": 18, "sky": "cloudy"}


def add(a: int, b: int) -> int:
    """Add two integers and return the sum."""
    return a + b


def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a recipient."""
    return "sent"


def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order by its id."""
    return {"order_id": order_id, "status": "shipped"}


def set_thermostat(room: Literal["kitchen", "bedroom", "office"], celsius: int) -> str:
    """Set the thermostat of a room to a temperature in degrees Celsius."""
    return "ok"


class Address(BaseModel):
    street: str
    city: str


def ship(order_id: str, to: Address) -> str:
    """Ship an order to an address."""
    return "shipped"


TOOLS = [tool(f) for f in (get_weather, add, send_email, lookup_order, set_thermostat)]
SPECS = tuple(t.spec() for t in TOOLS)
BY_NAME = {t.name: t for t in TOOLS}

PROMPTS = [
    ("What is the weather in Paris?", "get_weather"),
    ("How warm is it in Tokyo right now?", "get_weather"),
    ("What is 17 plus 25?", "add"),
    ("Add 3 and 4.", "add"),
    ("Email bob@example.com with subject Hello and body See you tomorrow.", "send_email"),
    ("Where is my order A1234?", "lookup_order"),
    ("Look up order 998.", "lookup_order"),
    ("Is it raining in London?", "get_weather"),
    ("Compute 100 + 250.", "add"),
    ("Send an email to alice@example.com saying the report is ready.", "send_email"),
    ("Set the kitchen thermostat to 21 degrees.", "set_thermostat"),
    ("Weather in Berlin please.", "get_weather"),
]


def ask(text: str, **kw: object) -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content=text),), tools=SPECS, **kw)  # type: ignore[arg-type]


def valid_call(call: ToolCall) -> bool:
    """The call names a visible tool and its arguments pass that tool's own validation."""
    found = BY_NAME.get(call.name)
    if found is None:
        return False
    found.args_model.model_validate_json(call.arguments)  # raises when invalid
    return True


def test_loads_without_extra_buffer_types_and_runs_a_multi_token_prompt(model_path: Path) -> None:
    # A natively built llama.cpp with repacked (AMX) weights crashed here on any prompt longer
    # than one token; the load must keep extra buffer types off.
    loaded = load_model(model_path)
    assert loaded.llama.model_params.use_extra_bufts is False
    out = loaded.llama.create_completion(
        "The capital of France is a city called", max_tokens=8, temperature=0.0
    )
    assert out["usage"]["prompt_tokens"] > 1
    assert out["usage"]["completion_tokens"] >= 1
    assert out["choices"][0]["text"].strip()


def test_grammar_keeps_raw_control_characters_out_of_json_strings() -> None:
    # llama-cpp-python's converter allows a raw newline inside a string, which is not JSON;
    # a small model then writes one and the decision no longer parses.
    from contextos.models.local import _grammar

    gbnf = _grammar(json.dumps({"type": "object", "properties": {"s": {"type": "string"}}}))
    assert r'char ::= [^"\\\x7F\x00-\x1F]' in gbnf._grammar


def test_one_model_per_process(model_path: Path) -> None:
    a, b = LocalModel(), LocalModel(model_path)
    assert a.load() is b.load()
    assert list(loaded_models()) == [model_path.resolve()]


async def test_simple_tool_prompts_give_schema_valid_tool_calls() -> None:
    model = LocalModel()
    calls = right = 0
    for text, expected in PROMPTS:
        response = await model.complete(ask(text))
        message = response.message
        if message.tool_calls:
            # Constrained decoding: a proposed call is always one call of a visible tool whose
            # arguments validate. A malformed call would raise here.
            assert len(message.tool_calls) == 1
            assert valid_call(message.tool_calls[0])
            assert response.finish_reason is FinishReason.TOOL_CALLS
            calls += 1
            right += message.tool_calls[0].name == expected
        else:
            assert message.content, "neither a call nor an answer"
    print(f"\nlocal model: {calls}/{len(PROMPTS)} schema-valid tool calls, {right} the right tool")
    assert calls >= 10


async def test_required_tool_choice_always_gives_a_valid_call() -> None:
    model = LocalModel()
    for text, _ in PROMPTS:
        response = await model.complete(ask(text, tool_choice="required"))
        assert len(response.message.tool_calls) == 1
        assert valid_call(response.message.tool_calls[0])


async def test_named_tool_choice_calls_that_tool_with_valid_arguments() -> None:
    response = await LocalModel().complete(
        ask("Make the bedroom warmer.", tool_choice="set_thermostat")
    )
    (call,) = response.message.tool_calls
    assert call.name == "set_thermostat"
    args = json.loads(call.arguments)
    assert args["room"] in ("kitchen", "bedroom", "office")
    assert isinstance(args["celsius"], int)


async def test_nested_argument_models_are_constrained_too() -> None:
    shipper = tool(ship)
    response = await LocalModel().complete(
        ModelRequest(
            messages=(Message(role="user", content="Ship order 7 to 1 Main St, Springfield."),),
            tools=(shipper.spec(),),
            tool_choice="required",
        )
    )
    (call,) = response.message.tool_calls
    args = shipper.args_model.model_validate_json(call.arguments)
    assert isinstance(args.to, Address)  # type: ignore[attr-defined]


async def test_after_a_tool_round_the_model_answers() -> None:
    messages = (
        Message(role="user", content="What is 17 plus 25?"),
        Message(
            role="assistant",
            tool_calls=(ToolCall(id="call_1_0", name="add", arguments='{"a": 17, "b": 25}'),),
        ),
        Message(role="tool", content="42", tool_call_id="call_1_0", name="add"),
    )
    response = await LocalModel().complete(ModelRequest(messages=messages, tools=SPECS))
    assert response.message.tool_calls == ()
    assert response.finish_reason is FinishReason.STOP
    assert response.message.content


async def test_an_answered_call_is_not_repeated_even_without_a_round_cap() -> None:
    messages = (
        Message(role="user", content="What is the weather in Paris?"),
        Message(
            role="assistant",
            tool_calls=(
                ToolCall(id="call_1_0", name="get_weather", arguments='{"city": "Paris"}'),
            ),
        ),
        Message(
            role="tool",
            content='{"city": "Paris", "temp_c": 18, "sky": "cloudy"}',
            tool_call_id="call_1_0",
            name="get_weather",
        ),
    )
    model = LocalModel(max_tool_rounds=None)
    response = await model.complete(ModelRequest(messages=messages, tools=SPECS))
    repeated = [
        c
        for c in response.message.tool_calls
        if (c.name, json.loads(c.arguments)) == ("get_weather", {"city": "Paris"})
    ]
    assert repeated == []


async def test_structured_answer_follows_the_output_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    response = await LocalModel().complete(
        ModelRequest(
            messages=(Message(role="user", content="Paris is sunny today. Report it."),),
            output_schema=schema,
        )
    )
    data = json.loads(response.message.content)
    assert set(data) == {"city", "sunny"}
    assert isinstance(data["sunny"], bool)


async def test_streaming_yields_the_answer_text_then_the_response() -> None:
    model = LocalModel()
    assert isinstance(model, StreamingModelAdapter)
    items = [
        x
        async for x in model.stream(
            ModelRequest(messages=(Message(role="user", content="Say hello to Ada."),))
        )
    ]
    *deltas, final = items
    assert isinstance(final, ModelResponse)
    text = [d for d in deltas if isinstance(d, str)]
    assert len(text) == len(deltas) > 1
    assert "".join(text).strip() == final.message.content
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


async def test_generation_does_not_block_the_event_loop() -> None:
    model = LocalModel()
    model.load()
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    first, second = await asyncio.gather(
        model.complete(ask("What is 17 plus 25?")), model.complete(ask("Add 3 and 4."))
    )
    done.set()
    await task
    assert first.message.tool_calls and second.message.tool_calls
    assert ticks > 1


async def test_a_missing_model_file_is_a_clear_config_error(tmp_path: Path) -> None:
    model = resolve_model(f"local:{tmp_path / 'missing.gguf'}")
    assert isinstance(model, LocalModel)
    with pytest.raises(ConfigError, match="no model file"):
        await model.complete(ask("hi"))


# -- through the runtime -------------------------------------------------------------------


async def test_agent_on_the_local_model_completes_a_tool_run(tmp_path: Path) -> None:
    agent = Agent(
        name="weather",
        model="local",
        instructions="You answer questions about the weather.",
        tools=[get_weather],
    )
    async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}") as runtime:
        result = await runtime.run(agent, "What is the weather in Paris?")
        events = await runtime.events(result.run_id)
    assert result.status is RunStatus.COMPLETED, result.failure_message
    assert result.output
    tools_run = [e for e in events if e.type == "tool_completed"]
    assert tools_run and not tools_run[0].is_error
    responded = [e for e in events if e.type == "model_responded"]
    assert all(e.model.startswith("local:") for e in responded)
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0


async def test_a_cost_budget_ends_the_run_with_budget_exhausted(tmp_path: Path) -> None:
    # A price for the local model so each call costs money: the first call costs more than the
    # whole budget, so the loop must refuse the second.
    priced = LocalModel(price=Price(input_per_mtok=1000.0, output_per_mtok=1000.0))
    agent = Agent(
        name="calc",
        model=priced,
        tools=[add],
        budget=Budget(max_cost_usd=0.01),
    )
    async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}") as runtime:
        result = await runtime.run(agent, "What is 17 plus 25?")
        events = await runtime.events(result.run_id)
    responded = [e for e in events if e.type == "model_responded"]
    assert len(responded) == 1
    recorded = responded[0].usage
    assert recorded.cost_usd == pytest.approx(
        (recorded.input_tokens + recorded.output_tokens) * 1000.0 / 1_000_000
    )
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert result.usage.cost_usd >= 0.01
