"""docs/improve.md runs as written: its file is saved, its Python prints what the page says,
its shell lines exit 0, in one directory, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contextos import Runtime
from support.markdown import ROOT, run_page

DOC = ROOT / "docs" / "improve.md"


def test_the_improvement_page_runs_as_written(tmp_path: Path) -> None:
    shell = run_page(DOC, tmp_path)

    def out(start: str) -> list[str]:
        return [done.stdout for line, done in shell if line.startswith(start)]

    [findings] = out("contextos findings --scan")
    assert "tool_error on lookup_order in order-desk: 3x in 3 runs (3 recovered)" in findings
    assert "root cause tool_description" in findings
    [proposals] = out("contextos proposals")
    assert "tool_description · agent order-desk, tool lookup_order" in proposals
    statuses = out("contextos release status")
    assert "order-desk: release -> cnd_" in statuses[0] and "by alice" in statuses[0]
    assert "rollback -> its code as it is by bob" in statuses[1]
    store = tmp_path / "improve.db"
    released, rolled_back = asyncio.run(turns(store, "run_released", "run_rolled_back"))
    assert (released, rolled_back) == (2, 3)  # the code as it is fails its first call again


async def turns(store: Path, *run_ids: str) -> list[int]:
    async with Runtime(str(store)) as rt:
        return [(await rt.state(run_id)).turns for run_id in run_ids]
