"""docs/improve.md runs as written: its file is saved, its Python prints what the page says,
its shell lines exit 0, in one directory, in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "improve.md"
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def run_page(tmp_path: Path) -> list[tuple[str, str]]:
    """Run every block of the page; each shell line's output."""
    text = DOC.read_text()
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for name in ("CONTEXTOS_STORE", "CONTEXTOS_POLICY"):
        env.pop(name, None)
    shell: list[tuple[str, str]] = []
    found = list(BLOCK.finditer(text))
    for i, block in enumerate(found):
        lang, body = block.group(1), block.group(2)
        named = re.fullmatch(r"# (\S+\.\w+)", body.splitlines()[0])
        if named:
            (tmp_path / named.group(1)).write_text(body)
        elif lang == "python":
            done = subprocess.run(
                [sys.executable, "-c", body],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"block {i}:\n{done.stderr}"
            after = found[i + 1] if i + 1 < len(found) else None
            assert after is not None and text[block.end() : after.start()] == "\n\nprints\n\n"
            assert done.stdout == after.group(2), f"block {i} printed:\n{done.stdout}"
        elif lang == "bash":
            for line in body.splitlines():
                if line.startswith("export "):
                    key, _, value = line.removeprefix("export ").partition("=")
                    env[key] = value
                    continue
                done = subprocess.run(
                    ["bash", "-c", line],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                shell.append((line, done.stdout))
    return shell


def test_the_improvement_page_runs_as_written(tmp_path: Path) -> None:
    shell = run_page(tmp_path)

    def out(start: str) -> list[str]:
        return [printed for line, printed in shell if line.startswith(start)]

    [findings] = out("contextos findings --scan")
    assert "tool_error on lookup_order in order-desk: 3x in 3 runs (3 recovered)" in findings
    assert "root cause tool_description" in findings
    [proposals] = out("contextos proposals")
    assert "tool_description · agent order-desk, tool lookup_order" in proposals
    statuses = out("contextos release status")
    assert "order-desk: release -> cnd_" in statuses[0] and "by alice" in statuses[0]
    assert "rollback -> its code as it is by bob" in statuses[1]
