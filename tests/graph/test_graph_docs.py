"""The runnable examples in docs/graph.md run and print what the page says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "graph.md"
EXAMPLES = re.findall(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", DOC.read_text(), re.S)


def test_the_page_has_its_examples() -> None:
    assert len(EXAMPLES) == 2


@pytest.mark.parametrize(("code", "printed"), EXAMPLES, ids=["workflow", "subagents"])
def test_each_example_prints_what_the_page_says(tmp_path: Path, code: str, printed: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed
