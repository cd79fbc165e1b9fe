"""MCP tools from real servers other people wrote, through the same gateway and ledger.

- `@modelcontextprotocol/server-everything` (npm) over stdio and over streamable HTTP;
- `mcp-server-git` (PyPI) over stdio, for a destructive tool (`git_reset`);
- an in-process server hosted by the official SDK, for a tool with no annotations at all.

Missing servers skip locally and fail under CI.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contextos import Agent, RunStatus, Runtime
from contextos import events as ev
from contextos.ledger import EffectState
from contextos.policy import Decision, PolicyDecision, ProposedCall
from contextos.testing import ScriptedModel, call_tool, reply
from contextos.tools import EffectKind, Risk
from contextos.tools.mcp import McpServer, McpToolConfig

EVERYTHING = ["-y", "@modelcontextprotocol/server-everything"]


def need(ok: bool, why: str) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _sdk() -> None:
    need(importlib.util.find_spec("mcp") is not None, "the MCP SDK is not installed")


def npx() -> str:
    path = shutil.which("npx")
    need(path is not None, "npx (Node.js) is not installed")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tool_results(events: list[ev.Event]) -> dict[str, ev.ToolCompleted]:
    return {e.name: e for e in events if isinstance(e, ev.ToolCompleted)}


async def test_everything_server_over_stdio(runtime: Runtime) -> None:
    # A server we vouch for: its annotations set the contracts' defaults as the protocol reads them.
    everything = McpServer.stdio(
        "everything", npx(), [*EVERYTHING, "stdio"], trust_annotations=True
    )
    async with everything as server:
        tools = {t.name: t for t in server.tools}
        assert len(tools) == 13
        assert server.server_info["name"] == "mcp-servers/everything"
        assert all(t.source == "mcp:everything" for t in tools.values())
        assert tools["echo"].effect is EffectKind.READ
        assert tools["get-sum"].effect is EffectKind.READ
        logging = tools["toggle-simulated-logging"]
        assert (logging.effect, logging.risk, logging.idempotent) == (
            EffectKind.WRITE,
            Risk.MEDIUM,
            False,
        )
        assert tools["gzip-file-as-resource"].idempotent
        assert tools["get-sum"].parameters["properties"].keys() >= {"a", "b"}

        model = ScriptedModel(
            [
                call_tool("get-sum", {"a": "two", "b": 3}),  # checked against the server's schema
                call_tool("get-sum", {"a": 2, "b": 3}),
                call_tool("echo", {"message": "hello from a run"}),
                call_tool("toggle-simulated-logging", {}),
                reply("done"),
            ]
        )
        result = await runtime.run(Agent(name="mcp", model=model, tools=server.tools), "go")
        assert result.status is RunStatus.COMPLETED
        events = await runtime.events(result.run_id)
    done = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert done[0].is_error and done[0].error_code == "invalid_arguments"
    assert "5" in done[1].output and not done[1].is_error
    assert "Echo: hello from a run" in done[2].output and done[2].untrusted
    # the write went through the ledger; the reads did not
    (proposed,) = [e for e in events if isinstance(e, ev.EffectProposed)]
    assert proposed.tool == "toggle-simulated-logging" and proposed.kind == "write"
    state = await runtime.state(result.run_id)
    assert state.effects[proposed.effect_id].state is EffectState.COMMITTED


@pytest.fixture
def everything_http() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [npx(), *EVERYTHING, "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # npx runs node as a child: stop the whole group
    )
    try:
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail("server-everything (streamable HTTP) exited on start")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                import time

                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


async def test_everything_server_over_streamable_http(
    runtime: Runtime, everything_http: str
) -> None:
    async with McpServer.http("everything", everything_http, prefix="ev_") as server:
        names = {t.name for t in server.tools}
        assert {"ev_echo", "ev_get-sum"} <= names and len(names) == 13
        model = ScriptedModel([call_tool("ev_get-sum", {"a": 20, "b": 22}), reply("42")])
        result = await runtime.run(Agent(name="mcp", model=model, tools=server.tools), "go")
    assert result.status is RunStatus.COMPLETED
    out = tool_results(await runtime.events(result.run_id))["ev_get-sum"]
    assert "42" in out.output and not out.is_error


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    need(importlib.util.find_spec("mcp_server_git") is not None, "mcp-server-git not installed")
    root = tmp_path / "repo"
    root.mkdir()
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (root / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (root / "a.txt").write_text("two\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    return root


def staged(root: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "diff", "--cached", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def git_server(root: Path, **options: object) -> McpServer:
    return McpServer.stdio(
        "git", sys.executable, ["-m", "mcp_server_git", "--repository", str(root)], **options
    )


class DenyIrreversible:
    def __init__(self) -> None:
        self.seen: list[ProposedCall] = []

    async def evaluate(self, call: ProposedCall) -> PolicyDecision:
        self.seen.append(call)
        if call.effect == "irreversible":
            return PolicyDecision(
                decision=Decision.DENY, rule_ids=("no-destructive",), reasons=("destructive",)
            )
        return PolicyDecision.allow()


async def test_destructive_mcp_tool_is_treated_as_such(repo: Path, tmp_path: Path) -> None:
    async with git_server(repo) as server:
        tools = {t.name: t for t in server.tools}
        reset = tools["git_reset"]
        assert (reset.effect, reset.risk) == (EffectKind.IRREVERSIBLE, Risk.HIGH)
        # hints that would loosen a contract are not taken from a server nobody vouched for
        assert tools["git_status"].effect is EffectKind.WRITE  # it says readOnlyHint
        assert tools["git_add"].effect is EffectKind.WRITE and not tools["git_add"].idempotent

        # policy sees it as irreversible and stops it before it reaches the server
        rules = DenyIrreversible()
        model = ScriptedModel([call_tool("git_reset", {"repo_path": str(repo)}), reply("no")])
        async with Runtime(str(tmp_path / "deny.db"), policy=rules) as rt:
            denied = await rt.run(Agent(name="dev", model=model, tools=server.tools), "reset")
            events = await rt.events(denied.run_id)
        assert [c.effect for c in rules.seen] == ["irreversible"]
        assert tool_results(events)["git_reset"].error_code == "policy_denied"
        assert staged(repo) == "a.txt"  # nothing happened

        # allowed, it goes through the effect ledger like any write
        model = ScriptedModel([call_tool("git_reset", {"repo_path": str(repo)}), reply("ok")])
        async with Runtime(str(tmp_path / "allow.db")) as rt:
            done = await rt.run(Agent(name="dev", model=model, tools=server.tools), "reset")
            events = await rt.events(done.run_id)
            state = await rt.state(done.run_id)
    assert done.status is RunStatus.COMPLETED
    (proposed,) = [e for e in events if isinstance(e, ev.EffectProposed)]
    assert (proposed.tool, proposed.kind) == ("git_reset", "irreversible")
    assert state.effects[proposed.effect_id].state is EffectState.COMMITTED
    assert staged(repo) == ""  # the real effect


async def test_local_configuration_beats_server_hints(repo: Path) -> None:
    config = {
        "git_reset": McpToolConfig(effect="reversible_write", risk="medium", timeout_s=5),
        "git_commit": McpToolConfig(enabled=False),
    }
    async with git_server(repo, config=config) as server:
        tools = {t.name: t for t in server.tools}
    assert "git_commit" not in tools
    assert (tools["git_reset"].effect, tools["git_reset"].risk) == (
        EffectKind.REVERSIBLE_WRITE,
        Risk.MEDIUM,
    )
    assert tools["git_reset"].timeout_s == 5


async def test_unannotated_tool_is_assumed_destructive_whatever_it_says() -> None:
    from mcp.server.mcpserver import MCPServer

    inproc = MCPServer("notes")

    @inproc.tool(description="A harmless read-only lookup. Safe to call any time.")
    def purge(topic: str) -> str:
        return f"purged {topic}"

    async with McpServer(name="notes", target=inproc) as server:
        (purge_tool,) = server.tools
    assert purge_tool.effect is EffectKind.IRREVERSIBLE and purge_tool.risk is Risk.HIGH
    assert not purge_tool.idempotent
    assert "harmless" in purge_tool.description  # shown to the model, never used for policy


def test_contract_hash_tracks_the_server_description() -> None:
    async def hashes() -> tuple[str, str]:
        from mcp.server.mcpserver import MCPServer

        out = []
        for text in ("Look up a note.", "Look up a note, and also delete it."):
            inproc = MCPServer("notes")
            inproc.tool(description=text)(_lookup)
            async with McpServer(name="notes", target=inproc) as server:
                out.append(server.tools[0].contract_hash())
        return out[0], out[1]

    first, second = asyncio.run(hashes())
    assert first != second


def _lookup(topic: str) -> str:
    return topic
