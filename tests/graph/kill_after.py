"""Run an agent or a workflow and SIGKILL this very process right after its Nth append, or
never with N = 0. Appends are counted over every run it appends to (the parent's and its
children's), or with `own` over the started run's log only. SERVICE binds the run to that
service principal (what keys on a principal, such as daily caps, needs one).

usage: kill_after.py STORE_PATH RUN_ID KILL_AFTER REF INPUT [all|own] [SERVICE]
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from contextos import Principal, Runtime
from contextos.agents import load_ref
from contextos.events import Event
from contextos.runs import RunId
from contextos.store import SqliteStore


class KillingStore(SqliteStore):
    def __init__(self, path: str, kill_after: int, only: str | None) -> None:
        super().__init__(path)
        self.kill_after = kill_after
        self.only = only
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
        if self.only is not None and run_id != self.only:
            return seq
        self.appends += 1
        if self.appends == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return seq


async def main(
    path: str, run_id: str, kill_after: int, ref: str, text: str, count: str, service: str
) -> None:
    store = KillingStore(path, kill_after, run_id if count == "own" else None)
    principal = Principal.service(service) if service else None
    async with Runtime(store) as rt:
        await rt.run(load_ref(ref), text, run_id=run_id, agent_ref=ref, principal=principal)
        print(store.appends)


if __name__ == "__main__":
    path, run_id, kill_after, ref, text = sys.argv[1:6]
    count = sys.argv[6] if len(sys.argv) > 6 else "all"
    service = sys.argv[7] if len(sys.argv) > 7 else ""
    asyncio.run(main(path, run_id, int(kill_after), ref, text, count, service))
