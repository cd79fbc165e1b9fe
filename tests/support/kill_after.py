"""Run an agent or a workflow and SIGKILL this very process right after its Nth append, or
never with N = 0 (then print how many appends it made). Appends are counted over every run it
appends to (the parent's and its children's), or with `own` over the started run's log only.
SERVICE binds the run to that service principal (what keys on a principal, such as daily caps,
needs one).

usage: python -m support.kill_after STORE_PATH RUN_ID KILL_AFTER REF INPUT [all|own] [SERVICE]
(with the tests folder on PYTHONPATH: see `support.crashes.crash_env`)
"""

from __future__ import annotations

import asyncio
import sys

from contextos import Principal, Runtime
from contextos.agents import load_ref
from support.crashes import KillingStore


async def main(
    path: str, run_id: str, kill_after: int, ref: str, text: str, count: str, service: str
) -> None:
    store = KillingStore(path, kill_after, only=run_id if count == "own" else None)
    principal = Principal.service(service) if service else None
    async with Runtime(store) as rt:
        await rt.run(load_ref(ref), text, run_id=run_id, agent_ref=ref, principal=principal)
        print(store.appends)


if __name__ == "__main__":
    path, run_id, kill_after, ref, text = sys.argv[1:6]
    count = sys.argv[6] if len(sys.argv) > 6 else "all"
    service = sys.argv[7] if len(sys.argv) > 7 else ""
    asyncio.run(main(path, run_id, int(kill_after), ref, text, count, service))
