"""ReplayPackets: a recorded run pinned for replay, as one JSON document.

A packet holds the run's whole log (each event with its schema version), so it replays on a
machine that never saw the run's store; its hashes (the tool transcript chain, the decisions,
the DecisionRecord) are checked against that log when the packet is accepted, so a packet whose
events were edited is refused rather than replayed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from contextos import events as ev
from contextos.errors import RecordInvalid
from contextos.evidence.canonical import Expected, LatestResult, LoggedEvent, ReplayPacket
from contextos.evidence.decisions import trail
from contextos.evidence.record import build_record, sha, trace_hex
from contextos.state import fold


def transcript_hash(events: Sequence[ev.Event]) -> str:
    """A hash chain over the run's tool results, in order: each link covers the one before."""
    link = ""
    for e in events:
        if isinstance(e, ev.ToolCompleted):
            entry = json.dumps(
                [link, e.call_id, e.name, sha(e.output), e.is_error, e.error_code],
                separators=(",", ":"),
            )
            link = hashlib.sha256(entry.encode()).hexdigest()
    return link


def make_packet(events: Sequence[ev.Event], *, agent_ref: str | None = None) -> ReplayPacket:
    """The packet of a recorded run (`agent_ref`: the agent to replay by default)."""
    record = build_record(events)
    created = events[0]
    assert isinstance(created, ev.RunCreated)
    state = fold(list(events))
    first = next((e for e in events if isinstance(e, ev.ModelResponded)), None)
    return ReplayPacket(
        replay_packet_id="rpk_" + sha(f"{created.run_id}/{record.record_hash}")[:24],
        trace_id=trace_hex(created.correlation_id or created.run_id),
        source_ref=created.run_id,
        agent_ref=agent_ref or created.agent_ref,
        context_pack_ref=f"{created.run_id}#{first.seq}" if first is not None else None,
        compiled_context_hash=first.context_hash if first is not None else None,
        tool_transcript_chain_hash=transcript_hash(events),
        expected=Expected(
            status=state.status.value,
            failure_reason=state.failure_reason.value if state.failure_reason else None,
            output_sha256=sha(state.output) if state.output is not None else None,
            decisions_sha256=trail(events).digest(),
            record_hash=record.record_hash,
        ),
        latest_result=LatestResult(),
        events=[
            LoggedEvent(schema_version=type(e).SCHEMA_VERSION, event=json.loads(ev.encode(e)))
            for e in events
        ],
    )


def packet_events(packet: ReplayPacket) -> list[ev.Event]:
    """The recorded run's log, decoded and checked against the packet's hashes."""
    out: list[ev.Event] = []
    for logged in packet.events:
        data = logged.event
        out.append(
            ev.decode(
                packet.source_ref,
                int(data.get("seq", 0)),
                str(data.get("type", "")),
                logged.schema_version,
                json.dumps(data),
            )
        )
    if not out:
        raise RecordInvalid(f"replay packet {packet.replay_packet_id} holds no events")
    checks = {
        "tool transcript": (transcript_hash(out), packet.tool_transcript_chain_hash),
        "decisions": (trail(out).digest(), packet.expected.decisions_sha256),
        "decision record": (build_record(out).record_hash, packet.expected.record_hash),
    }
    for what, (found, pinned) in checks.items():
        if found != pinned:
            raise RecordInvalid(
                f"replay packet {packet.replay_packet_id}: its events do not give the {what} "
                "hash it pins (the events were changed); it was not replayed",
                packet=packet.replay_packet_id,
            )
    return out


__all__ = ["make_packet", "packet_events", "transcript_hash"]
