"""Run triggers in one process, on both backends: what fires, once, with what input, and the
guards (refused definitions, loops, chain depth, agents that will not load)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from trigger_helpers import (
    AGENTS,
    COUNTER,
    FAILING_WRITER,
    LOOPER,
    PUBLISHER,
    REVIEWER,
    WRITER,
    created,
    queue,
    runs_of,
)

from contextos import Agent, Runtime, load_agent
from contextos import events as ev
from contextos.errors import ConfigError, SignatureExpired, SignatureInvalid
from contextos.runs import RunId, RunStatus
from contextos.state import RunState
from contextos.store.queue import Trigger, TriggerKind, TriggerOn, trigger_key
from contextos.workers.triggers import (
    add_trigger,
    chain_depth,
    check_template,
    fire_triggers,
    fire_webhook,
    remove_trigger,
    render_input,
    sign,
    started_by,
    trigger_run_id,
    verify_signature,
    what_fires,
)
from support.processes import wait_until


async def run_writer(rt: Runtime, ref: str = WRITER, input: str = "write it") -> RunId:
    """A source run driven to its end here, with no worker anywhere."""
    result = await rt.run(load_agent(ref), input, agent_ref=ref)
    assert result.status.is_terminal
    return result.run_id


# -- defining triggers ------------------------------------------------------------------------


async def test_bad_triggers_are_refused_and_nothing_is_stored(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        either = (
            "trigger 't': give either --after SOURCE_AGENT_NAME (start a run when a run of that "
            "agent ends) or --webhook (start a run on POST /v1/hooks/NAME)"
        )
        refused = [
            (
                dict(name="no spaces", after="writer"),
                "bad trigger name 'no spaces': use up to 64 letters, digits, '.', '_' or '-' "
                "(it is also the webhook's URL path)",
            ),
            (dict(name="t"), either),
            (dict(name="t", after="writer", webhook=True), either),
            (
                dict(name="t", after="writer", on="sometimes"),
                "trigger 't': unknown --on 'sometimes': use completed, failed or any",
            ),
            (
                dict(name="t", after="writer", input="{outptu}"),
                "bad input template '{outptu}': unknown field {outptu}; use {output}, {run_id}, "
                "{status}, {failure}, {agent}, {input}",
            ),
            (
                dict(name="t", after="writer", secret_env="S"),
                "trigger 't': --secret-env is for webhooks (signed requests)",
            ),
            (
                dict(name="t", webhook=True, input="{output}"),
                "trigger 't': a webhook's runs take the request body as input; --input is for "
                "run triggers",
            ),
            (
                dict(name="t", webhook=True, secret_env="a b"),
                "trigger 't': --secret-env takes the name of an environment variable, not 'a b'",
            ),
            (
                dict(name="t", after="writer", max_depth=0),
                "trigger 't': --max-depth must be at least 1",
            ),
            (dict(name="t", after=""), "trigger 't': --after needs an agent name"),
        ]
        for kwargs, message in refused:
            with pytest.raises(ConfigError) as bad:
                await add_trigger(q, agent_ref=REVIEWER, **kwargs)  # type: ignore[arg-type]
            assert str(bad.value) == message
            if "template" in message:
                assert bad.value.fields == {"template": kwargs["input"]}
            else:
                assert bad.value.fields == {"trigger": kwargs["name"]}
        with pytest.raises(ConfigError, match="agent reference"):
            await add_trigger(q, "t", f"{AGENTS}:nobody", after="writer")
        assert await q.list_triggers() == []

        await add_trigger(q, "review", REVIEWER, after="writer", input="Review: {output}")
        with pytest.raises(ConfigError, match="exists already"):
            await add_trigger(q, "review", REVIEWER, after="writer")
        (stored,) = await q.list_triggers()
        assert (stored.kind, stored.agent_name, stored.source_agent, stored.on) == (
            TriggerKind.RUN,
            "reviewer",
            "writer",
            TriggerOn.COMPLETED,
        )
        assert stored.input == "Review: {output}" and stored.created_at is not None


async def test_loops_need_allow_cycle(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        with pytest.raises(ConfigError) as loop:
            await add_trigger(q, "again", LOOPER, after="looper", max_depth=4)
        assert str(loop.value) == (
            "trigger 'again' would close a loop: looper → looper (each run would start the next "
            "forever); pass --allow-cycle to allow it, and chains then stop after --max-depth "
            "triggers (now 4)"
        )
        assert loop.value.fields == {"trigger": "again", "loop": ["looper", "looper"]}
        await add_trigger(q, "review", REVIEWER, after="writer")
        await add_trigger(q, "publish", PUBLISHER, after="reviewer")
        with pytest.raises(ConfigError, match="publisher → writer → reviewer → publisher"):
            await add_trigger(q, "rewrite", WRITER, after="publisher")
        assert [t.name for t in await q.list_triggers()] == ["publish", "review"]
        await add_trigger(q, "again", LOOPER, after="looper", allow_cycle=True, max_depth=1)
        await add_trigger(q, "rewrite", WRITER, after="publisher", allow_cycle=True)
        # Triggers leading into the allowed loops close no loop of their own: the search for one
        # ends, and they are added.
        await add_trigger(q, "enter", REVIEWER, after="looper")
        await add_trigger(q, "feed", LOOPER, after="somebody")
        stored = {t.name: t for t in await q.list_triggers()}
        assert len(stored) == 6
        assert (stored["again"].allow_cycle, stored["again"].max_depth) == (True, 1)
        assert (stored["review"].allow_cycle, stored["review"].max_depth) == (False, 10)


def test_input_templates() -> None:
    source = RunState(
        run_id=RunId("run_src"),
        status=RunStatus.COMPLETED,
        agent_name="writer",
        input="write it",
        output="the draft",
    )
    template = "{agent} {status} {run_id} on {{{input}}}: {output}{failure}"
    check_template(template)
    assert render_input(template, source) == "writer completed run_src on {write it}: the draft"
    assert render_input(None, source) == "the draft"
    # Substitution is literal: an output that looks like a field stays as it is.
    tricky = RunState(run_id=RunId("r"), status=RunStatus.COMPLETED, output="{run_id}")
    assert render_input("got {output}", tricky) == "got {run_id}"
    failed = RunState(
        run_id=RunId("r"), status=RunStatus.FAILED, failure_message="budget exhausted"
    )
    assert render_input(None, failed) == "budget exhausted"
    assert render_input("[{output}] {failure}", failed) == "[] budget exhausted"  # no answer
    for bad in ("{output.__class__}", "{output!r}", "{output:>10}", "{0}", "{", "{nope}"):
        with pytest.raises(ConfigError, match="bad input template"):
            check_template(bad)
    # Literal braces before a bad field do not hide it; the error lists what may be used.
    with pytest.raises(ConfigError) as refused:
        check_template("{{literal}} then {nope}")
    assert str(refused.value).endswith(
        "unknown field {nope}; use {output}, {run_id}, {status}, {failure}, {agent}, {input}"
    )
    assert refused.value.fields == {"template": "{{literal}} then {nope}"}
    with pytest.raises(ConfigError) as unbalanced:
        check_template("{output")
    assert str(unbalanced.value).endswith("(write {{ and }} for braces)")


# -- firing exactly once ----------------------------------------------------------------------


async def test_a_finished_run_starts_one_run_however_many_workers_fire(backend_url: str) -> None:
    runtimes = [Runtime(backend_url) for _ in range(3)]
    try:
        rt = runtimes[0]
        q = queue(rt)
        await add_trigger(
            q, "review", REVIEWER, after="writer", input="Review ({status}, {run_id}): {output}"
        )
        source = await run_writer(rt)
        (owed,) = await q.due_firings()
        assert (owed.trigger, owed.run_id, owed.status) == ("review", source, "completed")

        fired = await asyncio.gather(*(fire_triggers(r) for r in runtimes))
        started = {f.run_id for per_worker in fired for f in per_worker}
        assert started == {trigger_run_id("review", source)}
        (reviews,) = [await runs_of(rt, "reviewer")]
        assert reviews == [trigger_run_id("review", source)]
        first = await created(rt, reviews[0])
        assert first.input == f"Review (completed, {source}): draft: the quarterly report"
        assert first.agent_ref == REVIEWER
        assert first.metadata == {
            "trigger": "review",
            "source_run": source,
            "source_status": "completed",
            "chain_depth": 1,
        }
        entry = await q.queue_entry(reviews[0])
        assert entry is not None and entry.idempotency_key == trigger_key("review", source)

        # The firing is gone: later passes, and a restarted process, read nothing and start
        # nothing.
        assert await q.due_firings() == []
        assert await fire_triggers(runtimes[1]) == []
        async with Runtime(backend_url) as restarted:
            assert await fire_triggers(restarted) == []
        assert await runs_of(rt, "reviewer") == reviews
    finally:
        for r in runtimes:
            await r.close()


async def test_a_start_that_died_before_the_firing_was_done_is_not_repeated(
    backend_url: str,
) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        source = await run_writer(rt)
        # A worker started the trigger's run, then died before forgetting the firing.
        first = await rt.start(
            load_agent(REVIEWER),
            "draft: the quarterly report",
            run_id=trigger_run_id("review", source),
            agent_ref=REVIEWER,
            idempotency_key=trigger_key("review", source),
        )
        assert len(await q.due_firings()) == 1
        (fired,) = await fire_triggers(rt)
        assert fired.run_id == first
        assert await runs_of(rt, "reviewer") == [first]
        assert await q.due_firings() == []


async def test_a_triggered_run_has_its_triggers_priority_and_tenant_or_its_sources_tenant(
    backend_url: str,
) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer", priority=3)
        await add_trigger(q, "publish", PUBLISHER, after="writer", tenant="blue")
        source = await rt.start(load_agent(WRITER), "write it", agent_ref=WRITER, tenant="acme")
        assert (await rt.resume(source)).status is RunStatus.COMPLETED
        ended_at = (await rt.state(source)).seq
        fired = {f.trigger: f.run_id for f in await fire_triggers(rt)}
        assert fired.keys() == {"review", "publish"}
        placed = {}
        for name, run_id in fired.items():
            assert run_id is not None
            entry = await q.queue_entry(run_id)
            assert entry is not None
            placed[name] = (entry.priority, entry.tenant)
            # The new run joins the source run's tree, caused by the event that ended it.
            assert (await created(rt, run_id)).caused_by == f"{source}#{ended_at}"
        assert placed == {"review": (3, "acme"), "publish": (0, "blue")}
        # A source run with no queue row (its events written without the queue) gives none.
        plain = RunId("run_unqueued")
        await rt.store.append(
            plain,
            [
                ev.RunCreated(
                    run_id=plain,
                    seq=1,
                    agent_name="writer",
                    agent_version="1",
                    agent_hash="h",
                    input="write it",
                ),
                ev.RunStarted(run_id=plain, seq=2, worker_id="w0"),
                ev.RunCompleted(run_id=plain, seq=3, output="draft"),
            ],
            expected_seq=0,
        )
        assert await q.queue_entry(plain) is None
        (review,) = [f for f in await fire_triggers(rt) if f.trigger == "review"]
        assert review.source_run == plain and review.run_id is not None
        entry = await q.queue_entry(review.run_id)
        assert entry is not None and entry.tenant == ""


async def test_a_pass_fires_what_it_is_asked_to_and_keeps_loaded_agents(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        first, second, third = [await run_writer(rt) for _ in range(3)]
        # One source run's firings only.
        agents: dict[str, Agent] = {}
        (fired,) = await fire_triggers(rt, run_id=second, agents=agents)
        assert (fired.trigger, fired.source_run) == ("review", second)
        assert list(agents) == [REVIEWER]
        # At most `limit`, oldest first; a cached agent is used as it is.
        cached = {REVIEWER: load_agent(PUBLISHER)}
        (fired,) = await fire_triggers(rt, limit=1, agents=cached)
        assert fired.source_run == first and fired.run_id is not None
        assert (await created(rt, fired.run_id)).agent_name == "publisher"
        assert [f.run_id for f in await q.due_firings()] == [third]


async def test_a_pass_starts_at_most_a_hundred_runs_and_leaves_the_rest_for_the_next(
    tmp_path: Path,
) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/runs.db") as rt:
        await add_trigger(queue(rt), "review", REVIEWER, after="writer")
        for i in range(101):  # source runs that ended, their events written directly
            rid = RunId(f"run_src{i:03d}")
            await rt.store.append(
                rid,
                [
                    ev.RunCreated(
                        run_id=rid,
                        seq=1,
                        agent_name="writer",
                        agent_version="1",
                        agent_hash="h",
                        input="write it",
                    ),
                    ev.RunStarted(run_id=rid, seq=2, worker_id="w0"),
                    ev.RunCompleted(run_id=rid, seq=3, output="draft"),
                ],
                expected_seq=0,
            )
        assert len(await fire_triggers(rt)) == 100
        (last,) = await fire_triggers(rt)
        assert last.source_run == "run_src100"


async def test_which_endings_fire(backend_url: str) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        for on in TriggerOn:
            await add_trigger(q, f"on-{on.value}", REVIEWER, after="writer", on=on)
        completed = await run_writer(rt)
        failed = await run_writer(rt, FAILING_WRITER)
        assert (await rt.result(failed)).status is RunStatus.FAILED
        cancelled = await rt.start(load_agent(WRITER), "never mind", agent_ref=WRITER)
        await rt.cancel(cancelled, reason="not needed")
        await run_writer(rt, REVIEWER)  # another agent's ending fires nothing

        owed = {(f.trigger, f.run_id, f.status) for f in await q.due_firings()}
        assert owed == {
            ("on-completed", completed, "completed"),
            ("on-any", completed, "completed"),
            ("on-failed", failed, "failed"),
            ("on-any", failed, "failed"),
            ("on-any", cancelled, "cancelled"),
        }
        fired = await fire_triggers(rt)
        assert len({f.run_id for f in fired}) == 5
        inputs = {(await created(rt, str(f.run_id))).input for f in fired}
        assert inputs == {
            "draft: the quarterly report",
            "the run used all 1 model turns",
            "not needed",  # the reason the source run was cancelled
        }


async def test_only_endings_after_the_trigger_was_added_fire_and_removal_drops_firings(
    backend_url: str,
) -> None:
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        before = await run_writer(rt)
        await add_trigger(q, "review", REVIEWER, after="writer")
        after = await run_writer(rt)
        assert [f.run_id for f in await q.due_firings()] == [after]
        assert before != after

        await add_trigger(q, "publish", PUBLISHER, after="writer")
        pending = await run_writer(rt)
        assert await q.remove_trigger("publish")
        assert not await q.remove_trigger("publish")
        assert {(f.trigger, f.run_id) for f in await q.due_firings()} == {
            ("review", after),
            ("review", pending),
        }
        await fire_triggers(rt)
        assert len(await runs_of(rt, "reviewer")) == 2
        assert await runs_of(rt, "publisher") == []


async def test_a_chain_stops_at_its_depth(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="contextos.triggers")
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "again", LOOPER, after="looper", allow_cycle=True, max_depth=3)
        run_id = await run_writer(rt, LOOPER)
        depths = []
        while True:
            (fired,) = await fire_triggers(rt)
            if fired.run_id is None:
                break
            first = await created(rt, fired.run_id)
            depths.append(first.metadata["chain_depth"])
            assert first.metadata["source_run"] == run_id
            run_id = (await rt.resume(fired.run_id)).run_id
        assert depths == [1, 2, 3]
        assert (fired.trigger, fired.source_run) == ("again", run_id)  # what started nothing
        assert len(await runs_of(rt, "looper")) == 4
        assert await q.due_firings() == []
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            (
                "WARNING",
                f"trigger again: run {run_id} is 3 trigger(s) down a chain, the most it allows; "
                "starting nothing",
            )
        ]


async def test_a_trigger_starts_a_workflow_and_drops_an_input_it_refuses(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="contextos.triggers")
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        json_input = '{{"text": "{output}", "by": "{agent}"}}'  # braces doubled: literal
        await add_trigger(q, "count", COUNTER, after="writer", input=json_input)
        await add_trigger(q, "raw", COUNTER, after="writer")  # the output as is: not JSON
        source = await run_writer(rt)

        fired = {f.trigger: f.run_id for f in await fire_triggers(rt)}
        assert fired["raw"] is None  # started nothing, and is not owed again
        assert fired["count"] is not None
        counted = await rt.resume(fired["count"])
        assert counted.structured_output == 4  # "draft: the quarterly report"
        assert await q.due_firings(run_id=source) == []
        [refused] = [r.getMessage() for r in caplog.records]
        assert refused.startswith(f"trigger raw: after run {source}, the input of workflow ")
        assert refused.endswith("; starting nothing (the trigger's --input must give it)")


async def test_a_firing_whose_agent_will_not_load_waits_and_the_rest_go_on(
    backend_url: str, tmp_path: Path
) -> None:
    copy = tmp_path / "agents_copy.py"
    shutil.copy(Path(AGENTS), copy)
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "fragile", f"{copy}:reviewer", after="writer")
        await add_trigger(q, "sturdy", PUBLISHER, after="writer")
        copy.rename(tmp_path / "gone.py")  # a deploy removed the file the trigger names
        source = await run_writer(rt)

        fired = await fire_triggers(rt)
        assert [(f.trigger, f.source_run) for f in fired] == [("sturdy", source)]
        assert await runs_of(rt, "reviewer") == []
        # The failed firing stays owed, backing off: not due at once.
        assert await q.due_firings() == []
        (owed,) = await q.due_firings(run_id=source)
        assert (owed.trigger, owed.attempts) == ("fragile", 1)

        (tmp_path / "gone.py").rename(copy)  # the file is back

        async def retried() -> bool:
            return bool(await fire_triggers(rt))

        await wait_until(retried, what="the back-off to pass")
        assert len(await runs_of(rt, "reviewer")) == 1
        assert await q.due_firings(run_id=source) == []


async def test_an_agent_that_raises_while_loading_holds_up_no_other_firing(
    backend_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="contextos.triggers")
    async with Runtime(backend_url) as rt:
        q = queue(rt)
        await add_trigger(q, "fragile", f"{AGENTS}:fragile", after="writer")
        monkeypatch.setenv("CONTEXTOS_TEST_BREAK", "1")
        first = await run_writer(rt)
        await add_trigger(q, "sturdy", PUBLISHER, after="writer")
        second = await run_writer(rt)
        # The fragile firing of the first run is the oldest: the ones behind it still start.
        fired = await fire_triggers(rt)
        assert [(f.trigger, f.source_run) for f in fired] == [("sturdy", second)]
        owed = {(f.trigger, f.run_id, f.attempts) for f in await q.due_firings(run_id=first)}
        assert owed == {("fragile", first, 1)}
        # What an operator reads: which trigger, after which run, which attempt, and why.
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            (
                "ERROR",
                f"trigger fragile: cannot start a run after {source} (attempt 1): "
                "RuntimeError: the agent's setup failed",
            )
            for source in (first, second)
        ]


async def test_a_firing_whose_trigger_is_gone_is_dropped_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    async with Runtime(f"sqlite:///{path}") as rt:
        q = queue(rt)
        await add_trigger(q, "gone", PUBLISHER, after="writer")
        await add_trigger(q, "review", REVIEWER, after="writer")
        first = await run_writer(rt)
        second = await run_writer(rt)
        # What a removal leaves when it lands after a pass read the firings and before it read
        # the triggers: firings of a trigger that is no more.
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("DELETE FROM triggers WHERE name = 'gone'")
        assert {f.trigger for f in await q.due_firings()} == {"gone", "review"}
        fired = await fire_triggers(rt)
        assert sorted((f.trigger, f.source_run) for f in fired) == sorted(
            [("review", first), ("review", second)]
        )
        assert await q.due_firings() == []
        assert await runs_of(rt, "publisher") == []


async def test_removing_a_trigger_says_whether_there_was_one(tmp_path: Path) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/runs.db") as rt:
        await add_trigger(queue(rt), "review", REVIEWER, after="writer")
        await add_trigger(queue(rt), "publish", PUBLISHER, after="reviewer")
        assert await remove_trigger(rt.store, "review") is True
        assert await remove_trigger(rt.store, "review") is False
        assert [t.name for t in await queue(rt).list_triggers()] == ["publish"]


def test_what_fires_a_trigger_in_a_few_words() -> None:
    def run_trigger(on: TriggerOn) -> Trigger:
        return Trigger(
            name="review",
            kind=TriggerKind.RUN,
            agent_ref=REVIEWER,
            agent_name="reviewer",
            source_agent="writer",
            on=on,
        )

    assert [what_fires(run_trigger(on)) for on in TriggerOn] == [
        "after a writer run completes",
        "after a writer run fails or expires",
        "after a writer run ends",
    ]
    hook = Trigger(name="inbound", kind=TriggerKind.WEBHOOK, agent_ref=WRITER, agent_name="writer")
    assert what_fires(hook) == "on POST /v1/hooks/inbound (unsigned)"
    signed = Trigger(
        name="inbound",
        kind=TriggerKind.WEBHOOK,
        agent_ref=WRITER,
        agent_name="writer",
        secret_env="HOOK_KEY",
    )
    assert what_fires(signed) == "on POST /v1/hooks/inbound (signed with $HOOK_KEY)"


def test_a_triggered_runs_id_derives_from_the_trigger_and_its_source_alone() -> None:
    # Any process, and any version, finds the run an earlier attempt started.
    digest = hashlib.sha256(b"trigger:review:run_a").hexdigest()
    assert trigger_run_id("review", "run_a") == f"run_{digest[:20]}"


def test_a_runs_chain_depth_is_a_count_or_nothing() -> None:
    assert chain_depth({"chain_depth": 2}) == 2
    for metadata in ({}, {"chain_depth": -1}, {"chain_depth": "2"}, {"chain_depth": None}):
        assert chain_depth(metadata) == 0


def test_started_by_says_what_started_a_run() -> None:
    assert started_by({}) is None
    assert started_by(
        {"trigger": "review", "source_run": "run_a", "source_status": "failed", "chain_depth": 2}
    ) == ("started by trigger review after run run_a failed (chain depth 2)")
    assert started_by({"trigger": "hook", "delivery": "d-1"}) == (
        "started by webhook hook, delivery d-1"
    )
    assert started_by({"schedule": "daily", "tick": "2026-01-01T06:00:00+00:00"}) == (
        "started by schedule daily, tick 2026-01-01T06:00:00+00:00"
    )
    # What it says when a field is missing, as in metadata written by hand or by an older version.
    assert started_by({"trigger": "review", "source_run": "run_a"}) == (
        "started by trigger review after run run_a ended (chain depth 0)"
    )
    assert started_by({"trigger": "review"}) == "started by trigger review"
    assert started_by({"schedule": "daily"}) == "started by schedule daily, tick ?"
    assert started_by({"trigger": 7, "schedule": 8}) is None


# -- webhook signatures -----------------------------------------------------------------------


def test_a_signature_is_the_documented_hmac_and_is_checked_against_the_given_clock() -> None:
    body, t = b'{"order": "A-1"}', 1_700_000_000
    # What a sender in any language computes: HMAC-SHA256 of "{t}.{body}", hex.
    digest = hmac.new(b"shh", b"1700000000." + body, hashlib.sha256).hexdigest()
    header = f"t={t},v1={digest},v0=12345"  # another scheme's digits do not move the time
    assert verify_signature("shh", body, header, now=t + 300) == digest  # the window's edge
    assert verify_signature(b"shh", body, sign(b"shh", body, timestamp=t), now=t) == digest
    with pytest.raises(SignatureExpired) as late:
        verify_signature("shh", body, header, now=t + 301)
    assert late.value.fields == {"signed_at": t}
    with pytest.raises(SignatureInvalid):
        verify_signature("shh", body, f"t=soon,v1={digest}", now=t)
    # Spaces after the commas, as some senders write the header, are allowed.
    assert verify_signature("shh", body, f"t={t}, v1={digest}", now=t) == digest
    # Twelve digits are still a time (a right signature then is merely old); thirteen are not
    # read at all, so the signature is malformed whatever it says.
    with pytest.raises(SignatureExpired):
        verify_signature("shh", body, sign("shh", body, timestamp=10**12 - 1), now=t)
    with pytest.raises(SignatureInvalid):
        verify_signature("shh", body, sign("shh", body, timestamp=10**12), now=t)
    # No tolerance at all: half a second is too old, and said to be so (not ahead).
    with pytest.raises(SignatureExpired, match=r"^the delivery was signed 0s ago; .* within 0s"):
        verify_signature("shh", body, header, tolerance_s=0.0, now=t + 0.5)
    # A NaN tolerance accepts nothing, not even a delivery signed at this very second.
    with pytest.raises(SignatureExpired, match=r"^the delivery was signed 0s ago; .* within nans"):
        verify_signature("shh", body, header, tolerance_s=float("nan"), now=t)


# -- webhook runs -------------------------------------------------------------------------------


async def test_a_webhook_delivery_starts_its_agents_run_under_the_triggers_keys(
    tmp_path: Path,
) -> None:
    async with Runtime(f"sqlite:///{tmp_path}/runs.db") as rt:
        q = queue(rt)
        hook = await add_trigger(q, "inbound", REVIEWER, webhook=True, priority=4)
        review = await add_trigger(q, "review", REVIEWER, after="writer")
        # A webhook listens to no agent's runs.
        assert [(t.name, t.kind, t.source_agent) for t in await q.list_triggers()] == [
            ("inbound", TriggerKind.WEBHOOK, ""),
            ("review", TriggerKind.RUN, "writer"),
        ]
        with pytest.raises(ConfigError) as refused:
            await fire_webhook(rt, review, "hello", delivery="d-1")
        assert str(refused.value) == "trigger 'review' is not a webhook"
        assert refused.value.fields == {"trigger": "review"}
        assert await rt.runs() == []

        # The agent is loaded once and kept in the cache the caller passes, by reference.
        agents: dict[str, Agent] = {}
        signed, created_now = await fire_webhook(
            rt, hook, "hello", delivery="d-1", signature="abc", agents=agents
        )
        assert (signed, created_now) == (trigger_run_id("inbound", "delivery:d-1"), True)
        assert list(agents) == [REVIEWER]
        first = await created(rt, signed)
        assert (first.agent_name, first.agent_ref, first.input) == ("reviewer", REVIEWER, "hello")
        assert first.metadata == {"trigger": "inbound", "delivery": "d-1"}
        entry = await q.queue_entry(signed)
        assert entry is not None and entry.priority == 4
        assert entry.idempotency_key == trigger_key("inbound", "signature:abc")

        # A cached agent is used as it is: the reference is not imported again.
        cached = {REVIEWER: load_agent(PUBLISHER)}
        unsigned, created_now = await fire_webhook(rt, hook, "again", delivery="d-2", agents=cached)
        assert created_now and (await created(rt, unsigned)).agent_name == "publisher"
        entry = await q.queue_entry(unsigned)
        assert entry is not None and entry.idempotency_key == trigger_key("inbound", "delivery:d-2")

        assert await fire_webhook(rt, hook, "hello", delivery="d-1") == (signed, False)
        # Without a cache the agent is loaded for the call.
        third, created_now = await fire_webhook(rt, hook, "more", delivery="d-3")
        assert created_now and (await created(rt, third)).agent_name == "reviewer"
        assert sorted(r.run_id for r in await rt.runs()) == sorted([signed, unsigned, third])
