"""The README's main command and its first Python sample, on the embedded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.markdown import code_blocks, run_python

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.local_model
def test_the_quickstart_agent_answers_from_its_tool_on_the_local_model(
    model_path: Path, tmp_path: Path
) -> None:
    db = tmp_path / "demo.db"
    env = {k: v for k, v in os.environ.items() if k != "CONTEXTOS_MODEL"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "contextos",
            "run",
            "examples/quickstart.py:agent",
            "Where is order A-1001?",
            "--store",
            str(db),
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "completed"
    shown = subprocess.run(
        [sys.executable, "-m", "contextos", "show", result["run_id"], "--store", str(db), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    events = json.loads(shown.stdout)["events"]
    calls = [
        c for e in events if e["type"] == "model_responded" for c in e["message"]["tool_calls"]
    ]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("lookup_order", {"order_id": "A-1001"})
    ]
    assert any(e["type"] == "tool_completed" and "shipped" in e["output"] for e in events)
    assert events[-1]["type"] == "run_completed"


@pytest.mark.local_model
def test_the_readme_first_agent_runs_as_written(model_path: Path, tmp_path: Path) -> None:
    done = run_python(code_blocks("python")[0], tmp_path)
    assert done.returncode == 0, done.stderr
    status, _, said = done.stdout.strip().partition(" ")
    assert status == "completed", done.stdout
    assert "shipped" in said
    assert (tmp_path / ".contextos" / "contextos.db").exists()
