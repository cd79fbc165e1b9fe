"""What the default platform stack costs per turn: `python -m bench.stack [--turns N]`.

One runtime on a fresh SQLite file per run; the scripted model calls `echo` with a 200-character
text each turn. Rounds alternate an agent under the default guards (budget gate, PII redaction,
sanitizer) with the same agent that opts out of all three, so both see the same machine. Prints
the median per-turn wall time of each, the database size, and the per-turn time of the first
and last tenth of the default run's turns (a guard that rescanned the whole history every call
would make the late turns cost more).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from contextos import Agent, Budget, Runtime
from contextos.store import SqliteStore
from contextos.testing import ScriptedModel, call_tool, reply

MESSAGE = "x" * 200
OPTED_OUT = {layer: "measuring the stack's cost" for layer in ("budget", "pii", "sanitize")}


async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def _agent(turns: int, opt_out: dict[str, str], stamps: list[float]) -> Agent:
    def step(_: Any) -> Any:
        stamps.append(time.perf_counter())
        return call_tool("echo", {"text": MESSAGE})

    steps: list[Any] = [step for _ in range(turns)] + [reply("done")]
    return Agent(
        name="bench",
        model=ScriptedModel(steps, by_turn=True),
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
        opt_out=opt_out,
    )


async def _once(turns: int, opt_out: dict[str, str]) -> dict[str, float]:
    db = Path(tempfile.mkdtemp()) / "runs.db"
    stamps: list[float] = []
    async with Runtime(SqliteStore(db)) as rt:
        started = time.perf_counter()
        await rt.run(_agent(turns, opt_out, stamps), MESSAGE)
        elapsed = time.perf_counter() - started
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    tenth = max(len(gaps) // 10, 1)
    return {
        "per_turn_ms": elapsed / turns * 1e3,
        "bytes": float(db.stat().st_size),
        "first_ms": statistics.median(gaps[:tenth]) * 1e3,
        "last_ms": statistics.median(gaps[-tenth:]) * 1e3,
    }


async def main(turns: int, rounds: int) -> None:
    await _once(3, {})  # first-use costs are not per-turn costs
    runs: dict[str, list[dict[str, float]]] = {"default stack": [], "opted out": []}
    for _ in range(rounds):
        runs["default stack"].append(await _once(turns, {}))
        runs["opted out"].append(await _once(turns, OPTED_OUT))
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(
            f"{name:14} {med['per_turn_ms']:6.1f} ms/turn  {med['bytes'] / 1024:6.0f} KiB  "
            f"first turns {med['first_ms']:5.1f} ms, last turns {med['last_ms']:5.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.stack", description=__doc__)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.rounds))
