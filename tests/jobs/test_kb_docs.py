"""The example in docs/kb-scan.md runs and prints what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kb-scan.md"


def test_the_day_one_day_two_example_prints_what_the_page_says(tmp_path: Path) -> None:
    text = DOC.read_text()
    examples = re.findall(r"```python\n(.*?)```", text, re.S)
    printed = re.search(r"prints\n\n```\n(.*?)```", text, re.S)
    assert len(examples) == 1 and printed is not None  # every code sample here is run
    script = tmp_path / "example.py"
    script.write_text(examples[0])
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed.group(1)
