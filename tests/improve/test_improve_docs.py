"""docs/improve.md runs as written: its file is saved, its Python prints what the page says,
its shell lines exit 0, in one directory (beside the repository's examples), in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contextos import Runtime
from support.markdown import ROOT, run_page

DOC = ROOT / "docs" / "improve.md"


def test_the_improvement_page_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # run "from the repository's root"
    shell = run_page(DOC, tmp_path)

    def out(start: str) -> list[str]:
        return [done.stdout for line, done in shell if line.startswith(start)]

    [findings] = out("contextos findings --scan")
    seen = "verification_failed on output_type:Summary in kb-writer: 2x in 2 runs (2 recovered)"
    assert seen in findings and "root cause instructions" in findings
    [proposals] = out("contextos proposals")
    assert "scoped_instruction · agent kb-writer" in proposals
    assert "the first time: The answer must be a JSON object" in proposals
    statuses = out("contextos release status")
    assert "kb-writer: release -> cnd_" in statuses[0] and "by alice" in statuses[0]
    assert "rollback -> its code as it is by bob" in statuses[1]
    released, rolled_back = asyncio.run(writer_turns(tmp_path / "improve.db", "wiki", "archive"))
    assert (released, rolled_back) == (1, 2)  # the code as it is needs its second answer again


async def writer_turns(store: Path, *roots: str) -> list[int]:
    """The model calls of the writer of the (latest) scan of each knowledge base."""
    async with Runtime(str(store)) as rt:
        turns: list[int] = []
        for root in roots:
            scans = [r for r in await rt.runs(limit=500) if r.agent_name == "kb-scan"]
            [scan] = [s for s in scans if (await rt.state(s.run_id)).input.find(root) >= 0][:1]
            [writer] = (await rt.tree(scan.run_id)).child_run_ids()
            turns.append((await rt.state(writer)).turns)
        return turns
