"""The runnable examples in docs/graph.md run and print what the page says they print."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "graph.md"
EXAMPLES = re.findall(
    r"```python\n((?:(?!```).)*)```\n\nprints\n\n```\n(.*?)```", DOC.read_text(), re.S
)  # a Python block followed by what it prints (not one that only shows a declaration)


def test_the_page_has_its_examples() -> None:
    assert len(EXAMPLES) == 3


@pytest.mark.parametrize(("code", "printed"), EXAMPLES, ids=["workflow", "routes", "subagents"])
def test_each_example_prints_what_the_page_says(tmp_path: Path, code: str, printed: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed


COMMAND = re.search(r"```bash\n(contextos run kb\.py:flow .*?)\n```", DOC.read_text())
TREE = re.search(r"and `contextos show RUN` draws it:\n\n```\n(.*?)```", DOC.read_text(), re.S)


def test_the_workflow_runs_from_the_command_line_and_show_draws_its_tree(tmp_path: Path) -> None:
    assert COMMAND is not None and TREE is not None
    (tmp_path / "kb.py").write_text(EXAMPLES[0][0])

    def contextos(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "contextos", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    result = json.loads(contextos(*shlex.split(COMMAND.group(1))[1:], "--json"))
    assert result["status"] == "completed"
    assert result["structured_output"] == {
        "dead": ["docs/old-page", "blog/old-page", "wiki/old-page"]
    }
    shown = contextos("show", result["run_id"])
    # Each line the page draws, up to the figures that differ from run to run.
    for line in TREE.group(1).splitlines():
        if "…" in line.split("·")[0]:
            continue  # a child's id or an elided line
        label = line.split("·")[0].strip(" ├└│─")
        assert label in shown, f"{label!r} not in:\n{shown}"
    assert "workflow completed" in shown and "kb-scan v1" in shown
    assert "4 items, 3 passed, 1 rejected" in shown
