"""Compaction, skills and profile, each proven on what the scripted model saw."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextos import Agent, ConfigError, FailureReason, Principal, RunStatus, Runtime
from contextos import events as ev
from contextos.context import NewFact, SqliteMemory, Subject
from contextos.middleware import Compaction, PiiRedaction, Profile, Sanitizer, Skills
from contextos.testing import ScriptedModel, call_tool, reply


def echo(text: str) -> str:
    """Echo text back."""
    return text


async def test_compaction_summarizes_once_persists_and_never_sees_unredacted_text(
    tmp_path: Path,
) -> None:
    secret_mail = "dana.secret@example.com"
    steps = [
        call_tool("echo", {"text": f"note {i}: contact {secret_mail} " + "x" * 400})
        for i in range(4)
    ]
    model = ScriptedModel([*steps, reply("done")])
    summarizer = ScriptedModel([reply(f"Summary: user wants notes; contact {secret_mail}.")])
    compaction = Compaction(trigger_tokens=500, keep_tokens=250, summarizer=summarizer)
    agent = Agent(
        name="a", model=model, tools=[echo], middleware=[PiiRedaction(), Sanitizer(), compaction]
    )
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, f"I am {secret_mail}; keep notes")
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    # The summarizer ran once, and only ever read redacted text.
    assert len(summarizer.requests) == 1
    summarizer_saw = "\n".join(m.content for m in summarizer.requests[0].messages)
    assert secret_mail not in summarizer_saw and "[REDACTED:EMAIL]" in summarizer_saw
    compacted = [e for e in events if isinstance(e, ev.ContextCompacted)]
    assert len(compacted) == 1
    assert secret_mail not in compacted[0].summary  # redacted again on the way out
    cursor = compacted[0].through_seq
    # Later calls reuse the recorded summary and start after the cursor (an event seq).
    later = model.requests[-1]
    text = "\n".join(m.content for m in later.messages)
    assert "Summary: user wants notes" in text
    assert "note 0" not in text  # summarized away
    assert later.messages[1].content.startswith("Summary of the earlier")
    assert later.messages[2].content.startswith("I am")  # the task is always kept verbatim
    after = [e for e in events if isinstance(e, ev.ModelResponded)][-1].context["manifest"]
    assert next(r for r in after if r["id"] == "history")["version"] == f"cursor:{cursor}"
    assert any(r["type"] == "history_summary" for r in after)


async def test_the_summary_is_folded_into_state_and_not_redone_each_turn(tmp_path: Path) -> None:
    steps = [call_tool("echo", {"text": "y" * 300}) for _ in range(4)]
    summarizer = ScriptedModel([reply("S1")])
    compaction = Compaction(trigger_tokens=400, keep_tokens=150, summarizer=summarizer)
    db = str(tmp_path / "r.db")
    model = ScriptedModel([*steps, reply("done")], by_turn=True)
    agent = Agent(name="a", model=model, tools=[echo], middleware=[compaction])
    async with Runtime(db) as rt:
        result = await rt.run(agent, "go")
        state = await rt.state(result.run_id)
    assert state.context_summary == "S1" and state.context_cursor > 0
    assert len(summarizer.requests) == 1  # compacted at turn 4, reused at turn 5
    summary = model.requests[4].messages[1]  # after the system prefix, marked as data
    assert summary.role == "user" and "S1" in summary.content
    assert summary.content.index("<<untrusted-data") < summary.content.index("S1")


def write_skill(root: Path, name: str, description: str, body: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")


async def test_skill_bodies_are_absent_until_requested(tmp_path: Path) -> None:
    skills_dir = tmp_path / "skills"
    write_skill(skills_dir, "refunds", "How to refund an order.", "REFUND-BODY: check the receipt.")
    write_skill(skills_dir, "shipping", "Shipping rules.", "SHIPPING-BODY: never promise dates.")
    model = ScriptedModel([call_tool("read_skill", {"name": "refunds"}), reply("Refunded.")])
    agent = Agent(name="a", model=model, middleware=[Sanitizer(), Skills(skills_dir)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "refund order 9")
    assert result.status is RunStatus.COMPLETED
    first = "\n".join(m.content for m in model.requests[0].messages)
    assert "refunds: How to refund an order." in first and "shipping: Shipping rules." in first
    assert "REFUND-BODY" not in first and "SHIPPING-BODY" not in first
    assert [t.name for t in model.requests[0].tools] == ["read_skill"]
    second = "\n".join(m.content for m in model.requests[1].messages)
    assert "REFUND-BODY" in second and "SHIPPING-BODY" not in second
    body = next(m for m in model.requests[1].messages if m.role == "tool").content
    assert not body.startswith("<<untrusted-data")  # the author's text, not outside data


async def test_memory_never_crosses_users_or_tenants(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    await memory.remember(Subject(tenant_id="acme", user_id="alice"), [NewFact(text="ALICE-FACT")])
    await memory.remember(Subject(tenant_id="acme", user_id="bob"), [NewFact(text="BOB-FACT")])
    await memory.remember(
        Subject(tenant_id="globex", user_id="alice"), [NewFact(text="OTHER-ALICE")]
    )
    model = ScriptedModel([reply("hi")] * 4)
    agent = Agent(name="a", model=model, middleware=[Profile(memory)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        for tenant, user in [
            ("acme", "alice"),
            ("acme", "bob"),
            ("globex", "alice"),
            ("acme", "carol"),
        ]:
            await rt.run(agent, "hello", principal=Principal.user(user, tenant=tenant))
    seen = ["\n".join(m.content for m in r.messages) for r in model.requests]
    assert "ALICE-FACT" in seen[0] and "BOB-FACT" not in seen[0] and "OTHER-ALICE" not in seen[0]
    assert "BOB-FACT" in seen[1] and "ALICE-FACT" not in seen[1]
    assert "OTHER-ALICE" in seen[2] and "ALICE-FACT" not in seen[2]
    assert not any(f in seen[3] for f in ("ALICE-FACT", "BOB-FACT", "OTHER-ALICE"))
    assert model.requests[0].messages[-1].content.startswith("About the current user")  # tail
    await memory.close()


async def test_memory_writes_happen_after_the_turn_behind_the_flag(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    alice = Subject(tenant_id="acme", user_id="alice")
    jo = Principal.user("alice", tenant="acme")

    def script() -> ScriptedModel:
        return ScriptedModel(
            [call_tool("remember", {"fact": "Prefers email to jo@example.com"}), reply("noted")]
        )

    async with Runtime(str(tmp_path / "r.db")) as rt:
        # Flag off: no remember tool, nothing written.
        off = Agent(name="a", model=ScriptedModel([reply("ok")]), middleware=[Profile(memory)])
        await rt.run(off, "hi", principal=jo)
        assert "remember" not in {t.name for t in off.tool_list}
        assert await memory.recall(alice) == []
        on = Agent(
            name="a", model=script(), middleware=[PiiRedaction(), Profile(memory, writes=True)]
        )
        result = await rt.run(on, "remember my contact preference", principal=jo)
    facts = await memory.recall(alice)
    assert [f.text for f in facts] == ["Prefers email to [REDACTED:EMAIL]"]
    assert facts[0].source.startswith(f"run:{result.run_id}#")
    await memory.close()


class BrokenMemory:
    async def recall(self, subject: Subject, *, limit: int = 50) -> list[object]:
        raise OSError("memory is down")

    async def remember(self, subject: Subject, facts: object) -> int:
        raise OSError("memory is down")

    async def forget(self, subject: Subject, fact_id: int) -> bool:
        return False

    async def close(self) -> None:
        return None


async def test_profile_fails_open_with_counts_only_telemetry(tmp_path: Path) -> None:
    model = ScriptedModel([reply("generic but working")])
    agent = Agent(name="a", model=model, middleware=[Profile(BrokenMemory())])  # type: ignore[arg-type]
    async with Runtime(str(tmp_path / "r.db")) as rt:
        result = await rt.run(agent, "hi", principal=Principal.user("u", tenant="t"))
        events = await rt.events(result.run_id)
    assert result.status is RunStatus.COMPLETED
    responded = next(e for e in events if isinstance(e, ev.ModelResponded))
    assert responded.context["telemetry"]["profile.errors"] == 1


async def test_profile_is_cached_per_subject(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    alice = Subject(tenant_id="acme", user_id="alice")
    await memory.remember(alice, [NewFact(text="likes tea")])
    profile = Profile(memory)
    model = ScriptedModel([reply("a"), reply("b")])
    agent = Agent(name="a", model=model, middleware=[profile])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        for _ in range(2):
            await rt.run(agent, "hi", principal=Principal.user("alice", tenant="acme"))
    assert profile.stats["reads"] == 1 and profile.stats["cache_hits"] == 1
    await memory.close()


async def test_memory_is_keyed_on_the_bound_principal_and_fails_closed_without_one(
    tmp_path: Path,
) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    await memory.remember(Subject(tenant_id="acme", user_id="alice"), [NewFact(text="ALICE-FACT")])
    model = ScriptedModel([reply("hi")])
    agent = Agent(name="a", model=model, middleware=[Profile(memory)])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        # Labels a caller passes are not who the run is: no bound principal, no run.
        with pytest.raises(ConfigError, match="none bound"):
            await rt.run(agent, "hello", metadata={"tenant_id": "acme", "user_id": "alice"})
        assert await rt.runs() == []
        # Bound to bob, labelled as alice: memory is bob's (none), never alice's.
        labelled = {"tenant_id": "acme", "user_id": "alice"}
        bob = Principal.user("bob", tenant="acme")
        result = await rt.run(agent, "hello", principal=bob, metadata=labelled)
    assert result.status is RunStatus.COMPLETED
    assert "ALICE-FACT" not in "\n".join(m.content for m in model.requests[0].messages)
    await memory.close()


async def test_a_run_recorded_without_a_principal_fails_closed_at_the_memory_layer(
    tmp_path: Path,
) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    model = ScriptedModel([reply("never")])
    async with Runtime(str(tmp_path / "r.db")) as rt:
        # Started before the agent had memory: resuming under memory must not skip it silently.
        run_id = await rt.start(Agent(name="a", model=ScriptedModel([])), "hello")
        agent = Agent(name="a", model=model, middleware=[Profile(memory)])
        result = await rt.resume(run_id, agent, allow_changed_agent=True)
    assert result.failure_reason is FailureReason.MISSING_PRINCIPAL
    assert model.requests == []
    await memory.close()
