"""docs/evidence.md runs as written: its files are saved, its Python runs and prints what the
page says, its shell lines exit as the page says, in one directory, in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "evidence.md"
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def run_page(tmp_path: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every block of the page; returns each shell line's result."""
    text = DOC.read_text()
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for name in ("CONTEXTOS_STORE", "CONTEXTOS_POLICY", "CONTEXTOS_OTEL_CAPTURE_CONTENT"):
        env.pop(name, None)
    shell: dict[str, subprocess.CompletedProcess[str]] = {}
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
                timeout=120,
            )
            assert done.returncode == 0, f"block {i}:\n{done.stderr}"
            after = found[i + 1] if i + 1 < len(found) else None
            if after is not None and text[block.end() : after.start()] == "\n\nprints\n\n":
                assert done.stdout == after.group(2), f"block {i} printed:\n{done.stdout}"
        elif lang == "bash":
            for line in body.splitlines():
                if line.startswith("export "):
                    key, _, value = line.removeprefix("export ").partition("=")
                    env[key] = value
                    continue
                expected = 1 if line.endswith("# exits 1") else 0
                done = subprocess.run(
                    ["bash", "-c", line],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == expected, f"{line}\n{done.stdout}\n{done.stderr}"
                assert "Traceback" not in done.stderr, line
                shell[line] = done
    return shell


def test_the_evidence_page_runs_as_written(tmp_path: Path) -> None:
    shell = run_page(tmp_path)

    def out(start: str) -> str:
        [found] = [done.stdout for line, done in shell.items() if line.startswith(start)]
        return found

    assert "#" in out("contextos show run_refund")
    assert out("contextos replay run_refund --store").startswith("replay_equal")
    mismatch = out("contextos replay run_refund --agent")
    assert mismatch.startswith("replay_mismatch")
    diff = re.search(r"```\n(tool calls chosen:\n.*?)```", DOC.read_text(), re.S)
    assert diff is not None and diff.group(1) in mismatch
    assert out("contextos replay --packet").startswith("replay_equal")
    assert "completed" in out("contextos fork run_refund --at 10")
    assert "Credited 250 EUR." in out("contextos fork run_refund --at 6")
    assert (
        "fork at a seq in that range"
        in shell["contextos fork run_refund --at 99 --store evidence.db  # exits 1"].stderr
    )
    # one refund, by the recorded run; one credit, by the fork with the credit agent
    assert (tmp_path / "writes.log").read_text().splitlines() == [
        "refund A-1 250.0",
        "credit A-1 250.0",
    ]
