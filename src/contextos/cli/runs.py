"""Running and reading runs: run, resume, cancel, runs, show, trace."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable
from contextlib import nullcontext, suppress
from typing import Annotated

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from contextos import (
    ContextOSError,
    RenderedCall,
    RunId,
    RunNotFound,
    RunOwner,
    RunResult,
    RunStatus,
    RunSummary,
    Runtime,
    RunTree,
    TimelineEntry,
    load_agent,
    load_runnable,
)
from contextos.cli.common import (
    STATUS_STYLE,
    AgentRefOption,
    JsonOption,
    StoreOption,
    age,
    app,
    call,
    console,
    drive,
    err,
    examples,
    fail,
    jsonable,
    print_json,
    print_result,
    resolve_run,
    turns,
    workflow_progress,
)
from contextos.workers import started_by

FollowOption = Annotated[
    bool, typer.Option("--follow", "-f", help="Print each event as it is recorded.")
]

FOLLOW_POLL_S = 0.2
"""How often a follower looks for new events."""


async def follow(
    rt: Runtime,
    run_id: str,
    *,
    after_seq: int = 0,
    until: asyncio.Event | None = None,
    out: Console = console,
) -> None:
    """Print the run's events as they commit, one line each, until `until` is set (its driver
    stopped) or, without it, until the run ends, waits for a person or pauses."""
    seen = after_seq
    while True:
        stopping = until is not None and until.is_set()
        with suppress(RunNotFound):  # not created yet
            for e in await rt.timeline(run_id, after_seq=seen):
                out.print(
                    f"[dim]#{e.seq} {e.occurred_at:%H:%M:%S}[/] {e.type}",
                    Text(e.line),
                    soft_wrap=True,
                )
                seen = e.seq
        if stopping:
            return
        if until is None:
            status = (await rt.result(run_id)).status
            if status.is_terminal or status.is_idle:
                return
        await asyncio.sleep(FOLLOW_POLL_S)


async def following(
    rt: Runtime,
    run_id: str,
    driving: Awaitable[RunResult],
    *,
    on: bool,
    as_json: bool,
    after_seq: int = 0,
) -> RunResult:
    """Drive (`driving`), printing the run's events after `after_seq` as they commit when `on`
    (on stderr under --json, which keeps stdout one JSON document); otherwise, on a terminal,
    a spinner says where the run stands and for how long it has been driven."""
    if not on:
        if as_json or not err.is_terminal:
            return await driving
        done = asyncio.Event()
        spinner = asyncio.create_task(progress(rt, run_id, until=done))
        try:
            return await driving
        finally:
            done.set()
            await spinner
    stopped = asyncio.Event()
    out = err if as_json else console
    printer = asyncio.create_task(follow(rt, run_id, after_seq=after_seq, until=stopped, out=out))
    try:
        return await driving
    finally:
        stopped.set()
        await printer


async def progress(rt: Runtime, run_id: str, *, until: asyncio.Event) -> None:
    """A live line on stderr until `until`: the run's status, its turns and the time so far;
    for a workflow, its nodes too."""
    started = time.monotonic()
    workflow: bool | None = None  # not known until the run exists
    with err.status(f"run {run_id}: starting", spinner="dots") as status:
        while not until.is_set():
            with suppress(ContextOSError):  # not created yet: it is starting
                summary = await rt.store.get_run(RunId(run_id))
                line = f"run {run_id}: {summary.status.value}, {turns(summary.turns)}"
                if workflow is not False:
                    state = await rt.state(run_id)
                    workflow = state.workflow is not None
                    if workflow:
                        line += f", {workflow_progress(state)}"
                status.update(f"{line}, {time.monotonic() - started:.0f}s")
            with suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), PROGRESS_S)


PROGRESS_S = 0.5
"""How often the live line on a terminal reads where the run stands."""


@app.command(
    short_help="Start a run and drive it until it ends or waits.",
    epilog=examples(
        'contextos run examples/quickstart.py:agent "Where is order A-1001?"',
        'contextos run agent.py:agent "Refund order 7" --run-id refund-7 --follow',
        'contextos run agent.py:agent "Refund order 7" --json',
    ),
)
def run(
    agent_ref: Annotated[
        str,
        typer.Argument(help="The agent or workflow: path/to/file.py:attr or package.module:attr."),
    ],
    input: Annotated[str, typer.Argument(help="The task for the agent (JSON for a workflow).")],
    store: StoreOption = None,
    run_id: Annotated[str | None, typer.Option(help="Choose the run id.")] = None,
    follow_events: FollowOption = False,
    as_json: JsonOption = False,
) -> None:
    """Start a run and drive it until it finishes or waits for a person.

    Example: contextos run examples/quickstart.py:agent "Where is order A-1001?" --follow
    """
    try:
        agent = load_runnable(agent_ref)
    except ContextOSError as exc:
        fail(exc)

    rid = run_id or f"run_{uuid.uuid4().hex[:20]}"

    async def work(rt: Runtime) -> RunResult:
        with nullcontext() if as_json else console.status(f"running {agent.name}…"):
            driving = rt.run(agent, input, run_id=rid, agent_ref=agent_ref)
            return await following(rt, rid, driving, on=follow_events, as_json=as_json)

    drive(store, work, as_json, create=True)


@app.command(
    short_help="Continue a run from its last recorded step.",
    epilog=examples(
        "contextos resume run_3f2a9c --follow",
        "contextos resume run_3f  # a unique prefix of the id will do",
        "contextos resume run_3f2a9c --agent agent_v2.py:agent --allow-changed-agent",
        "contextos resume run_3f2a9c --queue  # hand a paused run to the workers",
    ),
)
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    store: StoreOption = None,
    agent_ref: AgentRefOption = None,
    allow_changed_agent: Annotated[
        bool, typer.Option(help="Continue even if the agent definition changed.")
    ] = False,
    queue: Annotated[
        bool,
        typer.Option(
            "--queue", help="Queue a paused run for the workers instead of driving it here."
        ),
    ] = False,
    follow_events: FollowOption = False,
    as_json: JsonOption = False,
) -> None:
    """Continue a run from its last recorded step (after a crash, a stop, or an answer).

    Refused while another live driver holds the run. Example: contextos resume RUN_ID --follow
    """
    run_id = resolve_run(store, run_id)
    if queue:
        print_result(call(store, lambda rt: rt.unpause(run_id, actor="user:cli")), as_json)
        return

    async def work(rt: Runtime) -> RunResult:
        agent = load_runnable(agent_ref) if agent_ref else None
        seen = (await rt.state(run_id)).seq if follow_events else 0
        driving = rt.resume(run_id, agent, allow_changed_agent=allow_changed_agent)
        return await following(
            rt, run_id, driving, on=follow_events, as_json=as_json, after_seq=seen
        )

    drive(store, work, as_json)


@app.command(
    short_help="Cancel a run; its driver stops at once.",
    epilog=examples(
        'contextos cancel run_3f2a9c --reason "wrong customer"',
    ),
)
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
    run_id = resolve_run(store, run_id)

    async def work(rt: Runtime) -> tuple[RunResult, bool]:
        before = await rt.result(run_id)
        if before.status.is_terminal:
            return before, False
        agent = load_agent(agent_ref) if agent_ref else None
        return await rt.cancel(run_id, reason=reason, actor="user:cli", agent=agent), True

    result, cancelled_here = call(store, work)
    if not cancelled_here:
        fail(ContextOSError(f"run {run_id} had already ended ({result.status}): nothing to cancel"))
    print_result(result, as_json)


@app.command(
    short_help="List runs, most recently updated first.",
    epilog=examples(
        "contextos runs",
        "contextos runs --status input_required --limit 10",
        "contextos runs --top-level --json",
    ),
)
def runs(
    store: StoreOption = None,
    status: Annotated[
        RunStatus | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"Only runs with this status: {', '.join(RunStatus)}.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="How many runs to list.")] = 50,
    top_level: Annotated[
        bool, typer.Option("--top-level", help="Only runs no other run started (no child runs).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """List runs, most recently updated first."""
    rows = call(store, lambda rt: rt.runs(status=status, limit=limit, top_level=top_level))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("[dim]no runs yet — start one with `contextos run AGENT_REF INPUT`[/]")
        return
    # Ids are what people copy into `show` and `resume`: never cut them, nor wrap the agent.
    # On a narrow terminal the columns that `--json` and `show` also give go, what a run
    # spent last: its age first, its cost only when nothing else is left to drop.
    for dropped in DROPPED_IN_TURN:
        table = _runs_table(rows, dropped)
        unbounded = console.options.update_width(10_000)  # its natural width, not the screen's
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    console.print(table)


DROPPED_IN_TURN = ((), ("age",), ("age", "turns"), ("age", "turns", "tokens"))


def _runs_table(rows: list[RunSummary], dropped: tuple[str, ...]) -> Table:
    table = Table(title=f"runs ({len(rows)})", title_justify="left", show_edge=False)
    cells: dict[str, list[str | Text]] = {
        "id": [r.run_id for r in rows],
        "agent": [Text(f"{r.agent_name} v{r.agent_version}") for r in rows],
        "status": [f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]" for r in rows],
        "turns": [str(r.turns) for r in rows],
        "tokens": [str(r.input_tokens + r.output_tokens) for r in rows],
        "cost": [f"${r.cost_usd:.4f}" for r in rows],
        "age": [age(r.updated_at) for r in rows],
    }
    shown = [col for col in cells if col not in dropped]
    for col in shown:
        justify = "left" if col in ("id", "agent", "status") else "right"
        width = max(len(r.run_id) for r in rows) if col == "id" else None
        table.add_column(col, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]
    for i in range(len(rows)):
        table.add_row(*(cells[col][i] for col in shown))
    return table


@app.command(
    short_help="Show a run's timeline, and the tree of what it started.",
    epilog=examples(
        "contextos show run_3f2a9c",
        "contextos show run_3f --follow",
        "contextos show run_3f2a9c --context --json",
    ),
)
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
    follow_events: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Then print new events as they are recorded, until it stops."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show a run's timeline: every recorded event, in order; then, for a workflow or a
    run that delegated, the tree of its nodes and child runs with their status and spend."""
    run_id = resolve_run(store, run_id)
    if text:  # the compiled context as text: --context is implied
        sys.stdout.write(prompts_text(call(store, lambda rt: rt.prompts(run_id))))
        return

    async def work(
        rt: Runtime,
    ) -> tuple[RunResult, list[TimelineEntry], RunOwner | None, RunTree]:
        return (
            await rt.result(run_id),
            await rt.timeline(run_id),
            await rt.owner(run_id),
            await rt.tree(run_id),
        )

    result, entries, owner, tree = call(store, work)
    if as_json:
        shown = {"result": jsonable(result), "owner": jsonable(owner)}
        sys.stdout.write(
            json.dumps(
                {**shown, "events": [e.data for e in entries], "tree": tree.to_dict()}, indent=2
            )
            + "\n"
        )
        return
    style = STATUS_STYLE.get(result.status, "")
    console.print(f"run {run_id} [{style}]{result.status}[/]")
    if console.width >= WIDE_TIMELINE:
        console.print(_timeline_table(entries))
    else:
        _print_timeline_lines(entries)
    if context:
        _print_contexts(entries)
    if tree.children:
        _print_tree(tree)
    origin = started_by(entries[0].data.get("metadata") or {})
    if origin:
        console.print(Text(origin, style="dim"))
    first = entries[0].data
    if first.get("caused_by"):
        tree_id = first.get("correlation_id") or run_id
        console.print(Text(f"caused by {first['caused_by']}; run tree {tree_id}", style="dim"))
    if owner is None and entries[-1].type == "run_released":
        console.print(Text(f"released, resumable: {entries[-1].line}", style="yellow"))
    print_result(result, False, owner=owner)
    if follow_events and not result.status.is_terminal:
        call(store, lambda rt: follow(rt, run_id, after_seq=entries[-1].seq))


def _print_tree(tree: RunTree) -> None:
    """The workflow's nodes and the child runs below them, with status, time and spend."""

    def add(branch: Tree, node: RunTree) -> None:
        for child in node.children:
            add(branch.add(_tree_line(child)), child)

    root = Tree(_tree_line(tree))
    add(root, tree)
    console.print(root)


WIDE_TIMELINE = 120
"""From this many columns the timeline is a table; below, each event takes a line of its own
and its detail the lines below it, at the terminal's full width."""


def _timeline_table(entries: list[TimelineEntry]) -> Table:
    table = Table(show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("cause", justify="right")
    table.add_column("time")
    table.add_column("event", no_wrap=True)
    table.add_column("actor", no_wrap=True)
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
    return table


def _print_timeline_lines(entries: list[TimelineEntry]) -> None:
    """The timeline for a narrow terminal: `#seq time event actor (after #cause)`, then the
    detail indented below it."""
    pad = len(str(entries[-1].seq)) if entries else 1
    for e in entries:
        head = Text(f"{e.seq:>{pad}} ", style="bold")
        head.append(e.occurred_at.strftime("%H:%M:%S.%f")[:-3], style="dim")
        head.append(f" {e.type} ", style="cyan")
        head.append(e.actor, style="dim")
        if e.causation_id is not None:
            head.append(f" (after #{e.causation_id})", style="dim")
        console.print(head, overflow="fold")
        detail = Text(e.line)  # event text is data, never Rich markup
        console.print(Padding(detail, (0, 0, 0, pad + 1), expand=False), overflow="fold")


def _tree_line(t: RunTree) -> Text:
    line = Text()
    line.append(t.label, style="bold" if t.kind != "child" else "")
    line.append(f" {t.kind} ", style="dim")
    line.append(t.status, style=STATUS_STYLE.get(t.status, ""))  # type: ignore[call-overload]
    spent = [] if t.duration_s is None else [f"{t.duration_s:.2f}s"]
    if t.turns or t.tokens:
        spent += [turns(t.turns), f"{t.tokens} tokens", f"${t.cost_usd:.4f}"]
    if spent:
        line.append(" · " + " · ".join(spent))
    if t.detail:
        line.append(f" · {t.detail}", style="dim")
    return line


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


@app.command(
    short_help="Export a run's trace as OpenTelemetry spans.",
    epilog=examples(
        "contextos trace run_3f2a9c",
        "contextos trace run_3f2a9c --json --capture redacted",
        "contextos trace run_3f2a9c --otlp http://127.0.0.1:4318",
    ),
)
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
    run_id = resolve_run(store, run_id)
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
