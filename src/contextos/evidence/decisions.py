"""The decisions a run made, as comparable lines, and a readable diff of two runs' decisions.

A run's trail is what an agent version is judged on in a replay: the tool calls its model
chose (with their arguments), policy's decision on each, people's answers, the evaluators'
verdicts, and how it ended. Tool results and people's answers are inputs (a replay serves the
recorded ones); call ids, timings and costs are not decisions, so they are left out.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from contextos import events as ev
from contextos.evidence.canonical import canonical_hash
from contextos.state import fold

KINDS = ("tool_calls", "policy", "approvals", "verification", "output")
"""What a trail holds, in the order a diff shows it."""

_TITLES = {
    "tool_calls": "tool calls chosen",
    "policy": "policy decisions",
    "approvals": "people's answers",
    "verification": "verification",
    "output": "final output",
}


def arguments(raw: str) -> str:
    """Tool call arguments as canonical JSON (key order and spacing never differ)."""
    try:
        return json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return raw


@dataclass(frozen=True, kw_only=True, slots=True)
class Trail:
    """A run's decisions, one line each, by kind."""

    tool_calls: tuple[str, ...]
    """`tool {arguments}` for every call the model chose, in order."""
    policy: tuple[str, ...]
    """`tool {arguments}: decision [rules]` for every policy decision."""
    approvals: tuple[str, ...]
    """`tool: approved by WHO` (denied, answered, expired) for every answered question."""
    verification: tuple[str, ...]
    """`evaluator: passed` or `evaluator: failed: gaps` for every verdict."""
    output: tuple[str, ...]
    """How the run stands: `completed: OUTPUT`, `failed (reason): message`, or its status."""

    def lines(self, kind: str) -> tuple[str, ...]:
        lines: tuple[str, ...] = getattr(self, kind)
        return lines

    def digest(self) -> str:
        """Hash of the whole trail (a replay packet pins it)."""
        return canonical_hash({k: list(self.lines(k)) for k in KINDS})


def trail(events: Sequence[ev.Event]) -> Trail:
    """The decisions recorded in a run's log."""
    calls: dict[str, str] = {}  # call id -> `tool {args}`
    asked: dict[str, str] = {}  # interrupt id -> tool
    tool_calls: list[str] = []
    policy: list[str] = []
    approvals: list[str] = []
    verification: list[str] = []
    for e in events:
        match e:
            case ev.ModelResponded():
                for c in e.message.tool_calls:
                    calls[c.id] = f"{c.name} {arguments(c.arguments)}"
                    tool_calls.append(calls[c.id])
            case ev.PolicyDecided():
                # ids that name the run (an approval's) differ between a run and its replay
                named = [r.replace(e.run_id, "<run>") for r in e.rule_ids]
                rules = f" [{', '.join(named)}]" if named else ""
                policy.append(f"{calls.get(e.call_id, e.tool)}: {e.decision}{rules}")
            case ev.InterruptRaised():
                asked[e.interrupt_id] = calls.get(e.call_id or "", e.kind).split(" ", 1)[0]
            case ev.ApprovalGranted():
                approvals.append(f"{asked.get(e.interrupt_id, '?')}: approved by {e.approver}")
            case ev.ApprovalDenied():
                approvals.append(f"{asked.get(e.interrupt_id, '?')}: denied by {e.approver}")
            case ev.InterruptAnswered():
                value = json.dumps(e.value, sort_keys=True)
                approvals.append(f"{asked.get(e.interrupt_id, '?')}: answered {value}")
            case ev.InterruptExpired():
                approvals.append(f"{asked.get(e.interrupt_id, '?')}: expired ({e.on_expiry})")
            case ev.EvaluationRecorded():
                verdict = "passed" if e.passed else "failed: " + "; ".join(e.gaps)
                verification.append(f"{e.evaluator}: {verdict}")
            case _:
                pass
    return Trail(
        tool_calls=tuple(tool_calls),
        policy=tuple(policy),
        approvals=tuple(approvals),
        verification=tuple(verification),
        output=(_ending(events),),
    )


def _ending(events: Sequence[ev.Event]) -> str:
    state = fold(list(events))
    if state.output is not None:
        shown = (
            json.dumps(state.structured_output, sort_keys=True)
            if state.structured_output is not None
            else state.output
        )
        return f"{state.status}: {shown}"
    if state.failure_reason is not None:
        return f"{state.status} ({state.failure_reason}): {state.failure_message or ''}"
    return str(state.status)


@dataclass(frozen=True, kw_only=True, slots=True)
class Difference:
    """How one kind of decision differs between a recorded run and its replay."""

    kind: str
    """tool_calls, policy, approvals, verification or output."""
    recorded: tuple[str, ...]
    """The recorded run's lines of that kind."""
    replayed: tuple[str, ...]
    """The replay's."""

    def render(self) -> str:
        """A readable diff: `=` kept, `-` only in the recorded run, `+` only in the replay."""
        out = [f"{_TITLES[self.kind]}:"]
        matcher = difflib.SequenceMatcher(a=self.recorded, b=self.replayed, autojunk=False)
        for op, a0, a1, b0, b1 in matcher.get_opcodes():
            if op == "equal":
                out += [f"  = {line}" for line in self.recorded[a0:a1]]
                continue
            out += [f"  - {line}" for line in self.recorded[a0:a1]]
            out += [f"  + {line}" for line in self.replayed[b0:b1]]
        return "\n".join(out)


def compare(recorded: Trail, replayed: Trail) -> list[Difference]:
    """Every kind of decision that differs, in the order of KINDS (empty: the same)."""
    return [
        Difference(kind=k, recorded=recorded.lines(k), replayed=replayed.lines(k))
        for k in KINDS
        if recorded.lines(k) != replayed.lines(k)
    ]


__all__ = ["KINDS", "Difference", "Trail", "arguments", "compare", "trail"]
