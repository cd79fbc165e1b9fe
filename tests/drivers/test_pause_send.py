"""Pause and follow-up messages from the command line, over real processes.

`contextos pause` from a second process stops a live `contextos run` at its next step boundary
(the step in flight finishes and is recorded, nothing after it starts), and `contextos resume`
goes on without running a step twice. `contextos send` continues a conversation as the same
run, with the whole conversation sent to the model; what a run cannot take is one line, exit 1,
and nothing recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_ownership import AGENT, calls, cli, events_of, procs, start_cli, work  # noqa: F401

from contextos import events as ev
from support.processes import wait_for_file

CHAT = "tests/drivers/chat_agent.py:agent"


def one_line_error(result: object, *needles: str) -> None:
    stderr = getattr(result, "stderr", "")
    assert getattr(result, "returncode", None) == 1, stderr
    assert stderr.startswith("error:") and "Traceback" not in stderr, stderr
    line, *hint = stderr.splitlines()
    assert len(hint) <= 1, stderr  # the error in one line, perhaps a hint under it
    flat = " ".join(line.split())
    for needle in needles:
        assert needle in flat, stderr


async def test_pause_from_another_process_stops_a_live_run_at_its_next_step(
    work: Path,  # noqa: F811
    procs: list,  # noqa: F811
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_p", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")

    asked = cli("pause", "run_p", "--reason", "checking first", "--store", str(db))
    assert asked.returncode == 0, asked.stderr
    assert "pauses after its current step" in " ".join(asked.stdout.split())

    (work / "go").touch()  # step 1 finishes; the driver pauses instead of starting step 2
    out, errs = driver.communicate(timeout=60)
    assert driver.returncode == 0, errs
    assert "run run_p paused" in out and "contextos resume run_p" in " ".join(out.split())
    assert calls(work) == ["start 1", "end 1"]

    events = await events_of(db, "run_p")
    kinds = [e.type for e in events]
    assert kinds[-3:] == ["run_pause_requested", "tool_completed", "run_paused"]
    paused = events[-1]
    assert isinstance(paused, ev.RunPaused) and paused.reason == "checking first"
    assert paused.actor == "user:cli" and paused.causation_id == events[-3].seq

    shown = cli("show", "run_p", "--store", str(db))
    assert "paused" in shown.stdout and "contextos resume run_p" in " ".join(shown.stdout.split())

    resumed = cli("resume", "run_p", "--store", str(db))
    assert resumed.returncode == 0, resumed.stderr
    assert "completed" in resumed.stdout
    assert calls(work) == ["start 1", "end 1", "start 2", "end 2"]  # no step ran twice
    events = await events_of(db, "run_p")
    assert not any(isinstance(e, ev.RuntimeCrashDetected) for e in events)

    one_line_error(
        cli("pause", "run_p", "--store", str(db)), "run run_p has already completed", "nothing"
    )
    assert len(await events_of(db, "run_p")) == len(events)


async def test_send_continues_a_conversation_as_the_same_run(work: Path) -> None:  # noqa: F811
    db = work / "runs.db"
    started = cli("run", CHAT, "hello", "--run-id", "run_c", "--store", str(db))
    assert started.returncode == 0, started.stderr
    assert "input_required" in started.stdout and "user: hello" in started.stdout
    assert 'contextos send run_c "…"' in " ".join(started.stdout.split())

    sent = cli("send", "run_c", "and in euros?", "--store", str(db), "--follow")
    assert sent.returncode == 0, sent.stderr
    # The model answers with what it was sent: the first exchange, then the follow-up.
    assert "user: hello | assistant: user: hello | user: and in euros?" in sent.stdout
    assert "user_message_added" in sent.stdout  # --follow printed the events as they came

    events = await events_of(db, "run_c")
    added = [e for e in events if isinstance(e, ev.UserMessageAdded)]
    assert [(e.content, e.actor) for e in added] == [("and in euros?", "user:cli")]
    assert [e.type for e in events].count("run_answered") == 2

    # The budget allows two model turns: a third message is refused, and nothing recorded.
    one_line_error(
        cli("send", "run_c", "one more", "--store", str(db)),
        "run run_c has no budget left",
        "used all 2 model turns",
    )
    assert len(await events_of(db, "run_c")) == len(events)


async def test_what_a_run_cannot_take_is_one_line(work: Path) -> None:  # noqa: F811
    db = work / "runs.db"
    (work / "go").touch()
    assert cli("run", AGENT, "two steps", "--run-id", "run_d", "--store", str(db)).returncode == 0
    recorded = len(await events_of(db, "run_d"))
    one_line_error(
        cli("send", "run_d", "more please", "--store", str(db)),
        "run run_d has completed and is final",
        "conversation=True",
    )
    one_line_error(cli("send", "run_d", "  ", "--store", str(db)), "needs some text")
    one_line_error(cli("pause", "run_nope", "--store", str(db)), "run_nope")
    assert len(await events_of(db, "run_d")) == recorded


async def test_pause_of_a_run_whose_driver_died_pauses_it_at_once(
    work: Path,  # noqa: F811
    procs: list,  # noqa: F811
) -> None:
    db = work / "runs.db"
    driver = start_cli("run", AGENT, "two steps", "--run-id", "run_k", "--store", str(db))
    procs.append(driver)
    wait_for_file(work / "started-1")
    driver.kill()  # SIGKILL mid-step: the run stays `running` under a lease nobody renews
    driver.wait(timeout=30)

    paused = cli("pause", "run_k", "--wait", "--store", str(db))
    assert paused.returncode == 0, paused.stderr
    assert "run run_k paused" in paused.stdout
    kinds = [e.type for e in await events_of(db, "run_k")]
    assert kinds[-1] == "run_paused" and "run_pause_requested" not in kinds

    (work / "go").touch()
    resumed = cli("resume", "run_k", "--store", str(db))
    assert resumed.returncode == 0 and "completed" in resumed.stdout, resumed.stderr


async def test_finish_closes_an_answered_conversation_with_its_last_answer(
    work: Path,  # noqa: F811
) -> None:
    db = work / "runs.db"
    assert cli("run", CHAT, "hello", "--run-id", "run_f", "--store", str(db)).returncode == 0
    assert cli("send", "run_f", "and in euros?", "--store", str(db)).returncode == 0

    finished = cli("finish", "run_f", "--store", str(db), "--json")
    assert finished.returncode == 0, finished.stderr
    result = json.loads(finished.stdout)
    assert result["status"] == "completed"
    assert result["output"] == "user: hello | assistant: user: hello | user: and in euros?"

    events = await events_of(db, "run_f")
    completed = events[-1]
    assert isinstance(completed, ev.RunCompleted) and completed.actor == "user:cli"
    answers = [e for e in events if isinstance(e, ev.RunAnswered)]
    assert completed.answer_seq == answers[-1].answer_seq  # the last answer, not stored again
    (artifact,) = [e for e in events if isinstance(e, ev.ArtifactRecorded)]
    assert artifact.artifact_type == "run_output"

    # A finished run, a run that is no conversation: one line each, nothing recorded.
    one_line_error(cli("finish", "run_f", "--store", str(db)), "has already completed")
    (work / "go").touch()
    assert cli("run", AGENT, "two steps", "--run-id", "run_g", "--store", str(db)).returncode == 0
    one_line_error(cli("finish", "run_g", "--store", str(db)), "has already completed")
    assert len(await events_of(db, "run_f")) == len(events)
