"""Agent identity hash and agent references."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from contextos import Agent, Budget, ConfigError, load_agent, tool


def search(query: str) -> str:
    """Search."""
    return query


def test_identity_hash_covers_everything_that_changes_behaviour() -> None:
    base = Agent(name="a", model="local", instructions="x", tools=[search])
    same = Agent(name="a", model="local", instructions="x", tools=[search])
    assert base.identity_hash() == same.identity_hash()

    class Out(BaseModel):
        answer: str

    variants = [
        Agent(name="b", model="local", instructions="x", tools=[search]),
        Agent(name="a", model="local", instructions="x", tools=[search], version="2"),
        Agent(name="a", model="openai:gpt-4.1-mini", instructions="x", tools=[search]),
        Agent(name="a", model="local", instructions="y", tools=[search]),
        Agent(name="a", model="local", instructions="x", tools=[]),
        Agent(name="a", model="local", instructions="x", tools=[tool(search, effect="write")]),
        Agent(
            name="a", model="local", instructions="x", tools=[search], budget=Budget(max_turns=3)
        ),
        Agent(name="a", model="local", instructions="x", tools=[search], verifier=lambda s: True),
        Agent(name="a", model="local", instructions="x", tools=[search], output_type=Out),
    ]
    hashes = {v.identity_hash() for v in variants}
    assert base.identity_hash() not in hashes
    assert len(hashes) == len(variants)


def test_load_agent_from_a_module_and_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_file = load_agent("tests/kernel/cli_agent.py:agent")
    assert by_file.name == "greeter"
    (tmp_path / "my_agents.py").write_text(
        "from contextos import Agent\nsupport = Agent(name='support', model='local')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent("my_agents:support").name == "support"
    with pytest.raises(ConfigError, match="bad agent reference"):
        load_agent("no_such_module_xyz:agent")
    with pytest.raises(ConfigError, match=r"use path/to/file\.py:attr"):
        load_agent("just-a-name")
    with pytest.raises(ConfigError, match="not an Agent"):
        load_agent("contextos:__version__")


def test_an_agent_file_that_fails_to_run_says_why_each_time_it_is_loaded(tmp_path: Path) -> None:
    agents = tmp_path / "agents.py"
    agents.write_text("import no_such_module_xyz\nfrom contextos import Agent\n")
    for _ in range(2):  # a worker loads it again for the next attempt
        with pytest.raises(ConfigError, match=r"running .*agents\.py failed \(ModuleNotFound"):
            load_agent(f"{agents}:support")
    agents.write_text("from contextos import Agent\nsupport = Agent(name='s', model='local')\n")
    assert load_agent(f"{agents}:support").name == "s"
