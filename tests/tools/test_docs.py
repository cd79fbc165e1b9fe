"""The runnable examples in docs/tools.md run and print what the page says they print."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_mcp_example_runs(tmp_path: Path) -> None:
    """The MCP section's example, against the real git server, in a real repository."""
    if importlib.util.find_spec("mcp_server_git") is None:
        if os.environ.get("CI"):
            pytest.fail("mcp-server-git is not installed")
        pytest.skip("mcp-server-git is not installed")
    section = DOC.read_text().split("## MCP tools", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    printed = re.search(r"prints\n\n```\n(.*?)```", section, re.S)
    assert example is not None and printed is not None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    script = tmp_path / "example.py"
    script.write_text(example.group(1))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed.group(1)
