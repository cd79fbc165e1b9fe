"""The example in docs/context.md runs, and prints what the page says it shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "context.md"


def test_the_context_example_runs_and_shows_the_guards(tmp_path: Path) -> None:
    section = DOC.read_text().split("## Example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "docs/context.md has no runnable example"
    script = tmp_path / "example.py"
    script.write_text(found.group(1))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    printed = out.stdout
    assert printed.startswith("completed Order 7 shipped.")
    system = printed.split("--- system\n", 1)[1].split("\n--- ", 1)[0]
    assert "Answer order questions." in system and "- refunds:" in system
    assert "jo@example.com" not in printed and "[REDACTED:EMAIL]" in printed
    tool = printed.split("--- tool\n", 1)[1].split("\n--- ", 1)[0]
    assert tool.startswith("<<untrusted-data") and "⟦injection?" in tool
    tail = printed.rsplit("--- user\n", 1)[1]
    assert "Prefers email" in tail and "<<untrusted-data" in tail
