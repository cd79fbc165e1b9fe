"""A scan node's file tools: they read its own directory and nothing else, and cannot write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kbsample import SAMPLE

from contextos import Agent, Containment, EffectKind, Principal, RunContext, RunStatus, Runtime
from contextos import events as ev
from contextos.errors import ConfigError, ContainmentViolation
from contextos.jobs.kb import ReadOnlyDir
from contextos.testing import ScriptedModel, call_tool, reply


@pytest.fixture
def docs() -> ReadOnlyDir:
    return ReadOnlyDir(SAMPLE / "docs", prefix="docs")


def test_the_tools_only_read(docs: ReadOnlyDir) -> None:
    tools = docs.tools()
    assert [t.name for t in tools] == ["list_files", "read_file", "stat_file", "parse_links"]
    assert {t.effect for t in tools} == {EffectKind.READ}


def test_list_read_stat_and_links_inside_the_directory(docs: ReadOnlyDir) -> None:
    assert "index.md" in docs.entries() and "concepts/" in docs.entries()
    assert docs.read("concepts/tenants.md").startswith("---\ntitle: Tenants\n")
    info = docs.stat("concepts/tenants.md")
    assert (info.kind, info.size) == ("file", (SAMPLE / "docs/concepts/tenants.md").stat().st_size)
    assert docs.stat("concepts").kind == "dir"
    links = docs.links("concepts/tenants.md")
    # targets come back relative to the knowledge base, as the other directories name them
    assert {
        "line": 15,
        "target": "../../decisions/0007-tenant-isolation.md",
        "kind": "internal",
        "path": "decisions/0007-tenant-isolation.md",
        "anchor": None,
    } in links
    assert {"line": 20, "target": "http://kb-fixture.test/support", "kind": "external",
            "url": "http://kb-fixture.test/support"} in links  # fmt: skip


@pytest.mark.parametrize(
    "path", ["../runbooks/on-call.md", str(SAMPLE / "runbooks" / "on-call.md"), "/etc/passwd"]
)
def test_another_directory_is_out_of_reach(docs: ReadOnlyDir, path: str) -> None:
    with pytest.raises(ContainmentViolation):
        docs.read(path)
    with pytest.raises(ContainmentViolation):
        docs.stat(path)
    with pytest.raises(ContainmentViolation):
        docs.links(path)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "secret.md").write_text("secret")
    os.symlink(tmp_path / "secret.md", tmp_path / "docs" / "page.md")
    os.symlink(tmp_path, tmp_path / "docs" / "up")
    folder = ReadOnlyDir(tmp_path / "docs")
    for path in ("page.md", "up/secret.md"):
        with pytest.raises(ContainmentViolation, match="symlink"):
            folder.read(path)
    # listed, but what stat says of it comes from nowhere outside
    assert dict(folder.listing())["page.md"].size == 0


def test_a_missing_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        ReadOnlyDir(tmp_path / "nowhere")


async def test_a_scan_agent_reads_its_directory_and_nothing_else(tmp_path: Path) -> None:
    """In a governed run, the policy refuses a path outside the node's directory before the
    tool runs; the model gets the refusal back and can carry on."""
    agent = Agent(
        name="kb-scan-docs",
        model=ScriptedModel(
            [
                call_tool("list_files", {"path": "concepts"}),
                call_tool("parse_links", {"path": "concepts/tenants.md"}),
                call_tool("stat_file", {"path": "../runbooks/on-call.md"}),
                call_tool("read_file", {"path": "../runbooks/on-call.md"}),
                reply("scanned"),
            ],
            by_turn=True,
        ),
        tools=list(ReadOnlyDir(SAMPLE / "docs", prefix="docs").tools()),
    )
    context = RunContext(
        principal=Principal.user("kb-daily", scopes=("files:read",)),
        containment=Containment(read_only=(str(SAMPLE / "docs"),)),
        safety_mode="read_only",
    )
    async with Runtime(str(tmp_path / "runs.db")) as rt:
        result = await rt.run(agent, "scan docs/", context=context)
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    done = [e for e in events if isinstance(e, ev.ToolCompleted)]
    assert [d.error_code for d in done] == [None, None, "policy_denied", "policy_denied"]
    assert json.loads(done[0].output) == ["retention.md", "series-and-labels.md", "tenants.md"]
    assert "decisions/0007-tenant-isolation.md" in done[1].output
    assert all("climbs out" in d.output for d in done[2:])
    decided = [e for e in events if isinstance(e, ev.PolicyDecided)]
    assert [d.decision for d in decided] == ["allow", "allow", "deny", "deny"]
