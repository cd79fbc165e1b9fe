# ruff: noqa: RUF001
"""The governed turn: the table-1 workload with the whole platform stack on, against LangGraph
`create_agent` with its PII and summarization middleware.

ContextOS: budget gate (run and daily caps), PII redaction, the untrusted-output sanitizer and
compaction (a scripted summarizer), lineage on every model call (always recorded), a policy
file that decides every tool call (default deny, an explicit allow, a deny rule with a
condition, a rate limit) and a run bound to a principal with scopes, a tool allowlist and a
clearance. LangGraph: `PIIMiddleware` for the three types both detect (e-mail, card, IP; on
input, output and tool results) and `SummarizationMiddleware` with a scripted summarizer, on
`SqliteSaver` with `durability="sync"`. Both compact at the same token thresholds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.common import STAMPS, disk_bytes, median, now, turn_medians
from bench.harness import log, ratios, rounds, size, spread, table, times, us, worker

N = 50
"""Turns per run, as in table 1."""
TRIGGER_TOKENS = 2_000
"""Both systems summarize the history once it passes this many (estimated) tokens ..."""
KEEP_TOKENS = 500
"""... and keep about this many of the latest verbatim."""
EDGE = 10
"""Turns at each end of the run whose median turn shows how a turn's cost grows with the run."""
EMAIL = "jo.bloggs@example.com"
_NOTE = (
    f"Customer {EMAIL} paid with card 4111 1111 1111 1111 from 203.0.113.7; "
    "please confirm the refund of order A-1001 and keep this note on file. "
)
MESSAGE = (_NOTE * 2)[:200]
"""The 200-character text the model sends to `echo`, with an e-mail, a card and an address."""
SUMMARY = "Summary: the customer asked to confirm a refund; each echo returned the note."

POLICY = """\
name = "bench"
version = "1"
default = "deny"
repeat_writes = 0

[[rules]]
id = "echo-allowed"
tools = ["echo"]
decision = "allow"

[[rules]]
id = "no-keys-out"
tools = ["echo"]
decision = "deny"
absolute = true
when = { text = { regex = "BEGIN [A-Z ]*PRIVATE KEY" } }

[[limits]]
id = "echo-rate"
tools = ["echo"]
max_calls = 10000
"""


# -- ContextOS --------------------------------------------------------------------------------


def contextos(db: str, n: int = N, warmup: bool = True) -> dict[str, Any]:
    return asyncio.run(_contextos(Path(db), n, warmup))


def _governed_agent(turns: int) -> Any:
    from bench.agents import Script
    from contextos import Agent, Budget, tool
    from contextos.middleware import BudgetGate, Compaction, PiiRedaction, Sanitizer
    from contextos.testing import call_tool, reply

    @tool(scopes=("notes:echo",), data_classification="confidential")
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    steps = [call_tool("echo", {"text": MESSAGE}) for _ in range(turns)]
    model = Script([*steps, reply("done")], on_turn=lambda _: STAMPS.append(now()), keep_last=True)
    return Agent(
        name="bench-governed",
        model=model,
        instructions="Confirm refunds; keep notes with the echo tool.",
        tools=[echo],
        budget=Budget(max_turns=turns + 1),
        middleware=[
            BudgetGate(run_tokens=10_000_000, max_model_calls=turns + 10, daily_tokens=10**9),
            PiiRedaction(),
            Sanitizer(),
            Compaction(
                trigger_tokens=TRIGGER_TOKENS, keep_tokens=KEEP_TOKENS, summarizer=_Summarizer()
            ),
        ],
    )


class _Summarizer:
    """The scripted summarizer: one fixed summary for every request."""

    name = "scripted-summarizer"

    async def complete(self, request: Any) -> Any:
        from contextos.testing import reply

        return reply(SUMMARY)


def _context() -> Any:
    from contextos import Principal, RunContext

    jo = Principal.user("jo", tenant="acme", scopes=("notes:*", "refunds:read"))
    return RunContext(
        principal=jo, scopes=("notes:echo",), tools=("echo",), clearance="confidential"
    )


async def _contextos(db: Path, n: int, warmup: bool) -> dict[str, Any]:
    from contextos import Runtime

    policy = db.with_name(db.stem + "-policy.toml")
    policy.write_text(POLICY)
    if warmup:  # first-use costs (schema builds, code paths) are not per-turn costs
        warm = db.with_name(db.stem + "-warmup.db")
        async with Runtime(f"sqlite:///{warm}", policy=policy) as rt:
            await rt.run(_governed_agent(3), MESSAGE, context=_context())
    async with Runtime(f"sqlite:///{db}", policy=policy) as rt:
        await rt.runs()  # creates the schema: what an empty store takes on disk
    empty = disk_bytes(db)
    agent = _governed_agent(n)
    STAMPS.clear()
    async with Runtime(f"sqlite:///{db}", policy=policy) as rt:
        started = now()
        result = await rt.run(agent, MESSAGE, context=_context())
        elapsed = now() - started
        assert result.ok, result
        events = await rt.events(result.run_id)
    kinds = [e.type for e in events]
    last = agent.model.last  # type: ignore[union-attr]
    seen = "\n".join(m.content or "" for m in last.messages) + "".join(
        c.arguments for m in last.messages for c in m.tool_calls
    )
    # The stack did its work: the model saw redacted text and a summary.
    assert "REDACTED" in seen, seen[-2000:]
    assert SUMMARY in seen, seen[:2000]
    return {
        "per_turn_us": elapsed / n * 1e6,
        "leaked": seen.count(EMAIL),
        "events": len(events),
        "decisions": kinds.count("policy_decided"),
        "summaries": kinds.count("context_compacted"),
        "bytes": disk_bytes(db),
        "empty_bytes": empty,
        "first_turns_us": turn_medians(STAMPS, EDGE)[0],
        "last_turns_us": turn_medians(STAMPS, EDGE)[1],
    }


# -- LangGraph --------------------------------------------------------------------------------


def langgraph(db: str, n: int = N, warmup: bool = True) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from bench.sys_langgraph import _config, _connect

    path = Path(db)
    if warmup:
        with _connect(path.with_name(path.stem + "-warmup.db")) as wconn:
            agent, _ = _lg_agent(3, SqliteSaver(wconn))
            agent.invoke(_lg_input(), _config(), durability="sync")
    conn = _connect(path)
    SqliteSaver(conn).setup()
    conn.close()
    empty = disk_bytes(path)
    conn = _connect(path)
    agent, seen = _lg_agent(n, SqliteSaver(conn))
    STAMPS.clear()
    started = now()
    out = agent.invoke(_lg_input(), _config(), durability="sync")
    elapsed = now() - started
    rows = conn.execute("SELECT (SELECT COUNT(*) FROM checkpoints), (SELECT COUNT(*) FROM writes)")
    checkpoints, writes = rows.fetchone()
    conn.close()
    assert out["messages"][-1].content == "done", out["messages"][-1]
    content = "\n".join(str(m.content) for m in seen["last"])
    arguments = "\n".join(str(getattr(m, "tool_calls", "")) for m in seen["last"])
    assert EMAIL not in content and "REDACTED" in content, content[-2000:]
    assert SUMMARY in content, content[:2000]
    return {
        "per_turn_us": elapsed / n * 1e6,
        "rows": checkpoints + writes,
        "summaries": seen["summaries"],
        # The PII layers redact message text, not tool-call arguments: count what got through.
        "leaked": arguments.count(EMAIL),
        "bytes": disk_bytes(path),
        "empty_bytes": empty,
        "first_turns_us": turn_medians(STAMPS, EDGE)[0],
        "last_turns_us": turn_medians(STAMPS, EDGE)[1],
    }


def _lg_input() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": MESSAGE}]}


def _lg_agent(turns: int, checkpointer: Any) -> tuple[Any, dict[str, Any]]:
    """The agent, and what its models saw: the last request and the number of summaries."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import PIIMiddleware, SummarizationMiddleware
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    seen: dict[str, Any] = {"calls": 0, "summaries": 0, "last": []}

    class Agent(BaseChatModel):
        """Calls echo `turns` times, then answers; counts its own calls (a summary replaces
        the tool results in its input, so it cannot count those)."""

        @property
        def _llm_type(self) -> str:
            return "bench-governed"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[Any], stop: Any = None, **kw: Any) -> ChatResult:
            STAMPS.append(now())
            seen["calls"] += 1
            seen["last"] = messages
            if seen["calls"] <= turns:
                call = {
                    "name": "echo",
                    "args": {"text": MESSAGE},
                    "id": f"call_{seen['calls']}",
                    "type": "tool_call",
                }
                msg = AIMessage(content="", tool_calls=[call])
            else:
                msg = AIMessage(content="done")
            return ChatResult(generations=[ChatGeneration(message=msg)])

    class Summarizer(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "bench-summarizer"

        def _generate(self, messages: list[Any], stop: Any = None, **kw: Any) -> ChatResult:
            seen["summaries"] += 1
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=SUMMARY))])

    from bench.sys_langgraph import _echo_tool

    pii = {"apply_to_input": True, "apply_to_output": True, "apply_to_tool_results": True}
    agent = create_agent(
        Agent(),
        [_echo_tool()],
        checkpointer=checkpointer,
        middleware=[
            PIIMiddleware("email", **pii),
            PIIMiddleware("credit_card", **pii),
            PIIMiddleware("ip", **pii),
            SummarizationMiddleware(
                Summarizer(), trigger=("tokens", TRIGGER_TOKENS), keep=("tokens", KEEP_TOKENS)
            ),
        ],
    )
    return agent, seen


# -- where the governed turn's time goes ------------------------------------------------------

PARTS = (
    ("PII redaction (middleware/pii.py)", ("/middleware/pii.py",)),
    (
        "untrusted-output sanitizer (middleware/sanitize.py, untrusted.py)",
        ("/middleware/sanitize.py", "/untrusted.py"),
    ),
    ("compaction (middleware/compaction.py)", ("/middleware/compaction.py",)),
    ("budget gate (middleware/budget.py)", ("/middleware/budget.py",)),
    ("policy gate: authority, rules, limits (policy/)", ("/policy/",)),
    ("event store: encode, SQLite, commit (store/, events.py)", ("/store/", "encode", "decode")),
    ("tool path: gateway, effect ledger (tools/)", ("/tools/",)),
    (
        "context, lineage and the rest of the chain (context/, middleware/)",
        ("/context/", "/middleware/"),
    ),
    ("fold (state.py)", ("/state.py",)),
)


def profile(db: str, n: int = N) -> dict[str, Any]:
    """The ContextOS run of `contextos` under pyinstrument: time per part, per turn.

    The profiler slows what it samples, so its shares are applied to the time per turn of
    the same run without it, in the same process.
    """
    from pyinstrument import Profiler

    from bench.profiling import IDLE, split

    profiler = Profiler(interval=0.0002, async_mode="disabled")
    plain: list[float] = []

    async def main() -> None:
        from contextos import Runtime

        path = Path(db)
        policy = path.with_name(path.stem + "-policy.toml")
        policy.write_text(POLICY)
        plain_db = path.with_name("plain-" + path.name)
        async with Runtime(f"sqlite:///{plain_db}", policy=policy) as rt:
            await rt.run(_governed_agent(3), MESSAGE, context=_context())
            started = now()
            await rt.run(_governed_agent(n), MESSAGE, context=_context())
            plain.append((now() - started) / n * 1e6)
        agent = _governed_agent(n)
        async with Runtime(f"sqlite:///{path}", policy=policy) as rt:
            profiler.start()
            await rt.run(agent, MESSAGE, context=_context())
            profiler.stop()

    asyncio.run(main())
    root = profiler.last_session.root_frame() if profiler.last_session else None
    parts = split(root, PARTS) if root is not None else {}
    parts.pop(IDLE, None)
    busy = sum(parts.values()) or 1.0
    return {"per_turn_us": {k: v / busy * plain[0] for k, v in parts.items()}}


# -- the table --------------------------------------------------------------------------------

ROUNDS = {"quick": 1, "default": 5, "full": 7}
LONG = {"quick": 200, "default": 1_000, "full": 1_000}
"""Turns of the one long run of each system, which shows whether a governed turn stays flat."""


def bench(plan: str, work: Path, fast: Path | None, report: Any) -> None:
    """The governed-turn table, its target, and where ContextOS's governed turn goes."""

    systems = ["contextos", "langgraph"]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {"disk": {}, "cpu": {}}
    for r, order in enumerate(rounds(ROUNDS[plan], systems)):
        log(f"governed turn round {r + 1}/{ROUNDS[plan]}: {', '.join(order)}")
        for kind, where in (("disk", work), ("cpu", fast)):
            if where is None:
                continue
            for system in order:
                db = where / f"governed-{system}-{r}.db"
                res = worker("governed", system, db=str(db), n=N)
                results[kind].setdefault(system, []).append(res)
                for p in where.glob(f"governed-{system}-{r}*"):
                    p.unlink()

    where = fast if fast is not None else work
    turns = LONG[plan]
    log(f"governed turn: one {turns:,}-turn run of each system")
    long = {}
    for system in systems:
        db = where / f"governed-{system}-long.db"
        long[system] = worker("governed", system, db=str(db), n=turns)
        for p in where.glob(f"governed-{system}-long*"):
            p.unlink()

    def col(kind: str, system: str, key: str) -> list[float]:
        return [x[key] for x in results[kind].get(system, [])]

    def last(system: str) -> dict[str, Any]:
        return results["disk"][system][-1]

    rows = []
    ratio: dict[str, list[float]] = {}
    for kind, label in (
        ("disk", "time per turn, SQLite file on disk"),
        ("cpu", "time per turn, SQLite file on tmpfs (CPU only)"),
    ):
        if not results[kind]:
            continue
        c, g = col(kind, "contextos", "per_turn_us"), col(kind, "langgraph", "per_turn_us")
        ratio[kind] = ratios(g, c)
        rows.append([label, spread(c, us), spread(g, us), spread(ratio[kind], times)])
    c, g = last("contextos"), last("langgraph")
    rows += [
        [
            f"median turn, turns 1–{EDGE} → {N - EDGE + 1}–{N} (on disk, last round)",
            f"{us(c['first_turns_us'])} → {us(c['last_turns_us'])}",
            f"{us(g['first_turns_us'])} → {us(g['last_turns_us'])}",
            "",
        ],
        [
            f"median turn, turns 1–{EDGE} → {turns - EDGE + 1:,}–{turns:,} of one {turns:,}-turn "
            f"run ({'tmpfs' if fast is not None else 'disk'})",
            f"{us(long['contextos']['first_turns_us'])} → {us(long['contextos']['last_turns_us'])}",
            f"{us(long['langgraph']['first_turns_us'])} → {us(long['langgraph']['last_turns_us'])}",
            "",
        ],
        [
            f"storage after {N} turns (file + WAL)",
            size(c["bytes"]),
            size(g["bytes"]),
            times(g["bytes"] / c["bytes"]),
        ],
        [
            "rows written per turn",
            f"{c['events'] / N:.2f} events",
            f"{g['rows'] / N:.2f} checkpoints + writes",
            "",
        ],
        ["summaries made", str(c["summaries"]), str(g["summaries"]), ""],
        ["policy decisions recorded", str(c["decisions"]), "— (no policy layer)", ""],
        [
            "the e-mail address in the model's last request",
            f"{c['leaked']} times",
            f"{g['leaked']} times (in tool-call arguments, which its PII layer leaves)",
            "",
        ],
    ]
    log("governed turn: profile of ContextOS")
    prof = worker("governed", "profile", db=str(where / "governed-profile.db"), n=N)
    for p in where.glob("*governed-profile*"):
        p.unlink()
    per_part = sorted(prof["per_turn_us"].items(), key=lambda kv: -kv[1])
    busy = sum(v for _, v in per_part)
    report.add(
        "## Governed turn: the whole platform stack against LangGraph's middleware\n\n"
        f"The table-1 workload ({N} echo turns, then the answer), with a 200-character message "
        "holding an e-mail address, a card number and an IP address. ContextOS: budget gate "
        "(run tokens, model calls, daily tokens per principal), PII redaction, the "
        "untrusted-output sanitizer, compaction with a scripted summarizer, lineage recorded "
        "with every model call, and a policy file that decides every tool call (default deny, "
        "an allow rule, an absolute deny with a condition, a rate limit); the run acts for a "
        "principal with delegated scopes, a tool allowlist and a clearance. LangGraph: "
        "`create_agent` with `PIIMiddleware` for e-mail, card and IP (on input, output and "
        "tool results) and `SummarizationMiddleware` with a scripted summarizer, on "
        '`SqliteSaver`, `durability="sync"`. Both summarize past '
        f"{TRIGGER_TOKENS:,} estimated tokens and keep about {KEEP_TOKENS}. LangGraph has no "
        "policy layer, budget gate, sanitizer or lineage, so it does less work per turn. "
        f"{ROUNDS[plan]} interleaved rounds; median (min–max).\n\n"
        + table(
            [
                "",
                "ContextOS (full stack)",
                "LangGraph (PII + summarization)",
                "LangGraph ÷ ContextOS",
            ],
            rows,
        )
        + "\n\nWhere ContextOS's governed turn goes (sampling profile of one run on "
        + ("tmpfs" if fast is not None else "disk")
        + f", {busy:,.0f} µs per turn without the profiler, shared out as the profile "
        "shares it; each layer is charged for its own work, not for the layers inside it):"
        "\n\n"
        + table(
            ["part", "µs per turn", "share"],
            [[k, f"{v:,.0f}", f"{v / busy * 100:.0f}%"] for k, v in per_part],
        )
    )
    disk = median(ratio.get("disk", []))
    cpu = median(ratio.get("cpu", []))
    met = disk >= 10
    grown = long["contextos"]["last_turns_us"] / long["contextos"]["first_turns_us"]
    report.target(
        "Governed turn ≤ 1/10 of LangGraph's (PII + summarization middleware)",
        f"LangGraph ÷ ContextOS = {disk:.1f}× on disk"
        + (f", {cpu:.1f}× on tmpfs (CPU only)" if ratio.get("cpu") else "")
        + f"; storage {g['bytes'] / c['bytes']:.1f}× smaller; a turn at the end of {turns:,} "
        f"takes {grown:.1f}× one at the start",
        met,
    )
    if not met:
        lg_cpu = median(col("cpu", "langgraph", "per_turn_us")) if results["cpu"] else None
        report.add(_why_missed(per_part, busy, long["contextos"], turns, disk, lg_cpu))


def _why_missed(
    per_part: list[tuple[str, float]],
    busy: float,
    c: dict[str, Any],
    turns: int,
    ratio: float,
    langgraph_cpu_us: float | None,
) -> str:
    """The measured reason the governed target is missed, from this run's figures."""
    named = [f"{k.split(' (')[0]} ({v:,.0f} µs)" for k, v in per_part[:3]]
    growth = c["last_turns_us"] / c["first_turns_us"]
    text = (
        f"**Why the governed target is missed ({ratio:.1f}× of 10×).** Of the {busy:,.0f} µs "
        f"a governed turn takes on tmpfs, the largest parts are {', '.join(named)}. A turn "
        f"at the end of a {turns:,}-turn run takes {growth:.1f}× one at its start."
    )
    if growth > 1.3:  # a turn that grows with the run: what the guards do not add to it
        text += (
            " The content guards (PII redaction, the sanitizer) rewrite only the messages a "
            "call adds, keeping what they made of the history in an index of their own, so "
            "their cost per turn does not grow with the run; the profile above shares out the "
            "whole run and does not say which part grows."
        )
    if langgraph_cpu_us is not None:
        text += (
            f" For 10×, a governed turn would have to cost at most {langgraph_cpu_us / 10:,.0f} "
            "µs of CPU (a tenth of LangGraph's on tmpfs); the bare turn of table 1 is the "
            "floor under it, so its hot path (the function table of the bare turn) must come "
            "down as well."
        )
    return text
