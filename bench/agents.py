"""ContextOS agents the newer workloads share, loadable by reference from worker processes.

`contextos worker` loads an agent from `path/to/file.py:attr`, so the agents the scale-out and
memory benchmarks queue live at module level here. Only the public API is used.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import MESSAGE, SCALE_CALLS, SCALE_TOOL_S, rss_mb
from contextos import Agent, Budget, ModelRequest, ModelResponse, tool
from contextos.testing import call_tool, reply

HERE = Path(__file__).resolve()


def ref(attr: str) -> str:
    """The reference a worker process loads `attr` of this module by."""
    return f"{HERE}:{attr}"


class Script:
    """A scripted model that answers by turn and keeps nothing of what it was asked.

    `contextos.testing.ScriptedModel` records every request, which is right for tests and
    wrong for a process measured over 10,000 runs. `on_turn` (if given) is called with each
    request's turn number, which is how a long run samples its own memory; with `keep_last`
    it keeps the latest request, to check what the model was shown.
    """

    name = "scripted"

    def __init__(
        self,
        steps: Sequence[ModelResponse],
        *,
        on_turn: Callable[[int], None] | None = None,
        keep_last: bool = False,
    ) -> None:
        self.steps = list(steps)
        self.on_turn = on_turn
        self.keep_last = keep_last
        self.last: ModelRequest | None = None
        """The latest request (only with `keep_last`)."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.on_turn is not None:
            self.on_turn(request.turn)
        if self.keep_last:
            self.last = request
        return self.steps[request.turn - 1]


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@tool
async def wait(text: str) -> str:
    """Return the text after a while (the scale-out benchmark's slow tool)."""
    await asyncio.sleep(SCALE_TOOL_S)
    return text


def echo_agent(turns: int, *, name: str = "echo", on_turn: Any = None) -> Agent:
    """`turns` echo calls with the 200-character message, then the answer."""
    steps = [call_tool("echo", {"text": MESSAGE}) for _ in range(turns)]
    return Agent(
        name=name,
        model=Script([*steps, reply("done")], on_turn=on_turn),
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
    )


scale_out = Agent(
    name="scale-out",
    model=Script(
        [*(call_tool("wait", {"text": MESSAGE}) for _ in range(SCALE_CALLS)), reply("done")]
    ),
    tools=[wait],
    budget=Budget(max_turns=SCALE_CALLS + 1),
)
"""The scale-out run: 5 calls of a 50 ms tool, then the answer."""

LOG_ENV = "CONTEXTOS_BENCH_RSS_LOG"
"""Where a worker process appends its samples (`runs rss_mb` lines)."""
EVERY_ENV = "CONTEXTOS_BENCH_RSS_EVERY"


def sample_runs(turn: int) -> None:
    """The `short` agent's model hook: in a worker process, note the RSS every k runs."""
    if turn != 1 or LOG_ENV not in os.environ:
        return
    _started[0] += 1
    runs = _started[0]
    if runs % int(os.environ[EVERY_ENV]) == 0:
        with open(os.environ[LOG_ENV], "a") as f:
            f.write(f"{runs} {rss_mb():.2f}\n")


_started = [0]
"""Runs this process has started driving (turn 1 seen)."""


short = echo_agent(2, name="short", on_turn=sample_runs)
"""The run a long-lived worker drives 10,000 times: two echo calls, then the answer."""
