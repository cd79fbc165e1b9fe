"""An agent whose tool waits for the test: the run stays live, mid-step, until told to go.

The tool notes each start and end in `$CONTEXTOS_TEST_DIR/calls.log` (a step that ran twice
shows up twice), touches `started-N` when step N begins, and waits for the file `go`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from contextos import Agent, tool
from contextos.testing import ScriptedModel, call_tool, reply


def _dir() -> Path:
    return Path(os.environ["CONTEXTOS_TEST_DIR"])


# The test says when a step ends ("go"); on a busy machine the CLI calls it makes meanwhile can
# take longer than the default 30 s time limit, which would leave the step running in its
# thread while the run goes on.
@tool(timeout_s=600)
def slow_step(n: int) -> str:
    """Do step n of the job (slowly)."""
    log = _dir() / "calls.log"
    with log.open("a") as out:
        out.write(f"start {n}\n")
    (_dir() / f"started-{n}").touch()
    while not (_dir() / "go").exists():
        time.sleep(0.02)
    with log.open("a") as out:
        out.write(f"end {n}\n")
    return f"step {n} done"


def agent() -> Agent:
    # A factory: every process gets a fresh script, and the turn picks the step on resume.
    return Agent(
        name="slow",
        model=ScriptedModel(
            [
                call_tool("slow_step", {"n": 1}),
                call_tool("slow_step", {"n": 2}),
                reply("both steps done"),
            ],
            by_turn=True,
        ),
        tools=[slow_step],
    )
