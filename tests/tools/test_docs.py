"""The runnable example in docs/tools.md runs and prints the ledger it describes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def test_the_docs_example_runs(tmp_path: Path) -> None:
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert example is not None
    script = tmp_path / "example.py"
    script.write_text(example.group(1))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "completed Sent." in out.stdout
    assert "proposed -> validated -> authorised -> dispatched -> committed" in out.stdout
    assert "{'transfer_id': 'tr_1'}" in out.stdout
    assert "'iban': '[redacted]'" in out.stdout
