"""Write the golden ReplayPackets (tests/fixtures/replay/) and the canonical fixtures
(tests/fixtures/canonical/) from real runs of the agents in support_agents.py.

Run it from the repository root when a record's shape changes on purpose:
`python tests/evidence/make_golden.py`; the tests only read what it wrote.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from support_agents import POLICY  # noqa: E402

from contextos import Principal, Runtime  # noqa: E402
from contextos.evidence import (  # noqa: E402
    build_record,
    compiled_contexts,
    run_context,
    tool_envelopes,
)
from contextos.evidence.canonical import LatestResult, ReplayPacket  # noqa: E402

FIXTURES = HERE.parent / "fixtures"
AGENTS = "tests/evidence/support_agents.py"
BOB = Principal.user("bob", tenant="acme", scopes=("payments:*",))


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    os.environ["EVIDENCE_LEDGER"] = str(tmp / "ledger.jsonl")
    from support_agents import agent, writer

    async with Runtime(str(tmp / "governed.db"), policy=POLICY) as rt:
        waiting = await rt.run(
            agent,
            "Refund order A-1",
            principal=BOB,
            run_id="run_golden_refund",
            agent_ref=f"{AGENTS}:agent",
        )
        [asked] = await rt.inbox()
        await rt.approve(asked.id, approver="alice")
        await rt.resume(waiting.run_id, agent)
        events = await rt.events(waiting.run_id)
        approved = await rt.packet(waiting.run_id)
        canonical = FIXTURES / "canonical"
        (canonical / "RunContext.json").write_text(run_context(events).to_json() + "\n")
        (canonical / "CompiledContext.json").write_text(
            compiled_contexts(events)[1].to_json() + "\n"
        )
        (canonical / "ToolEnvelope.json").write_text(tool_envelopes(events)[1].to_json() + "\n")
        (canonical / "DecisionRecord.json").write_text(build_record(events).to_json() + "\n")
        _write("approved_refund", approved, (await rt.replay(approved)).status)
    async with Runtime(str(tmp / "plain.db")) as rt:
        done = await rt.run(
            agent, "Refund order A-1", run_id="run_golden_plain", agent_ref=f"{AGENTS}:agent"
        )
        plain = await rt.packet(done.run_id)
        _write("ungoverned_refund", plain, (await rt.replay(plain)).status)
        (FIXTURES / "canonical" / "ReplayPacket.json").write_text(plain.to_json() + "\n")
        done = await rt.run(
            writer, "Capital of France?", run_id="run_golden_writer", agent_ref=f"{AGENTS}:writer"
        )
        cited = await rt.packet(done.run_id)
        _write("verified_on_second_try", cited, (await rt.replay(cited)).status)


def _write(name: str, packet: ReplayPacket, status: str) -> None:
    assert status == "replay_equal", f"{name} does not replay equal: {status}"
    pinned = packet.model_copy(update={"latest_result": LatestResult(status=status)})
    out = FIXTURES / "replay" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(pinned.to_json() + "\n")
    print(out)


if __name__ == "__main__":
    asyncio.run(main())
