"""How much of a run's content its traces carry: the capture modes.

- `metadata` (the default): no content at all; ids, names, numbers, statuses.
- `redacted`: the content, through the PII layer (the same detectors and strategies the
  `PiiRedaction` middleware applies before the model sees anything).
- `hashes`: a sha256 of each piece of content and the event it came from, never the text:
  enough to match a trace against the log or a DecisionRecord, nothing to leak.
- `full`: the content as the model saw it. A run whose model calls went through a PII layer
  records the user's input as given, so its content goes through the PII layer again: a full
  trace never exports what that layer kept from the model. Any other run's content is exported
  as recorded, so it is for trusted collectors only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from contextos import events as ev
from contextos.errors import ConfigError

PII_LAYER = "pii"
"""The name the PII layer records in a model call's stack (and as the layer that stopped a run)."""

CAPTURE_ENV = "CONTEXTOS_OTEL_CAPTURE_CONTENT"
"""A capture mode, or true (full) / false (metadata)."""


class Redactor(Protocol):
    """The PII layer as a trace sees it (`contextos.middleware.PiiRedaction` is one)."""

    def redact_text(self, text: str) -> str: ...


class CaptureMode(StrEnum):
    METADATA = "metadata"
    REDACTED = "redacted"
    HASHES = "hashes"
    FULL = "full"


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def capture_mode(value: CaptureMode | str | bool | None) -> CaptureMode:
    """The mode `value` names: a mode, True (full), False (metadata), or None (the env)."""
    if isinstance(value, bool):
        return CaptureMode.FULL if value else CaptureMode.METADATA
    if value is None:
        value = os.environ.get(CAPTURE_ENV, "")
    text = value.strip().lower()
    if text in _TRUE:
        return CaptureMode.FULL
    if text in _FALSE:
        return CaptureMode.METADATA
    try:
        return CaptureMode(text)
    except ValueError:
        modes = ", ".join(m.value for m in CaptureMode)
        raise ConfigError(f"unknown trace capture mode {value!r}: use one of {modes}") from None


@dataclass(frozen=True, slots=True)
class Capture:
    """A capture mode, with the PII layer that `redacted` (and `full`, for a run the PII layer
    guarded) goes through."""

    mode: CaptureMode = CaptureMode.METADATA
    pii: Redactor | None = None
    guarded: bool = False
    """The run's model saw its content through a PII layer: `full` shows it that way too."""

    @classmethod
    def of(cls, value: CaptureMode | str | bool | None, pii: Redactor | None = None) -> Capture:
        mode = capture_mode(value)
        if mode is CaptureMode.REDACTED and pii is None:
            raise ConfigError(
                "redacted traces go through the PII layer: pass pii=PiiRedaction() "
                "(contextos.middleware), or read the trace with Runtime.trace"
            )
        return cls(mode, pii)

    def for_run(self, events: Sequence[ev.Event]) -> Capture:
        """This capture for one run's events: `full` of a run the PII layer guarded goes
        through the PII layer, so it exports nothing that layer kept from the model."""
        if self.mode is not CaptureMode.FULL or self.guarded or not guarded(events):
            return self
        if self.pii is None:
            raise ConfigError(
                f"run {events[0].run_id} went through the PII layer, and a full trace shows its "
                "content as the model saw it: pass pii=PiiRedaction() (contextos.middleware), "
                "or read the trace with Runtime.trace"
            )
        return replace(self, guarded=True)

    @property
    def content(self) -> bool:
        """Whether spans carry content attributes at all."""
        return self.mode is not CaptureMode.METADATA

    def text(self, value: str) -> str:
        """A piece of content as this mode exports it."""
        if self.mode is CaptureMode.FULL and not self.guarded:
            return value
        if self.mode is not CaptureMode.HASHES and self.pii is not None:
            return self.pii.redact_text(value)
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()

    def lineage(self, seq: int) -> dict[str, Any]:
        """What a part says about where it came from (the event's seq, in `hashes` mode)."""
        return {"seq": seq} if self.mode is CaptureMode.HASHES else {}


def guarded(events: Sequence[ev.Event]) -> bool:
    """Whether a PII layer stood between the run's content and its model: a model call's
    recorded stack names it, or it stopped the run before any call."""
    for e in events:
        if isinstance(e, ev.ModelResponded) and PII_LAYER in e.context.get("stack", ()):
            return True
        if isinstance(e, ev.RunFailed | ev.RunEnding) and e.error.get("layer") == PII_LAYER:
            return True
    return False


__all__ = [
    "CAPTURE_ENV",
    "PII_LAYER",
    "Capture",
    "CaptureMode",
    "Redactor",
    "capture_mode",
    "guarded",
]
