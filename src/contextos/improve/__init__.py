"""The governed improvement loop: findings, proposals, candidates and release decisions.

Findings come from the log (a job that is itself a run); proposals name the rung of the
promotion ladder that should own a correction (drafted by rules, or worded by a model and
checked); a candidate is an exact change to an agent with a new identity; a release needs
replay evidence with no regression and a person's approval bound to both hashes, and is a
recorded decision, like a rollback; the runtime runs what the latest decision says (a canary:
for a share of new runs, judged on the criteria it names, and watched by hand or by a
scheduled job). Nothing here changes what an agent runs any other way.
"""

from contextos.improve.canary import METRICS, CanaryVerdict, Criterion, Judged
from contextos.improve.candidates import apply
from contextos.improve.job import FindingsRequest, Review, findings_job
from contextos.improve.records import (
    Candidate,
    Case,
    Change,
    Decision,
    Evidence,
    Finding,
    FindingKind,
    Impact,
    Layer,
    Proposal,
    ReleaseReport,
    RootCause,
)
from contextos.improve.release import RELEASER, Decided
from contextos.improve.service import Improvements
from contextos.improve.watching import Watched, WatchRequest, canary_watch

__all__ = [
    "METRICS",
    "RELEASER",
    "CanaryVerdict",
    "Candidate",
    "Case",
    "Change",
    "Criterion",
    "Decided",
    "Decision",
    "Evidence",
    "Finding",
    "FindingKind",
    "FindingsRequest",
    "Impact",
    "Improvements",
    "Judged",
    "Layer",
    "Proposal",
    "ReleaseReport",
    "Review",
    "RootCause",
    "WatchRequest",
    "Watched",
    "apply",
    "canary_watch",
    "findings_job",
]
