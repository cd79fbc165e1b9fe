"""Reading what a killed process left behind: every run in a SQLite store, and JSON-lines logs
that scripted models and code nodes write across processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from contextos.state import RunState, fold
from contextos.store import SqliteStore


def states(db: Path) -> dict[str, RunState]:
    """Every run in the store, folded."""

    async def read() -> dict[str, RunState]:
        store = SqliteStore(db)
        try:
            runs = await store.list_runs(limit=1000)
            return {r.run_id: fold(await store.read(r.run_id)) for r in runs}
        finally:
            await store.close()

    return asyncio.run(read()) if db.exists() else {}


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
