"""Run an agent or a workflow and SIGKILL this very process right after its Nth append (over
every run it appends to: the parent's and its children's), or never with N = 0.

usage: kill_after.py STORE_PATH RUN_ID KILL_AFTER REF INPUT
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from contextos import Runtime
from contextos.agents import load_ref
from contextos.events import Event
from contextos.runs import RunId
from contextos.store import SqliteStore


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


async def main(path: str, run_id: str, kill_after: int, ref: str, text: str) -> None:
    store = KillingStore(path, kill_after)
    async with Runtime(store) as rt:
        await rt.run(load_ref(ref), text, run_id=run_id, agent_ref=ref)
        print(store.appends)


if __name__ == "__main__":
    path, run_id, kill_after, ref, text = sys.argv[1:6]
    asyncio.run(main(path, run_id, int(kill_after), ref, text))
