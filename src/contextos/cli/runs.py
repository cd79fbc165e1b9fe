"""Running and reading runs: run, resume, cancel, runs, show, trace."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from contextos import (
    ContextOSError,
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
    as_json: JsonOption = False,
) -> None:
    """Show a run's timeline: every recorded event, in order."""

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
    table.add_column("cause", justify="right")
    table.add_column("time")
    table.add_column("event")
    table.add_column("actor")
    table.add_column("detail", overflow="fold")
    for e in entries:
        table.add_row(
            str(e.seq),
            f"#{e.causation_id}" if e.causation_id is not None else "",
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
    first = entries[0].data
    if first.get("caused_by"):
        tree = first.get("correlation_id") or run_id
        console.print(Text(f"caused by {first['caused_by']}; run tree {tree}", style="dim"))
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
    capture: Annotated[
        str | None,
        typer.Option(
            "--capture",
            help="Content in spans: metadata, redacted, hashes or full (as the model saw it: "
            "a run without a PII layer as recorded).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export a run's trace as OpenTelemetry spans (GenAI conventions): a tree, JSON, or OTLP."""
    content = capture if capture is not None else capture_content
    traced = call(
        store,
        lambda rt: rt.trace(run_id, capture_content=content, otlp_endpoint=otlp),
    )
    if not traced.spans:
        fail(RunNotFound(run_id))
    if as_json:
        print_json(traced.to_json())
    else:
        console.print(traced.tree())
        if otlp:
            console.print(f"[dim]sent {len(traced.spans)} spans to {otlp}[/]")
