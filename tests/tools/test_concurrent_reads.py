"""The independent read calls of one model turn run at the same time; writes keep their order,
and the log reads the same whichever call finished first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from contextos import Agent, Policy, Principal, RunStatus, Runtime, Tool, tool
from contextos import events as ev
from contextos.policy import Decision, Limit, Rule
from contextos.runs import RunId
from contextos.store import SqliteStore
from contextos.testing import ScriptedModel, call_tools, reply
from contextos.tools import RetryPolicy


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(str(tmp_path / "runs.db")) as runtime:
        yield runtime


def turn(*calls: tuple[str, str]) -> object:
    return call_tools([(name, args, None) for name, args in calls])


def meeting_tools(*names: str, seen: list[str] | None = None) -> list[Tool]:
    """Read tools that each wait until all of them have started: run one after the other,
    the first would time out waiting."""
    meeting = asyncio.Barrier(len(names))

    def make(name: str) -> Tool:
        async def ask(q: str) -> str:
            await meeting.wait()
            if seen is not None:
                seen.append(f"{name} {q}")
            return f"{name}: {q}"

        ask.__doc__ = f"Ask {name}."
        return tool(name=name, timeout_s=5)(ask)

    return [make(n) for n in names]


async def test_independent_reads_of_one_turn_run_at_the_same_time(rt: Runtime) -> None:
    agent = Agent(
        name="stock",
        model=ScriptedModel([turn(("north", '{"q": "x"}'), ("south", '{"q": "y"}')), reply("7")]),
        tools=meeting_tools("north", "south"),
    )
    result = await rt.run(agent, "how many?")
    assert result.status is RunStatus.COMPLETED
    done = [e for e in await rt.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert [(e.name, e.output, e.is_error) for e in done] == [
        ("north", "north: x", False),
        ("south", "south: y", False),
    ]


async def test_results_are_recorded_in_call_order_whichever_finishes_first(rt: Runtime) -> None:
    fast_done = asyncio.Event()

    @tool(timeout_s=5)
    async def slow(q: str) -> str:
        """Slow: finishes only once `fast` has."""
        await fast_done.wait()
        return "slow"

    @tool(timeout_s=5)
    async def fast(q: str) -> str:
        """Fast."""
        fast_done.set()
        return "fast"

    agent = Agent(
        name="order",
        model=ScriptedModel([turn(("slow", '{"q": "a"}'), ("fast", '{"q": "b"}')), reply("ok")]),
        tools=[slow, fast],
    )
    result = await rt.run(agent, "go")
    done = [e for e in await rt.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert [(e.name, e.output) for e in done] == [("slow", "slow"), ("fast", "fast")]
    assert done[1].seq == done[0].seq + 1


async def test_a_write_between_reads_keeps_its_place(rt: Runtime) -> None:
    seen: list[str] = []

    def look(q: str) -> str:
        """Read."""
        seen.append(f"look {q}")
        return q

    @tool(effect="write")
    def note(text: str) -> str:
        """Write a note."""
        seen.append(f"note {text}")
        return "noted"

    agent = Agent(
        name="mixed",
        model=ScriptedModel(
            [
                turn(
                    ("north", '{"q": "1"}'),
                    ("south", '{"q": "2"}'),
                    ("note", '{"text": "n"}'),
                    ("look", '{"q": "3"}'),
                ),
                reply("ok"),
            ]
        ),
        tools=[*meeting_tools("north", "south", seen=seen), look, note],
    )
    result = await rt.run(agent, "go")
    assert result.status is RunStatus.COMPLETED
    assert sorted(seen[:2]) == ["north 1", "south 2"]
    assert seen[2:] == ["note n", "look 3"]


async def test_calls_a_policy_limit_counts_run_one_at_a_time(tmp_path: Path) -> None:
    def search(q: str) -> str:
        """Search."""
        return f"found {q}"

    policy = Policy(limits=(Limit(id="one-search", tools=("search",), max_calls=1),))
    agent = Agent(
        name="limited",
        model=ScriptedModel(
            [
                turn(
                    ("north", '{"q": "1"}'),
                    ("south", '{"q": "2"}'),
                    ("search", '{"q": "a"}'),
                    ("search", '{"q": "b"}'),
                ),
                reply("ok"),
            ]
        ),
        tools=[*meeting_tools("north", "south"), search],
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(agent, "go", principal=Principal.user("bob", scopes=("*",)))
        done = [e for e in await rt.events(result.run_id) if isinstance(e, ev.ToolCompleted)]
    assert [(e.name, e.error_code) for e in done] == [
        ("north", None),
        ("south", None),
        ("search", None),
        # decided after the first search succeeded: the limit refuses it
        ("search", "policy_denied"),
    ]
    assert done[3].output.startswith("Policy does not allow this call to search: ")


def reads(seen: list[str]) -> list[Tool]:
    """Two plain read tools that note each call they run."""

    def north(q: str) -> str:
        """Ask north."""
        seen.append(f"north {q}")
        return f"north: {q}"

    def south(q: str) -> str:
        """Ask south."""
        seen.append(f"south {q}")
        return f"south: {q}"

    return [tool(north), tool(south)]


async def test_a_read_policy_denies_among_reads_run_together_is_refused_alone(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    policy = Policy(
        rules=(
            Rule(id="no-south", decision=Decision.DENY, tools=("south",), reason="south is shut"),
        )
    )
    agent = Agent(
        name="stock",
        model=ScriptedModel([turn(("north", '{"q": "x"}'), ("south", '{"q": "y"}')), reply("ok")]),
        tools=reads(seen),
    )
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        result = await rt.run(agent, "go", principal=Principal.user("bob", scopes=("*",)))
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    assert seen == ["north x"]
    decided = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert [(d.call_id, d.tool, d.decision, d.effect_id) for d in decided] == [
        ("call_1_0", "north", "allow", None),
        ("call_1_1", "south", "deny", None),
    ]
    done = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert [(e.call_id, e.name, e.is_error, e.error_code) for e in done] == [
        ("call_1_0", "north", False, None),
        ("call_1_1", "south", True, "policy_denied"),
    ]
    assert done[1].output == "Policy does not allow this call to south: south is shut."
    # both decisions in one commit before the calls, both results in one commit after them
    assert decided[1].seq == decided[0].seq + 1 and done[1].seq == done[0].seq + 1
    assert decided[1].seq < done[0].seq


async def test_a_read_needing_approval_among_reads_run_together_runs_once_approved(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    policy = Policy(
        rules=(
            Rule(
                id="south-needs-ok",
                decision=Decision.REQUIRE_APPROVAL,
                tools=("south",),
                reason="south is sensitive",
                approver_role="ops",
            ),
        ),
        roles={"ops": ("alice",)},
    )
    model = ScriptedModel(
        [turn(("north", '{"q": "x"}'), ("south", '{"q": "y"}')), reply("ok")], by_turn=True
    )
    agent = Agent(name="stock", model=model, tools=reads(seen))
    bob = Principal.user("bob", scopes=("*",))
    async with Runtime(str(tmp_path / "runs.db"), policy=policy) as rt:
        waiting = await rt.run(agent, "go", principal=bob)
        assert waiting.status is RunStatus.INPUT_REQUIRED and seen == ["north x"]
        (asked,) = await rt.inbox()
        await rt.approve(asked.id, approver="alice")
        result = await rt.resume(waiting.run_id, agent)
        events = await rt.events(waiting.run_id)
    assert result.status is RunStatus.COMPLETED
    assert seen == ["north x", "south y"]
    first, again = [e for e in events if isinstance(e, ev.PolicyDecided) and e.tool == "south"]
    assert (first.decision, again.decision) == ("require_approval", "allow")
    assert first.action_hash == again.action_hash  # the action approved is the one that runs
    done = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert [(e.name, e.output) for e in done] == [("north", "north: x"), ("south", "south: y")]


class Appends(SqliteStore):
    """A SQLite store that notes the event types of each append (each commit of the run)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits: list[list[str]] = []

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        self.commits.append([e.type for e in events])
        return seq


@pytest.mark.parametrize(
    ("error", "text"),
    [("error", "reset"), ("timeout", "north did not finish within its time limit")],
)
async def test_the_failed_attempts_of_reads_run_together_are_recorded_with_their_results(
    tmp_path: Path, error: str, text: str
) -> None:
    tries: list[str] = []
    retry = RetryPolicy(attempts=2, safe_on=(ConnectionError, TimeoutError), backoff_s=0)

    @tool(retry=retry, timeout_s=0.05)
    async def north(q: str) -> str:
        """Ask north; its first try fails."""
        tries.append(q)
        if len(tries) == 1:
            if error == "timeout":
                await asyncio.sleep(5)
            raise ConnectionError("reset")
        return f"north: {q}"

    def south(q: str) -> str:
        """Ask south."""
        return f"south: {q}"

    agent = Agent(
        name="stock",
        model=ScriptedModel([turn(("north", '{"q": "x"}'), ("south", '{"q": "y"}')), reply("ok")]),
        tools=[north, tool(south)],
    )
    store = Appends(tmp_path / "runs.db")
    async with Runtime(store) as rt:
        result = await rt.run(agent, "go")
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    # one commit after the calls: the failed attempt, then every result, in call order
    assert ["tool_attempt_failed", "tool_completed", "tool_completed"] in store.commits
    failed, first, second = [
        e for e in events if isinstance(e, ev.ToolAttemptFailed | ev.ToolCompleted)
    ]
    assert isinstance(failed, ev.ToolAttemptFailed)
    assert (failed.call_id, failed.tool, failed.attempt, failed.will_retry) == (
        "call_1_0",
        "north",
        1,
        True,
    )
    assert text in failed.error
    assert failed.effect_id is None
    assert [(e.call_id, e.output) for e in (first, second)] == [
        ("call_1_0", "north: x"),
        ("call_1_1", "south: y"),
    ]
