"""A map whose worker is a function records each item's output as it finishes: a process
SIGKILLed in the middle of the map resumes in a new one without calling the function again on
the items it finished."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

from contextos.cli.common import workflow_progress
from support import crashes
from support.crashes import lines, resume, states

PAGES = "tests/graph/crash_targets.py:pages"
URLS = ["a", "b", "c", "d", "e"]


def test_a_code_map_killed_midway_resumes_at_its_first_unfinished_item(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    text = json.dumps({"urls": URLS})
    killed = crashes.kill_after(db, "run_m", 0, PAGES, text, tmp_path, CRASH_KILL_AT="fetch:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    killed_at = states(db)["run_m"]
    assert killed_at.nodes["fetch"].item_outputs == {0: "<html>a</html>", 1: "<html>b</html>"}
    # What the live line of `contextos run` and `kb scan` says of it.
    assert workflow_progress(killed_at) == "0 of 1 nodes done · fetch (2 of 5 items)…"

    resumed = resume(db, "run_m", tmp_path)
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
    fetch = states(db)["run_m"].nodes["fetch"]
    assert fetch.output == [f"<html>{u}</html>" for u in URLS]
    assert fetch.item_outputs == {}  # held by the node's output once it completed
    calls = Counter(str(r["item"]) for r in lines(tmp_path / "code.jsonl"))
    # Only the item the kill cut off ran twice.
    assert calls == {"a": 1, "b": 1, "c": 2, "d": 1, "e": 1}
