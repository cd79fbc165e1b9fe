"""SIGKILL a real process while the child run revising a reviewed result is in flight, and
resume the workflow in a fresh process: the revision child is resumed, not started again (no
third child, the first one never runs again), and its result is put to the person in turn."""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path

from contextos.runs import RunStatus
from support import crashes
from support.crashes import lines, resume, states

FLOW = "tests/graph/crash_targets.py:drafted"


def question(db: Path) -> str:
    """The id of the one question the workflow is waiting on."""
    (asked,) = states(db)["run_r"].pending_interrupts
    return asked


def answer(db: Path, interrupt_id: str, verdict: str, log_dir: Path) -> None:
    """`contextos answer` in a process of its own, as a person would."""
    command = [sys.executable, "-m", "contextos", "answer", interrupt_id, verdict]
    answered = crashes.run([*command, "--store", str(db), "--as", "alice"], log_dir)
    assert answered.returncode == 0, answered.stderr


def test_a_revision_killed_in_flight_is_resumed_not_started_again(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = crashes.kill_after(db, "run_r", 0, FLOW, '{"name": "tides"}', tmp_path)
    assert first.returncode == 0, first.stderr
    assert states(db)["run_r"].status is RunStatus.INPUT_REQUIRED
    answer(db, question(db), '{"verdict": "revise", "comments": "name the moon"}', tmp_path)

    killed = resume(db, "run_r", tmp_path, CRASH_KILL_AT="revise:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = states(db)
    assert before["run_r.draft.v2"].turns == 0  # started, its answer not recorded
    draft_log = len(before["run_r.draft"].messages)

    waiting = resume(db, "run_r", tmp_path)
    assert waiting.returncode == 0, waiting.stderr
    after = states(db)
    assert sorted(after) == ["run_r", "run_r.draft", "run_r.draft.v2"]  # no child twice
    assert after["run_r"].status is RunStatus.INPUT_REQUIRED
    revised = after["run_r"].pending_interrupts[question(db)]
    assert revised.payload["child_run_id"] == "run_r.draft.v2"
    assert revised.payload["result"] == {"text": "a note on tides, name the moon"}
    assert len(after["run_r.draft"].messages) == draft_log  # the first child never ran again

    answer(db, question(db), "accept", tmp_path)
    done = resume(db, "run_r", tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    flow = states(db)["run_r"]
    assert flow.structured_output == "published: a note on tides, name the moon"
    # The first child was asked once; the revision once in the killed process (its answer
    # was lost with it) and once after; the code node ran once.
    asked = Counter(str(r["run_id"]) for r in lines(tmp_path / "model.jsonl"))
    assert asked == {"run_r.draft": 1, "run_r.draft.v2": 2}
    assert [r["node"] for r in lines(tmp_path / "code.jsonl")] == ["publish"]
