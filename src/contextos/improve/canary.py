"""Canaries: a release that serves a fraction of new runs, watched on those runs' logs.

Which runs are in the canary is decided by a hash of a key the caller gives (a run's
idempotency key, a user, a ticket): the same key always lands on the same side. The watch
reads the canary's runs since its release (those whose agent hash is the candidate's) and
counts the failed ones (ended failed, or showing any pattern the findings job looks for);
over the limit, it rolls the release back, recorded like any rollback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from contextos import events as ev
from contextos.improve.findings import observe
from contextos.releases import in_canary
from contextos.state import fold


def failed(events: Sequence[ev.Event]) -> bool:
    """A canary run counts as failed when it ended failed or its log shows a pattern."""
    return fold(list(events)).status.value == "failed" or bool(observe(events).observations)


@dataclass(frozen=True, kw_only=True, slots=True)
class CanaryVerdict:
    """What one look at a canary found, and what it did."""

    agent: str
    candidate_id: str
    runs: int
    """Canary runs finished since the release."""
    failures: int
    limit: float
    """The failure rate over which the canary is rolled back."""
    action: Literal["wait", "healthy", "rolled_back"]
    """`wait`: too few runs to judge yet."""

    @property
    def rate(self) -> float:
        return self.failures / self.runs if self.runs else 0.0

    def line(self) -> str:
        return (
            f"canary {self.candidate_id} of {self.agent}: {self.failures} of {self.runs} runs "
            f"failed ({self.rate:.0%}, limit {self.limit:.0%}) -> {self.action}"
        )


__all__ = ["CanaryVerdict", "failed", "in_canary"]
