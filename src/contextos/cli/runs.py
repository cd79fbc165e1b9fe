"""Running and reading runs: run, resume, cancel, runs, show, trace."""

from __future__ import annotations

import json
import sys
import textwrap
from contextlib import nullcontext
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from contextos import (
    ContextOSError,
    RenderedCall,
    RunNotFound,
    RunResult,
    RunStatus,
    Runtime,
    TimelineEntry,
    load_agent,
)
from contextos.cli.common import (
    STATUS_STYLE,
    JsonOption,
    StoreOption,
    age,
    app,
    call,
    console,
    fail,
    finish,
    jsonable,
    print_json,
    print_result,
)
from contextos.workers import started_by


@app.command()
def run(
    agent_ref: Annotated[
        str, typer.Argument(help="The agent: path/to/file.py:attr or package.module:attr.")
    ],
    input: Annotated[str, typer.Argument(help="The task for the agent.")],
    store: StoreOption = None,
    run_id: Annotated[str | None, typer.Option(help="Choose the run id.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Start a run and drive it until it finishes or waits for a person."""
    try:
        agent = load_agent(agent_ref)
    except ContextOSError as exc:
        fail(exc)

    async def work(rt: Runtime) -> RunResult:
        with nullcontext() if as_json else console.status(f"running {agent.name}…"):
            return await rt.run(agent, input, run_id=run_id, agent_ref=agent_ref)

    finish(call(store, work), as_json)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    store: StoreOption = None,
    agent_ref: Annotated[
        str | None,
        typer.Option("--agent", help="Agent reference, if not the one recorded at start."),
    ] = None,
    allow_changed_agent: Annotated[
        bool, typer.Option(help="Continue even if the agent definition changed.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Continue a run from its last recorded step (after a crash, a stop, or an answer)."""

    async def work(rt: Runtime) -> RunResult:
        agent = load_agent(agent_ref) if agent_ref else None
        return await rt.resume(run_id, agent, allow_changed_agent=allow_changed_agent)

    finish(call(store, work), as_json)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    reason: Annotated[str, typer.Option(help="Why (recorded on the run).")] = "",
    store: StoreOption = None,
    agent_ref: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="Agent reference, if not the one recorded at start (needed to undo its "
            "committed writes when no worker is driving the run).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a run; a worker driving it stops at once and cannot write to it again.

    Committed reversible writes are undone by their compensation tools first.
    """

    async def work(rt: Runtime) -> RunResult:
        agent = load_agent(agent_ref) if agent_ref else None
        return await rt.cancel(run_id, reason=reason, actor="user:cli", agent=agent)

    result = call(store, work)
    print_result(result, as_json)


@app.command()
def runs(
    store: StoreOption = None,
    status: Annotated[
        RunStatus | None, typer.Option("--status", help="Only runs with this status.")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """List runs, most recently updated first."""
    rows = call(store, lambda rt: rt.runs(status=status, limit=limit))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("[dim]no runs yet — start one with `contextos run AGENT_REF INPUT`[/]")
        return
    table = Table(title=f"runs ({len(rows)})", title_justify="left")
    # Ids are what people copy into `show` and `resume`: never cut them.
    table.add_column("id", no_wrap=True, min_width=max(len(r.run_id) for r in rows))
    for col, justify in (
        ("agent", "left"),
        ("status", "left"),
        ("turns", "right"),
        ("tokens", "right"),
        ("cost", "right"),
        ("age", "right"),
    ):
        # Only the agent's name may wrap; numbers and statuses stay whole.
        table.add_column(col, justify=justify, no_wrap=col != "agent")  # type: ignore[arg-type]
    for r in rows:
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(
            r.run_id,
            Text(f"{r.agent_name} v{r.agent_version}"),
            f"[{style}]{r.status}[/]",
            str(r.turns),
            str(r.input_tokens + r.output_tokens),
            f"${r.cost_usd:.4f}",
            age(r.updated_at),
        )
    console.print(table)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    store: StoreOption = None,
    context: Annotated[
        bool, typer.Option("--context", help="Also show what each model call's context held.")
    ] = False,
    text: Annotated[
        bool,
        typer.Option(
            "--text", help="Print each model call's prompt exactly as sent, with its lineage."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show a run's timeline: every recorded event, in order."""
    if text:  # the compiled context as text: --context is implied
        sys.stdout.write(prompts_text(call(store, lambda rt: rt.prompts(run_id))))
        return

    async def work(rt: Runtime) -> tuple[RunResult, list[TimelineEntry]]:
        return await rt.result(run_id), await rt.timeline(run_id)

    result, entries = call(store, work)
    if as_json:
        sys.stdout.write(
            json.dumps({"result": jsonable(result), "events": [e.data for e in entries]}, indent=2)
            + "\n"
        )
        return
    style = STATUS_STYLE.get(result.status, "")
    table = Table(
        title=f"run {run_id} [{style}]{result.status}[/]", title_justify="left", show_lines=False
    )
    table.add_column("#", justify="right")
    table.add_column("time")
    table.add_column("event")
    table.add_column("actor")
    table.add_column("detail", overflow="fold")
    for e in entries:
        table.add_row(
            str(e.seq),
            e.occurred_at.strftime("%H:%M:%S.%f")[:-3],
            e.type,
            e.actor,
            Text(e.line),  # event text is data, never Rich markup
        )
    console.print(table)
    if context:
        _print_contexts(entries)
    origin = started_by(entries[0].data.get("metadata") or {})
    if origin:
        console.print(Text(origin, style="dim"))
    print_result(result, False)


_MANIFEST = ("type", "id", "source", "version", "trust", "tokens", "why")
"""The columns of a context manifest, as each item of a model call's lineage names them."""


def _print_contexts(entries: list[TimelineEntry]) -> None:
    """One table per model call: each item that went in, where from, and why."""
    calls = [e for e in entries if e.type == "model_responded"]
    if not calls:
        console.print("[dim]no model calls recorded[/]")
    for turn, e in enumerate(calls, start=1):
        context = e.data.get("context") or {}
        stack = ", ".join(str(layer) for layer in context.get("stack", ())) or "none"
        table = Table(
            title=f"turn {turn} (event #{e.seq}) context {(e.data.get('context_hash') or '')[:12]} "
            f"· middleware: {stack}",
            title_justify="left",
        )
        for col in _MANIFEST:
            table.add_column(col, overflow="fold")
        for item in context.get("manifest", ()):
            table.add_row(*(Text(str(item.get(col, ""))) for col in _MANIFEST))
        console.print(table)
        telemetry = context.get("telemetry")
        if telemetry:
            console.print(Text(f"  telemetry: {json.dumps(telemetry, sort_keys=True)}"))


WIDTH = 80
"""Columns of `show --context --text`: it reads in any terminal and diffs line by line."""


def prompts_text(calls: list[RenderedCall]) -> str:
    """Each model call's prompt as sent, message by message, then the lineage of its blocks."""
    if not calls:
        return "no model call of this run recorded its prompt\n"
    out: list[str] = []
    for c in calls:
        out.append(_rule(f"turn {c.turn} · event #{c.seq} · context {c.context_hash[:12]}"))
        out += _wrapped(f"middleware: {', '.join(c.stack) or 'none'}")
        for layer, reason in sorted(c.opted_out.items()):
            out += _wrapped(f"opted out of {layer}: {reason}")
        out += _wrapped(f"tools shown: {', '.join(c.tools) or 'none'}")
        for m in c.messages:
            head = m.role + (f" {m.name} [{m.tool_call_id}]" if m.role == "tool" else "")
            out.append(_rule(head, "·"))
            out += _wrapped(m.content, keep_lines=True)
            for tc in m.tool_calls:
                out += _wrapped(f"→ {tc.name}({tc.arguments})")
        out.append(_rule("lineage", "·"))
        for row in c.manifest:
            mark = "-" if row.get("dropped") else "+"
            detail = " · ".join(str(row[k]) for k in ("type", "trust", "tokens") if k in row)
            out += _wrapped(f"{mark} {row.get('id', '')} ({detail})")
            out += _wrapped(f"{row.get('source', '')}: {row.get('why', '')}", indent="    ")
    return "\n".join(out) + "\n"


def _rule(title: str, fill: str = "─") -> str:
    head = f"{fill * 2} {title} "
    return head[:WIDTH] + fill * max(WIDTH - len(head), 0)


def _wrapped(text: str, *, keep_lines: bool = False, indent: str = "  ") -> list[str]:
    """Lines of at most WIDTH columns; with `keep_lines`, the text's own breaks are kept."""
    lines = text.split("\n") if keep_lines else [" ".join(text.split())]
    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(
            line,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent,
            replace_whitespace=False,
            drop_whitespace=True,
        ) or [indent.rstrip()]
    return out


@app.command()
def trace(
    run_id: Annotated[str, typer.Argument(help="The run to trace.")],
    store: StoreOption = None,
    otlp: Annotated[
        str | None,
        typer.Option(
            help="Send the spans over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318)."
        ),
    ] = None,
    capture_content: Annotated[
        bool | None,
        typer.Option(
            "--capture-content/--no-content",
            help="Include messages and tool arguments (default: $CONTEXTOS_OTEL_CAPTURE_CONTENT).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export a run's trace as OpenTelemetry spans (GenAI conventions): a tree, JSON, or OTLP."""
    traced = call(
        store,
        lambda rt: rt.trace(run_id, capture_content=capture_content, otlp_endpoint=otlp),
    )
    if not traced.spans:
        fail(RunNotFound(run_id))
    if as_json:
        print_json(traced.to_json())
    else:
        console.print(traced.tree())
        if otlp:
            console.print(f"[dim]sent {len(traced.spans)} spans to {otlp}[/]")
