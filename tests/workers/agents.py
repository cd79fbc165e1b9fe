"""Agents the worker tests start and worker processes import by reference (`path.py:attr`).

Every agent uses the scripted model by turn, so whichever process resumes a run gets the step
for the turn the run is on. Tools report what they did to files or tables named by
environment variables the tests set for the worker processes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from contextos import Agent, ToolContext, tool
from contextos.testing import ScriptedModel, call_tool, reply

# -- side effects: rows keyed by idempotency key, in tables the chaos test creates ------------

EFFECTS_ENV = "CONTEXTOS_TEST_EFFECTS"
"""Where effects go: a postgresql:// URL (with its search_path) or a SQLite file path."""

_local = threading.local()


def _effects_conn() -> Any:
    conn = getattr(_local, "conn", None)
    if conn is None:
        target = os.environ[EFFECTS_ENV]
        if target.startswith("postgresql://"):
            import psycopg

            conn = psycopg.connect(target, autocommit=True)
        else:
            conn = sqlite3.connect(target, isolation_level=None, timeout=30)
        _local.conn = conn
    return conn


def _sql(sql: str) -> str:
    return sql if os.environ[EFFECTS_ENV].startswith("postgresql://") else sql.replace("%s", "?")


def _find_effect(idempotency_key: str) -> dict[str, Any] | None:
    """The provider's record of a call, by its idempotency key (None: never happened)."""
    row = (
        _effects_conn()
        .execute(_sql("SELECT step, pid FROM effects WHERE key = %s"), (idempotency_key,))
        .fetchone()
    )
    return None if row is None else {"step": row[0], "pid": row[1], "found": True}


@tool(effect="write", reconcile=_find_effect)
def record_effect(step: int, ctx: ToolContext) -> str:
    """Record one step of the job with the provider (a row in the effects table)."""
    key = ctx.idempotency_key or f"{ctx.run_id}/{ctx.call_id}"
    conn = _effects_conn()
    conn.execute(
        _sql("INSERT INTO effect_attempts (key, run_id, call_id, pid) VALUES (%s, %s, %s, %s)"),
        (key, ctx.run_id, ctx.call_id, os.getpid()),
    )
    time.sleep(0.005)  # a provider's round trip: widens the window a kill can land in
    # Deliberately no unique constraint and no check: a second execution of a call would
    # show up as a second row.
    conn.execute(
        _sql("INSERT INTO effects (key, run_id, call_id, step, pid) VALUES (%s, %s, %s, %s, %s)"),
        (key, ctx.run_id, ctx.call_id, step, os.getpid()),
    )
    return f"step {step} recorded"


chaos = Agent(
    name="chaos",
    model=ScriptedModel(
        [
            call_tool("record_effect", {"step": 1}),
            call_tool("record_effect", {"step": 2}),
            reply("both steps recorded"),
        ],
        by_turn=True,
    ),
    tools=[record_effect],
)


# -- a tool that waits for the test: to stop or kill a worker in the middle of a step ---------

DIR_ENV = "CONTEXTOS_TEST_DIR"


def wait_for_go(ctx: ToolContext) -> str:
    """Wait until the test says go."""
    folder = Path(os.environ[DIR_ENV])
    with (folder / "calls.log").open("a") as f:
        f.write(f"{ctx.run_id} {os.getpid()}\n")
    (folder / f"started-{ctx.run_id}").touch()
    deadline = time.monotonic() + 120
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    return "went"


slow = Agent(
    name="slow",
    model=ScriptedModel([call_tool("wait_for_go"), reply("finished")], by_turn=True),
    tools=[wait_for_go],
)

# -- quick runs --------------------------------------------------------------------------------


def lookup(code: str) -> str:
    """Look a code up."""
    time.sleep(0.01)
    return f"{code}: in stock"


quick = Agent(
    name="quick",
    model=ScriptedModel(
        [call_tool("lookup", {"code": "A-1"}), reply("A-1 is in stock")], by_turn=True
    ),
    tools=[lookup],
)

ticker = Agent(name="ticker", model=ScriptedModel([reply("tick")], by_turn=True))

# -- tools that misbehave: the worker outlives them, and none of them can hold it ---------------


def exit_now() -> str:
    """Leave the process, as a careless library might."""
    raise SystemExit(3)


crasher = Agent(
    name="crasher",
    model=ScriptedModel([call_tool("exit_now"), reply("the worker survived")], by_turn=True),
    tools=[exit_now],
)


def kill_process() -> str:
    """End the process at once, as a crash in native code would."""
    os._exit(3)


killer = Agent(
    name="killer",
    model=ScriptedModel([call_tool("kill_process"), reply("never reached")], by_turn=True),
    tools=[kill_process],
)


def _hang(ctx: ToolContext) -> str:
    """Block the thread until the test says go (a guard ends it after two minutes)."""
    folder = Path(os.environ[DIR_ENV])
    (folder / f"hanging-{ctx.run_id}").touch()
    deadline = time.monotonic() + 120
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return "went"


hang = tool(name="hang", timeout_s=600)(_hang)
"""Hangs well within its time limit: a drained worker waits for it."""

hang_past_limit = tool(name="hang_past_limit", timeout_s=0.5)(_hang)
"""Hangs past its time limit: the call is let go and the run goes on."""

hanger = Agent(
    name="hanger",
    model=ScriptedModel([call_tool("hang"), reply("never reached")], by_turn=True),
    tools=[hang],
)

timed_out = Agent(
    name="timed_out",
    model=ScriptedModel([call_tool("hang_past_limit"), reply("gave up on it")], by_turn=True),
    tools=[hang_past_limit],
)
