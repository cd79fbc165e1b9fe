"""Agents the trigger tests start, and worker processes import by reference (`path.py:attr`).

Every agent answers from a scripted model by turn, so whichever process drives a run gets the
step for the turn the run is on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from contextos import Agent, Workflow
from contextos.runs import Budget
from contextos.testing import ScriptedModel, call_tool, reply

writer = Agent(
    name="writer", model=ScriptedModel([reply("draft: the quarterly report")], by_turn=True)
)
"""The source agent: its runs complete with a fixed answer."""


class Draft(BaseModel):
    text: str
    by: str


def count_words(draft: Draft) -> int:
    return len(draft.text.split())


counter = Workflow("counter", input=Draft)
counter.code("count", count_words)
"""A workflow a trigger starts: its input is JSON, rendered from the source run."""


def word_count(text: str) -> str:
    """Count the words of a text."""
    return str(len(text.split()))


failing_writer = Agent(
    name="writer",
    model=ScriptedModel([call_tool("word_count", {"text": "a b"}), reply("2")], by_turn=True),
    tools=[word_count],
    budget=Budget(max_turns=1),
)
"""Also named `writer`; its runs fail: the answer needs a second turn its budget lacks."""

reviewer = Agent(name="reviewer", model=ScriptedModel([reply("reviewed")], by_turn=True))
"""Started after a writer run."""

publisher = Agent(name="publisher", model=ScriptedModel([reply("published")], by_turn=True))
"""Started after a reviewer run (chains)."""

looper = Agent(name="looper", model=ScriptedModel([reply("again")], by_turn=True))
"""Triggers itself (loop guard)."""

GATE_ENV = "CONTEXTOS_TEST_GATE"
"""A folder: when set, loading `gated` waits there until the test says go."""


def gated() -> Agent:
    """The reviewer, from a factory that (in worker processes given GATE_ENV) writes `loading`
    and waits for `go`: the test can kill the worker after the source run ended and before the
    trigger's run is started."""
    folder = os.environ.get(GATE_ENV)
    if folder:
        gate = Path(folder)
        (gate / f"loading-{os.getpid()}").touch()
        deadline = time.monotonic() + 120
        while not (gate / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never said go")
            time.sleep(0.02)
    return reviewer


BREAK_ENV = "CONTEXTOS_TEST_BREAK"
"""When set, building `fragile` fails the way a broken deploy does."""


def fragile() -> Agent:
    """The reviewer, from a factory that raises (not a ContextOSError) when BREAK_ENV is set."""
    if os.environ.get(BREAK_ENV):
        raise RuntimeError("the agent's setup failed")
    return reviewer
