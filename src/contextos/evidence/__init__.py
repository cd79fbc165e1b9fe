"""Evidence: what a run decided and produced, derived from its log and never from a model.

Decision records, artifacts' lineage, the canonical records (`canonical`), replay against a
changed agent and fork from a step.
"""

from contextos.evidence.canonical import (
    CompiledContext,
    DecisionRecord,
    ReplayPacket,
    RunContext,
    ToolEnvelope,
)
from contextos.evidence.decisions import Difference, Trail, trail
from contextos.evidence.emit import authority_of, compiled_contexts, run_context, tool_envelopes
from contextos.evidence.packet import make_packet, packet_events
from contextos.evidence.record import Receipt, build_record, materialise, receipts, record_data
from contextos.evidence.replay import ReplayReport, replay

__all__ = [
    "CompiledContext",
    "DecisionRecord",
    "Difference",
    "Receipt",
    "ReplayPacket",
    "ReplayReport",
    "RunContext",
    "ToolEnvelope",
    "Trail",
    "authority_of",
    "build_record",
    "compiled_contexts",
    "make_packet",
    "materialise",
    "record_data",
    "packet_events",
    "receipts",
    "replay",
    "run_context",
    "tool_envelopes",
    "trail",
]
