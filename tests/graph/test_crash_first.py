"""A map that takes the first item giving a result (`merge="first"`), SIGKILLed after each
append to any of its logs and resumed in a fresh process: the item after the one that gave a
result is never started, in either process, and the output is a clean run's."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from contextos.runs import RunStatus
from support import crashes
from support.crashes import lines, resume, states

FLOW = "tests/graph/crash_targets.py:fallback"
INPUT = '{"names": ["down", "up", "spare"]}'
APPENDS_IN_A_CLEAN_RUN = 14
"""To every log: the workflow's and its two child runs' (the mirror that is down, the one up)."""
CHILDREN = ["run_f.fetch.0", "run_f.fetch.1"]


def test_a_clean_run_stops_at_the_first_mirror_that_answers(tmp_path: Path) -> None:
    done = crashes.kill_after(tmp_path / "runs.db", "run_f", 0, FLOW, INPUT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == APPENDS_IN_A_CLEAN_RUN
    runs = states(tmp_path / "runs.db")
    assert sorted(runs) == sorted(["run_f", *CHILDREN])  # the spare was never started
    assert runs["run_f"].structured_output == {"mirror": "up"}


@pytest.mark.parametrize("n", range(1, APPENDS_IN_A_CLEAN_RUN + 1))
def test_killed_after_any_append_the_item_after_the_first_result_never_starts(
    tmp_path: Path, n: int
) -> None:
    db = tmp_path / "runs.db"
    killed = crashes.kill_after(db, "run_f", n, FLOW, INPUT, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    resumed = resume(db, "run_f", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
    runs = states(db)
    assert sorted(runs) == sorted(["run_f", *CHILDREN])  # no spare, no child twice
    flow = runs["run_f"]
    assert flow.status is RunStatus.COMPLETED
    assert flow.structured_output == {"mirror": "up"}
    assert {k: c.status.value for k, c in flow.children.items()} == {
        "fetch.0": "failed",
        "fetch.1": "completed",
    }
    asked = Counter(str(r["run_id"]) for r in lines(tmp_path / "model.jsonl"))
    assert asked["run_f.fetch.1"] == 1  # the answer that was recorded is never asked again
