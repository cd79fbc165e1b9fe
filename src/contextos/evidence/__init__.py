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
from contextos.evidence.record import Receipt, build_record, materialise, receipts

__all__ = [
    "CompiledContext",
    "DecisionRecord",
    "Receipt",
    "ReplayPacket",
    "RunContext",
    "ToolEnvelope",
    "build_record",
    "materialise",
    "receipts",
]
