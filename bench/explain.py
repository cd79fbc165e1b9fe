# ruff: noqa: RUF001
"""The prose of docs/benchmarks.md that reads the figures: each explanation is worded from the
figures of the run that writes the page, and given only when those figures call for it (a
reason why ContextOS is slower appears only when it is). Pure functions of numbers, so that
what the page says can be checked without running the benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.harness import ms, sec, size

GUARD_SITES = ("context/compiled.py", "middleware/pii.py", "middleware/sanitize.py", "untrusted.py")
"""Where the history index and the content guards keep what they made of each message (the
sanitizer's text is made in `untrusted.py`)."""


def recovery(turns: int, events: int, resume_ms: float, langgraph_resume_ms: float) -> str:
    """Why resuming a long run takes longer than LangGraph's, when it does."""

    if resume_ms <= langgraph_resume_ms:
        return ""
    return (
        "**Why resuming is slower than LangGraph's.** "
        f"Resuming takes {ms(resume_ms)} against LangGraph's {ms(langgraph_resume_ms)}: "
        f"the {turns:,}-turn run's history weighs on its one last model call. The call "
        "rebuilds the history index (each message's token estimate, and the hash of each "
        "message of the rendered prompt, to check that it begins with the prompt the last "
        "driver recorded before recording only what is new), where LangGraph hands its "
        "checkpointed messages to the model as they are; and a fresh process builds the "
        "encoders of the events it writes on first use. The run's decision record (its "
        f"{events:,} events read and decoded again, then built, hashed and encoded) is out "
        "of the way: it is begun once the run's lease is given back and its result handed "
        "over."
    )


def concurrency(runs: int, calls: int, wall_s: float, cpu_s: float, ideal_s: float) -> str:
    """Why many concurrent runs on one worker take more than half again the ideal, when they do."""

    if wall_s <= 1.5 * ideal_s:
        return ""
    steps = runs * calls
    return (
        f"**Why {runs} concurrent runs take {wall_s / ideal_s:.2f}× the ideal.** The process "
        f"used {sec(cpu_s)} of CPU in the {sec(wall_s)} the runs took: {ms(cpu_s / steps * 1e3)} "
        f"for each of the {steps:,} model calls with the tool call and the commits around it. "
        "One event loop drives every run, on one core, so the model calls' waits overlap one "
        "another but never the loop's own work, which no wait hides; for the other "
        f"{sec(max(wall_s - cpu_s, 0.0))} it did not run: it waited on the model calls with "
        "nothing else to do, on the disk's fsyncs, or for a core the machine gave to other "
        "work. Within 1.5× of the "
        f"{sec(ideal_s)} ideal "
        f"takes well under {ms(0.5 * ideal_s / steps * 1e3)} of CPU per call: the CPU per turn "
        "of table 1 is the figure to bring down."
    )


def fanout(children: int, per_child: float, langgraph_per_child: float) -> str:
    """Why a child run stores more than a tenth of LangGraph's child, when it does."""

    if per_child * 10 <= langgraph_per_child:
        return ""
    return (
        f"**Why the fan-out's storage is not a tenth of LangGraph's.** A ContextOS child "
        f"takes {size(per_child)} against LangGraph's {size(langgraph_per_child)} "
        f"({size(per_child * children)} for the run). Each child is a full run with its own "
        "log (its creation, its delegation contract, its start, the model's answer with the "
        "lineage of the context it saw, its output artifact, its end) and its output's blob, "
        "and is recorded in its parent's log as well (its contract, its result, and the hash "
        "of its decision record, which the parent's log vouches for instead of the child "
        "storing one), where LangGraph keeps checkpoints of the child's messages. A tenth "
        "of LangGraph's would be "
        f"{size(langgraph_per_child / 10)} a child: it would take one-turn children kept in "
        "their parent's log instead of runs of their own, which gives up what makes a child "
        "resumable and evidenced on its own."
    )


def fanout_time(children: int, cpu: dict[str, float], wall: dict[str, float], events: float) -> str:
    """Why a fan-out child takes more than a fifth of LangGraph's time, when it does (per
    child, in ms: `cpu` and `wall` by system)."""

    ours, theirs = wall["contextos"], wall["langgraph"]
    if ours * 5 <= theirs:
        return ""
    target = theirs / 5
    return (
        "**Why the fan-out's time is not a fifth of LangGraph's.** A ContextOS child takes "
        f"{ms(cpu['contextos'])} of CPU in its {ms(ours)} of wall time, a LangGraph child "
        f"{ms(cpu['langgraph'])} in {ms(theirs)}. A ContextOS child is a run of its own, "
        f"{events:.0f} events in all: created under its contract, taken under a lease, its "
        "model call recorded with the lineage of what it saw, its output stored, its end "
        "recorded, and its result and its record's hash taken into its parent's log, each "
        "step a commit of the kind table 1 measures. A fifth of LangGraph's time would be "
        f"{ms(target)} a child"
        + (", less than the CPU a child takes now" if target < cpu["contextos"] else "")
        + ": the CPU per step of table 1 is what brings it there, or one-turn children kept "
        "in their parent's log."
    )


def guard_sites(sites: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """The allocation sites (`file:line`, kB per 1,000 turns) of the history index and the
    content guards."""
    return [(where, kb) for where, kb in sites if where.startswith(GUARD_SITES)]


def long_run(sites: Sequence[tuple[str, float]], per_turn_kb: float) -> str:
    """What of a long run's growth the guards and the history index hold, when they do."""
    theirs = guard_sites(sites)
    if not theirs:
        return ""
    files = dict.fromkeys(where.split(":")[0] for where, _ in theirs)
    named = ", ".join(f"`{f}`" for f in files)
    kb = sum(kb for _, kb in theirs)
    return (
        "The platform guards are on in this run (the default). The history index of the "
        "context compiler and the content guards (PII redaction, the sanitizer) keep what "
        "they made of each message, so that a model call rewrites only the messages it adds "
        "instead of walking the whole history: less CPU per turn for more memory per turn. "
        f"Their sites above (in {named}) hold {kb:,.0f} kB per 1,000 turns of the "
        f"{per_turn_kb:,.0f} kB the process grows."
    )


def _statements_us(hotspots: Sequence[Mapping[str, Any]], per_turn_us: float) -> float:
    """µs per turn of the store's SQLite statements among the hot spots."""
    return sum(
        h["share"] * per_turn_us
        for h in hotspots
        if h["function"].startswith("Connection.") and "store/" in h["where"]
    )


def _readback_us(hotspots: Sequence[Mapping[str, Any]], per_turn_us: float) -> float:
    """µs per turn of pydantic's JSON validation among the hot spots."""
    return sum(
        h["share"] * per_turn_us for h in hotspots if h["function"].endswith("validate_json")
    )


def misses(facts: Mapping[str, Any]) -> str:
    """The closing section: what misses its target on the bare turn and on loading, why, and
    what would fix it. `facts` holds what the sections of this run noted (absent when a
    section did not run)."""
    bullets = []
    if facts.get("per_turn_missed"):
        bullets.append(_per_turn(facts))
    if "load_ms" in facts:
        bullets.append(_loading(facts))
    lead = (
        "The sections of the recovery, the concurrency, the governed turn, the scale-out, the "
        "long run's memory and the fan-out say next to their tables why a target of theirs "
        "is missed."
    )
    if bullets:
        lead += " The profile table above says where ContextOS's time goes in this run."
    return (
        "\n\n".join(
            ["## What misses its target, why, and what would fix it", lead, "\n".join(bullets)]
        ).rstrip()
        + "\n"
    )


def _per_turn(facts: Mapping[str, Any]) -> str:
    hot = facts.get("hotspots") or []
    per_turn = facts.get("profile_per_turn_us")
    where = ""
    if hot and per_turn:
        where = (
            f" (the function table of the bare turn: {per_turn:,.0f} µs, of which the store's "
            f"SQLite statements take about {_statements_us(hot, per_turn):,.0f} µs and "
            "pydantic's JSON validation, reading each event back before it is written so that "
            f"nothing unreadable is ever stored, about {_readback_us(hot, per_turn):,.0f} µs)"
        )
    return (
        "- **Per-turn overhead: 10× less than LangGraph, within 1.5× of the floor, 250 µs of "
        "CPU.** Table 1's agent is bare (it opts out of the platform guards, which are on by "
        "default); the governed table measures them. With the guards on, each tool result is "
        "scanned for PII and secrets and spotlighted, and the model's tool-call arguments are "
        "scanned too; each guard rewrites only the history entries a call adds, keeping its "
        "output in an index of its own with running totals, and PII redaction scans a text "
        "once per run and rules out text without the characters a rule needs (a digit, an @, "
        "two colons, a secret's literal prefix) with one substring search. What is left is "
        "Python CPU spread over every part of a turn, with no single hot spot"
        + where
        + ": each event encoded with its type's pydantic serializer; two SQLite transactions "
        "past their guard triggers; the event loop's own work (each step awaits its commit, "
        "and a tool call runs in a task of its own under its time limit); the cyclic garbage "
        "collector, whose passes grow with the heap; and, with the guards on, copies of the "
        "immutable context records as each layer rewrites them (`dataclasses.replace`) and "
        "the sanitizer's injection patterns, each searched for in a tool result that holds "
        "one of the words every match of it holds. What would close "
        "more of the gap: layers that rewrite a context in place of copying it per layer, fewer "
        "event-loop hops "
        "per step (a tool that returns without waiting need not get a task of its own), and "
        "the run summary derived from the log on read instead of moved per commit."
    )


def _loading(facts: Mapping[str, Any]) -> str:
    turns, load, slowest = facts["load_turns"], facts["load_ms"], facts["load_max_ms"]
    head = f"- **Loading a {turns:,}-turn run in under 10 ms** "
    if load >= 10:
        head += f"is missed: {load:.1f} ms (the median of the rounds)."
    elif slowest >= 10:
        head += (
            f"is met with little room: {load:.1f} ms, but the slowest round took "
            f"{slowest:.1f} ms (single loads move with the machine's load)."
        )
    else:
        head += f"is met: {load:.1f} ms, the slowest round {slowest:.1f} ms."
    return (
        head + " A load reads one snapshot and decodes it, and the run's messages are most of "
        "it: building them as objects is most of a load's time. The rest is folding the events "
        "after the snapshot, and building pydantic's reader of each event type the process "
        "meets there for the first time (the records several types hold, such as a message, "
        "are built once and shared). What would make it steadily "
        "faster: messages decoded only when a model call needs them (most readers of a state "
        "want its status, usage and ledger), or a binary encoding of the snapshot."
    )


NOTES = """## Reading the figures

- **A ContextOS turn** is two commits and one fsync. The model's answer (with the record of
  the context it saw) is committed before its tool runs, without waiting for the disk
  (`synchronous=NORMAL` for that one transaction); the tool's result is committed with a full
  fsync, which flushes the WAL up to and including the answer. Nothing leaves the process in
  between, so a power loss can only cost the answer, which is then asked for again. The
  tmpfs row of table 1 takes the fsync away and leaves the runtime's CPU. A governed turn
  adds a third commit, the policy decision, recorded before the tool runs and, like the
  answer, flushed by the result's fsync: still one fsync a turn.
- **A model call reads the history incrementally.** Each driver keeps the run's messages as
  context entries with running token totals and a running hash, so a call adds only the
  messages that are new (table 3's last row compares the first and the last 50 turns of the
  longest run). The content guards do the same: each keeps what it made of every message in
  an index of its own, so a call rewrites (redacts, spotlights) only the messages it adds.
- **Loading reads a snapshot.** A store keeps the folded state of a long run as a snapshot
  (rewritten every 128 events, or a sixteenth of the run, and when the run stops); a load
  decodes it and folds only the events after it. The snapshot is a cache: one of another code
  version, another run or a later seq is ignored and the whole log is folded.
- **A LangGraph turn** writes a checkpoint holding every channel that changed (for an agent,
  the whole message list) plus pending writes: about six rows in four commits, each
  re-serialising the history. Hence its storage grows nearly with the square of the turns (its k in
  table 3) and its time per turn rises as a thread grows.
- **DBOS** records each step's output in its system database; on SQLite it keeps SQLite's
  default rollback journal, which costs several fsyncs per step. DBOS is built for
  PostgreSQL in production, so its SQLite figures are shown for completeness only.
- **Concurrency.** ContextOS drives all runs of a process on one event loop. Every write made
  in the same loop iteration (appends, queue and lease updates of all runs) shares one
  transaction and one fsync, and each caller hears back only after that COMMIT.
- **Noise.** The disk rows move with the neighbours' fsyncs (the raw floor itself varies
  several-fold between rounds on this shared VM); the tmpfs rows and the per-round ratios are
  the steadier figures.
"""
