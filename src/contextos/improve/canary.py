"""Canaries: a release that serves a fraction of new runs, judged on those runs' logs.

The runtime puts each new run of the agent on one side by a hash of its id and records which
(see `contextos.releases`). The watch reads both arms since the release, the canary's runs and
the stable runs it did not take, measures each metric the release names, and judges it against
its threshold, either on the canary's own value or on how much worse it is than the stable
arm's. When any criterion fails, it rolls the release back, recorded like any rollback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, model_validator

from contextos import events as ev
from contextos.errors import ConfigError
from contextos.improve.findings import observe
from contextos.runs import RunStatus
from contextos.state import fold

Metric = Literal[
    "failure_rate",
    "tool_error_rate",
    "verification_pass_rate",
    "cost_per_run",
    "turns_per_run",
    "p95_duration_s",
]
METRICS: dict[str, str] = {
    "failure_rate": "share of runs that failed or showed a pattern the findings job looks for",
    "tool_error_rate": "share of tool calls that failed",
    "verification_pass_rate": "share of answers the verifier accepted",
    "cost_per_run": "mean cost of a run, in USD",
    "turns_per_run": "mean model calls of a run",
    "p95_duration_s": "95th percentile of a run's duration, created to ended, in seconds",
}
_TEXT = re.compile(r"\s*(\w+)\s*(-\s*stable\s*)?(<=|>=)\s*(-?\d+(?:\.\d+)?)\s*")


class Criterion(BaseModel):
    """One metric a canary is judged on, and its threshold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Metric
    at_most: float | None = None
    at_least: float | None = None
    over_stable: bool = False
    """The threshold applies to the canary's value minus the stable arm's."""

    @model_validator(mode="after")
    def _one_bound(self) -> Self:
        if (self.at_most is None) == (self.at_least is None):
            raise ValueError("a criterion has one bound: at_most or at_least")
        return self

    @classmethod
    def parse(cls, text: str) -> Criterion:
        """`tool_error_rate <= 0.1`, `verification_pass_rate >= 0.9`,
        `cost_per_run - stable <= 0.002`."""
        found = _TEXT.fullmatch(text)
        if found is None or found.group(1) not in METRICS:
            raise ConfigError(
                f"cannot read the criterion {text!r}: write METRIC <= NUMBER, METRIC >= NUMBER "
                f"or METRIC - stable <= NUMBER, with METRIC one of {', '.join(METRICS)}"
            )
        metric, over, op, bound = found.groups()
        limit = {"at_most" if op == "<=" else "at_least": float(bound)}
        return cls.model_validate({"metric": metric, "over_stable": bool(over), **limit})

    def text(self) -> str:
        op, bound = ("<=", self.at_most) if self.at_most is not None else (">=", self.at_least)
        return f"{self.metric}{' - stable' if self.over_stable else ''} {op} {bound:g}"

    def holds(self, value: float) -> bool:
        if self.at_most is not None:
            return value <= self.at_most
        return self.at_least is None or value >= self.at_least


def failed(events: Sequence[ev.Event]) -> bool:
    """A run counts as failed when it ended failed or its log shows a pattern."""
    return fold(list(events)).status is RunStatus.FAILED or bool(observe(events).observations)


def measure(metric: Metric, runs: Sequence[Sequence[ev.Event]]) -> float | None:
    """The metric over an arm's runs (None: nothing to measure it on)."""
    if not runs:
        return None
    match metric:
        case "failure_rate":
            return sum(failed(r) for r in runs) / len(runs)
        case "tool_error_rate":
            calls = [e for r in runs for e in r if isinstance(e, ev.ToolCompleted)]
            return sum(c.is_error for c in calls) / len(calls) if calls else None
        case "verification_pass_rate":
            passed = sum(isinstance(e, ev.RunCompleted | ev.RunAnswered) for r in runs for e in r)
            rejected = sum(isinstance(e, ev.VerificationFailed) for r in runs for e in r)
            return passed / (passed + rejected) if passed + rejected else None
        case "cost_per_run":
            return sum(fold(list(r)).usage.cost_usd for r in runs) / len(runs)
        case "turns_per_run":
            return sum(fold(list(r)).turns for r in runs) / len(runs)
        case "p95_duration_s":
            return percentile([duration_s(r) for r in runs], 0.95)


def duration_s(events: Sequence[ev.Event]) -> float:
    """How long a finished run took, as its log records it: from its first event (created) to
    its last (ended), queueing and waiting for people included, as its caller saw it."""
    return (events[-1].occurred_at - events[0].occurred_at).total_seconds()


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value at least `share` of them are at most."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Judged:
    """One criterion, measured on both arms."""

    criterion: Criterion
    canary: float | None
    stable: float | None
    """The arm of the runs the canary did not take."""

    @property
    def value(self) -> float | None:
        """What the threshold is held against (None: not measurable yet)."""
        if not self.criterion.over_stable:
            return self.canary
        if self.canary is None or self.stable is None:
            return None
        return self.canary - self.stable

    @property
    def passed(self) -> bool:
        """Unmeasurable counts as passing: nothing shows it failing."""
        return self.value is None or self.criterion.holds(self.value)

    def line(self) -> str:
        def shown(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.4g}"

        verdict = "ok" if self.passed else "FAILED"
        return (
            f"{self.criterion.text()}: canary {shown(self.canary)}, stable "
            f"{shown(self.stable)} -> {verdict}"
        )


def judge(
    criteria: Sequence[Criterion],
    canary: Sequence[Sequence[ev.Event]],
    stable: Sequence[Sequence[ev.Event]],
) -> tuple[Judged, ...]:
    return tuple(
        Judged(criterion=c, canary=measure(c.metric, canary), stable=measure(c.metric, stable))
        for c in criteria
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CanaryVerdict:
    """What one look at a canary found, and what it did."""

    agent: str
    candidate_id: str
    runs: int
    """Canary runs finished since the release."""
    stable_runs: int
    """Runs of the stable arm finished since the release."""
    judged: tuple[Judged, ...]
    """Each criterion the canary is judged on, measured on both arms."""
    action: Literal["wait", "healthy", "rolled_back"]
    """`wait`: too few runs to judge yet."""

    @property
    def failures(self) -> tuple[Judged, ...]:
        """The criteria that failed."""
        return tuple(j for j in self.judged if not j.passed)

    def line(self) -> str:
        return (
            f"canary {self.candidate_id} of {self.agent}: {self.runs} canary runs, "
            f"{self.stable_runs} stable -> {self.action}"
        )


__all__ = [
    "METRICS",
    "CanaryVerdict",
    "Criterion",
    "Judged",
    "Metric",
    "duration_s",
    "failed",
    "judge",
    "measure",
    "percentile",
]
