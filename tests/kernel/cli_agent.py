"""An agent for CLI tests: scripted, with one tool."""

from contextos import Agent
from contextos.testing import ScriptedModel, call_tool, reply


def greet(name: str) -> str:
    """Greet someone."""
    return f"Hello, {name}!"


def agent() -> Agent:
    # A factory, so every CLI process gets a fresh script.
    return Agent(
        name="greeter",
        model=ScriptedModel([call_tool("greet", {"name": "Ada"}), reply("I greeted Ada.")]),
        tools=[greet],
    )
