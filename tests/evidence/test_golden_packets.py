"""The golden ReplayPackets (tests/fixtures/replay/, written by make_golden.py) replay as
they were pinned: each decision of each recorded run is made again by the agent it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def spoiled(packet: dict[str, Any], how: str) -> dict[str, Any]:
    """The packet with one thing wrong: its version, an event's version, or an event's content."""
    data = json.loads(json.dumps(packet))
    if how == "packet version":
        data["record_type"] = "contextos.replay_packet.v2"
    elif how == "event version":
        data["events"][1]["schema_version"] = 99
    else:
        done = next(e for e in data["events"] if e["event"]["type"] == "tool_completed")
        done["event"]["output"] = "something else"
    return data


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("packet version", "ReplayPacket version 'contextos.replay_packet.v2' is not one this"),
        ("event version", "has schema version 99, this code knows up to 1"),
        ("event content", "its events do not give the tool transcript hash it pins"),
    ],
)
def test_a_spoiled_packet_stops_loudly_and_replays_nothing(
    how: str, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(spoiled(json.loads(PACKETS[0].read_text()), how)))
    store = tmp_path / "r.db"
    out = subprocess.run(
        [sys.executable, "-m", "contextos", "replay", "--packet", str(path), "--store", str(store)],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout
    assert says in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""  # no report: nothing was replayed
