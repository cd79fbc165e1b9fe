"""Code samples taken from the Markdown as it stands, so the docs' tests run what people read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def code_blocks(language: str, doc: Path = README) -> list[str]:
    """Every fenced block in `language` of `doc`, in order."""
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", doc.read_text(), re.S)]


def run_python(source: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a sample as a script in `cwd`, as a reader would: no store or model configured."""
    script = cwd / "sample.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("CONTEXTOS_STORE", "CONTEXTOS_MODEL")}
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
