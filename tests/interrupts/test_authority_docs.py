"""The runnable expiry example in docs/authority.md runs and prints what the page says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "authority.md"


def test_the_expiry_example_runs(tmp_path: Path) -> None:
    section = DOC.read_text().split("## 5.", 1)[1]
    found = re.search(r"```python\n(.*?Sweeper.*?)```\n\n```\n(.*?)```", section, re.S)
    assert found is not None, "docs/authority.md §5 has no runnable expiry example"
    example, printed = found.groups()
    script = tmp_path / "example.py"
    script.write_text(example)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert re.sub(r"run_[0-9a-f]{20}", "run_…", out.stdout) == printed
