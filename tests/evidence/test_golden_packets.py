"""The golden ReplayPackets (tests/fixtures/replay/, written by make_golden.py) replay as
they were pinned: each decision of each recorded run is made again by the agent it names."""

from __future__ import annotations

from pathlib import Path

import pytest
from support_agents import POLICY

from contextos import Runtime
from contextos.evidence import ReplayPacket

ROOT = Path(__file__).resolve().parents[2]
PACKETS = sorted((ROOT / "tests" / "fixtures" / "replay").glob("*.json"))


def load(path: Path) -> ReplayPacket:
    return ReplayPacket.from_json(path.read_bytes())


def test_there_are_golden_packets() -> None:
    assert len(PACKETS) >= 3


@pytest.mark.parametrize("path", PACKETS, ids=lambda p: p.stem)
async def test_a_golden_packet_replays_as_pinned(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # packets name their agents by path from the repository's root
    monkeypatch.setenv("EVIDENCE_LEDGER", str(tmp_path / "ledger.jsonl"))
    packet = load(path)
    governed = any(e.event["type"] == "context_bound" for e in packet.events)
    async with Runtime(str(tmp_path / "r.db"), policy=POLICY if governed else None) as rt:
        report = await rt.replay(packet)
    assert report.status == packet.latest_result.status == "replay_equal", report.text()
    assert not (tmp_path / "ledger.jsonl").exists()  # no tool wrote anything
