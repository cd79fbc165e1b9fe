"""Middleware: the ordered stack every model call and tool call goes through.

Platform layers, outermost first: budget gate → PII redaction → untrusted-output sanitizer →
compaction → skills → profile; domain layers only after them. Every agent runs under the
budget gate, PII redaction and the sanitizer unless it opts out of one by name, with a reason
(`platform.py`).
"""

from contextos.middleware.base import (
    PLATFORM_LAYERS,
    BaseMiddleware,
    Chain,
    Compacted,
    ContentGuard,
    DailySpend,
    Middleware,
    ModelCall,
    ModelHandler,
    ModelResult,
    RunEnd,
    RunView,
    Services,
    Spend,
    Stop,
    ToolCallInput,
    ToolHandler,
    principal_of,
    stack_identity,
    validate_stack,
)
from contextos.middleware.budget import BudgetGate, StoreDailySpend, daily_spend_of
from contextos.middleware.compaction import Compaction
from contextos.middleware.paths import PathInstructions
from contextos.middleware.pii import Detection, Detector, PiiRedaction, Strategy, custom, detect
from contextos.middleware.profile import Profile
from contextos.middleware.retrieval import Retrieval
from contextos.middleware.sanitize import Sanitizer
from contextos.middleware.skills import Skill, Skills
from contextos.untrusted import spotlight

__all__ = [
    "PLATFORM_LAYERS",
    "BaseMiddleware",
    "BudgetGate",
    "Chain",
    "Compacted",
    "Compaction",
    "ContentGuard",
    "DailySpend",
    "Detection",
    "Detector",
    "Middleware",
    "ModelCall",
    "ModelHandler",
    "ModelResult",
    "PathInstructions",
    "PiiRedaction",
    "Profile",
    "Retrieval",
    "RunEnd",
    "RunView",
    "Sanitizer",
    "Services",
    "Skill",
    "Skills",
    "Spend",
    "StoreDailySpend",
    "Stop",
    "Strategy",
    "ToolCallInput",
    "ToolHandler",
    "custom",
    "detect",
    "daily_spend_of",
    "principal_of",
    "spotlight",
    "stack_identity",
    "validate_stack",
]
