"""A worker process for the crash test: start a refund run, or resume one.

usage: approval_child.py STORE_PATH start|resume RUN_ID
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from contextos import Runtime, load_agent
from contextos.policy import Principal
from contextos.policy.authority import Authority

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from refunds import POLICY  # noqa: E402

AGENT_REF = str(HERE / "refunds.py") + ":agent"


async def main(store: str, mode: str, run_id: str) -> None:
    async with Runtime(store, policy=Authority(POLICY)) as rt:
        if mode == "start":
            agent = load_agent(AGENT_REF)
            principal = Principal.user("bob", scopes=("payments:*",))
            result = await rt.run(
                agent, "refund 500", run_id=run_id, agent_ref=AGENT_REF, principal=principal
            )
        else:
            result = await rt.resume(run_id)
        print(result.status.value, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
