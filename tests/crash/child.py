"""Drive one run and SIGKILL this very process right after the Nth append commits.

usage: child.py STORE_PATH RUN_ID KILL_AFTER
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from contextos import Runtime, load_agent
from contextos.events import Event
from contextos.runs import RunId
from contextos.store import SqliteStore

AGENT_REF = "tests/crash/crash_agent.py:agent"


class KillingStore(SqliteStore):
    def __init__(self, path: str, kill_after: int) -> None:
        super().__init__(path)
        self.kill_after = kill_after
        self.appends = 0

    async def append(
        self,
        run_id: RunId,
        events: Sequence[Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous
        )
        self.appends += 1
        if self.appends == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return seq


async def main(path: str, run_id: str, kill_after: int) -> None:
    agent = load_agent(AGENT_REF)
    async with Runtime(KillingStore(path, kill_after)) as rt:
        await rt.run(agent, "Where are A-1 and B-2?", run_id=run_id, agent_ref=AGENT_REF)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
