"""The loop driver: every step recorded before it is acted on; distinct failure reasons."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import Agent, Budget, FailureReason, ModelError, RunStatus, Runtime
from contextos import events as ev
from contextos.messages import FinishReason, Message
from contextos.models.base import ModelRequest, ModelResponse
from contextos.testing import ScriptedModel, call_tool, call_tools, reply


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def always_fails(x: str) -> str:
    """A tool that always raises."""
    raise RuntimeError(f"backend down for {x}")


@pytest.fixture
async def runtime(tmp_path: Path):
    rt = Runtime(str(tmp_path / "runs.db"))
    yield rt
    await rt.close()


def types(events: list[ev.Event]) -> list[str]:
    return [e.type for e in events]


async def test_tool_call_then_answer_is_recorded_in_order(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("add", {"a": 2, "b": 3}), reply("The sum is 5.")])
    agent = Agent(name="calc", model=model, tools=[add], instructions="Add numbers.")
    result = await runtime.run(agent, "2+3?")
    assert result.status is RunStatus.COMPLETED
    assert result.output == "The sum is 5."
    events = await runtime.events(result.run_id)
    assert types(events) == [
        "run_created",
        "run_started",
        "model_responded",
        "tool_completed",
        "model_responded",
        "artifact_recorded",
        "run_completed",
    ]
    tool_event = events[3]
    assert isinstance(tool_event, ev.ToolCompleted) and tool_event.output == "5"
    # The model saw the instructions first and the tool result on its second call.
    second = model.requests[1]
    # The platform layers are on by default: the tool's output arrives marked as data.
    system, tool_result = second.messages[0], second.messages[-1]
    assert system.role == "system" and system.content.startswith("Add numbers.\n\n")
    assert tool_result.role == "tool" and tool_result.content.startswith("<<untrusted-data")
    assert "\n5\n" in tool_result.content
    assert [t.name for t in second.tools] == ["add"]
    model.assert_complete()


async def test_invalid_arguments_go_back_to_the_model_and_are_corrected(runtime: Runtime) -> None:
    model = ScriptedModel(
        [
            call_tool("add", '{"a": 2, "b": '),  # malformed JSON
            call_tool("add", {"a": "two", "b": 3}),  # wrong type
            call_tool("add", {"a": 2, "b": 3}),
            reply("5"),
        ]
    )
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "2+3?")
    assert result.status is RunStatus.COMPLETED
    outcomes = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert [o.error_code for o in outcomes] == ["invalid_arguments", "invalid_arguments", None]
    assert "not valid JSON" in outcomes[0].output
    assert "a: Input should be a valid integer" in outcomes[1].output
    assert outcomes[2].output == "5"
    # What the model read on its second call is the correctable error.
    assert "not valid JSON" in model.requests[1].messages[-1].content


async def test_unknown_tool_lists_the_available_ones(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("multiply", {"a": 1}), reply("sorry")])
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "x")
    outcome = next(
        e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)
    )
    assert outcome.is_error and outcome.error_code == "unknown_tool"
    assert "Available tools: add" in outcome.output


async def test_parallel_tool_calls_each_get_a_result(runtime: Runtime) -> None:
    model = ScriptedModel(
        [
            call_tools([("add", '{"a":1,"b":1}', None), ("add", '{"a":2,"b":2}', None)]),
            reply("2, 4"),
        ]
    )
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "x")
    outcomes = [e for e in await runtime.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert [(o.call_id, o.output) for o in outcomes] == [("call_1_0", "2"), ("call_1_1", "4")]


async def test_failed_verification_feeds_gaps_back_then_passes(runtime: Runtime) -> None:
    def must_cite(answer: str) -> list[str]:
        return [] if "[source]" in answer else ["Cite a [source]."]

    model = ScriptedModel([reply("Paris."), reply("Paris [source].")])
    result = await runtime.run(Agent(name="qa", model=model, verifier=must_cite), "Capital?")
    assert result.status is RunStatus.COMPLETED and result.output == "Paris [source]."
    events = await runtime.events(result.run_id)
    failed = next(e for e in events if isinstance(e, ev.VerificationFailed))
    assert failed.gaps == ("Cite a [source].",)
    assert "Cite a [source]." in model.requests[1].messages[-1].content


async def test_verification_that_never_passes_fails_the_run(runtime: Runtime) -> None:
    model = ScriptedModel([reply("no"), reply("no"), reply("no")])
    agent = Agent(
        name="qa",
        model=model,
        verifier=lambda answer: False,
        budget=Budget(max_verification_attempts=2),
    )
    result = await runtime.run(agent, "x")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.VERIFICATION_FAILED
    model.assert_complete()


async def test_structured_output_is_parsed_and_checked(runtime: Runtime) -> None:
    class Answer(BaseModel):
        city: str
        confidence: float

    model = ScriptedModel([reply("Paris"), reply('{"city": "Paris", "confidence": 0.9}')])
    result = await runtime.run(Agent(name="qa", model=model, output_type=Answer), "Capital?")
    assert result.status is RunStatus.COMPLETED
    assert result.structured_output == {"city": "Paris", "confidence": 0.9}
    assert model.requests[0].output_schema == Answer.model_json_schema()
    assert "JSON object matching this schema" in model.requests[1].messages[-1].content


async def test_max_turns_ends_with_budget_exhausted_before_calling_the_model(
    runtime: Runtime,
) -> None:
    model = ScriptedModel([call_tool("add", {"a": 1, "b": 1})] * 2)
    agent = Agent(name="calc", model=model, tools=[add], budget=Budget(max_turns=2))
    result = await runtime.run(agent, "loop forever")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert len(model.requests) == 2  # the third call was never made


async def test_token_budget(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("add", {"a": 1, "b": 1}, input_tokens=600, output_tokens=500)])
    agent = Agent(name="calc", model=model, tools=[add], budget=Budget(max_tokens=1000))
    result = await runtime.run(agent, "x")
    assert result.failure_reason is FailureReason.BUDGET_EXHAUSTED
    assert "1100 of 1000 tokens" in (result.failure_message or "")


async def test_deadline_ends_the_run_with_timeout(runtime: Runtime) -> None:
    async def slow(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    class Slow:
        name = "slow"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            return await slow(request)

    agent = Agent(name="slow", model=Slow(), budget=Budget(deadline_s=0.3))
    result = await runtime.run(agent, "x")
    assert result.status is RunStatus.FAILED
    assert result.failure_reason is FailureReason.TIMEOUT


async def test_model_error_and_refusal_are_distinct(runtime: Runtime) -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        raise ModelError("provider said 400: bad request", status_code=400)

    result = await runtime.run(Agent(name="a", model=ScriptedModel([broken])), "x")
    assert result.failure_reason is FailureReason.MODEL_ERROR
    assert "bad request" in (result.failure_message or "")

    refusal = ModelResponse(
        message=Message(role="assistant", content="I can't help with that."),
        finish_reason=FinishReason.REFUSED,
    )
    result = await runtime.run(Agent(name="a", model=ScriptedModel([refusal])), "x")
    assert result.failure_reason is FailureReason.MODEL_REFUSED
    assert result.failure_message == "I can't help with that."


async def test_repeated_tool_failures_end_with_tool_failed(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("always_fails", {"x": str(i)}) for i in range(3)])
    agent = Agent(
        name="a",
        model=model,
        tools=[always_fails],
        budget=Budget(max_consecutive_tool_errors=3),
    )
    result = await runtime.run(agent, "x")
    assert result.failure_reason is FailureReason.TOOL_FAILED
    assert "backend down for 2" in (result.failure_message or "")


async def test_usage_is_summed_over_the_run(runtime: Runtime) -> None:
    model = ScriptedModel(
        [call_tool("add", {"a": 1, "b": 2}, input_tokens=7, output_tokens=3), reply("3")]
    )
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "x")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (17, 8)
    summary = (await runtime.runs())[0]
    assert (summary.turns, summary.input_tokens, summary.output_tokens) == (2, 17, 8)


async def test_scripted_model_fails_loudly_on_an_extra_call(runtime: Runtime) -> None:
    model = ScriptedModel([call_tool("add", {"a": 1, "b": 2})])
    result = await runtime.run(Agent(name="calc", model=model, tools=[add]), "x")
    assert result.failure_reason is FailureReason.MODEL_ERROR
    assert "scripted model has 1 steps" in (result.failure_message or "")
    with pytest.raises(AssertionError):
        ScriptedModel([reply("a"), reply("b")]).assert_complete()
