"""The `contextos` command: parse, call the public API, print.

Every command takes `--store` (default: $CONTEXTOS_STORE, else ./.contextos/contextos.db);
read commands take `--json` for scripts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from contextos import timeline
from contextos.agents import load_agent
from contextos.errors import ContextOSError
from contextos.events import ModelResponded, RunCreated, encode
from contextos.runs import RunStatus
from contextos.runtime import RunResult, Runtime
from contextos.triggers import started_by

T = TypeVar("T")

app = typer.Typer(
    name="contextos",
    help="ContextOS: run agents durably, inspect them, resume them after a crash.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
console = Console()
err = Console(stderr=True)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="CONTEXTOS_STORE",
        help="Store URL: sqlite:///path.db, a file path, or postgresql://… "
        "[default: ./.contextos/contextos.db]",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_HINTS: dict[str, str] = {
    "run_not_found": "List runs with `contextos runs`.",
    "config_error": "See `contextos --help`.",
    "agent_changed": "Pass --allow-changed-agent to continue under the new definition.",
    "migration_error": "Run `contextos doctor` to check the store.",
}


def _fail(exc: ContextOSError) -> NoReturn:
    err.print("[bold red]error:[/]", Text(exc.message))
    hint = _HINTS.get(exc.code)
    if hint:
        err.print(f"[dim]{hint}[/]")
    raise typer.Exit(code=1)


def _call(store: str | None, work: Callable[[Runtime], Awaitable[T]]) -> T:
    """Open a runtime on the store, run `work`, close, and turn our errors into messages."""

    async def main() -> T:
        runtime = Runtime(store)
        try:
            return await work(runtime)
        finally:
            await runtime.close()

    try:
        return asyncio.run(main())
    except ContextOSError as exc:
        _fail(exc)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, default=str) + "\n")


def _age(ts: datetime) -> str:
    seconds = int((datetime.now(UTC) - ts).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


_STATUS_STYLE = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.EXPIRED: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.QUEUED: "blue",
    RunStatus.INPUT_REQUIRED: "magenta",
}


def _print_result(result: RunResult, as_json: bool) -> None:
    if as_json:
        _print_json(result)
        return
    style = _STATUS_STYLE.get(result.status, "")
    console.print(f"run [bold]{result.run_id}[/] [{style}]{result.status}[/]")
    if result.output is not None:
        console.print(Text(result.output))
    if result.failure_reason is not None:
        console.print(f"[red]{result.failure_reason}[/]:", Text(result.failure_message or ""))
    u = result.usage
    console.print(
        f"[dim]{result.turns} turns · {u.input_tokens}+{u.output_tokens} tokens · "
        f"${u.cost_usd:.4f}[/]"
    )
    if result.status is RunStatus.INPUT_REQUIRED:
        console.print("[magenta]waiting for a person:[/] see `contextos inbox`")
    elif not result.status.is_terminal:
        console.print(f"[dim]continue with `contextos resume {result.run_id}`[/]")


def _finish(result: RunResult, as_json: bool) -> None:
    """Print a driven run's result; exit non-zero when it ended without success."""
    _print_result(result, as_json)
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.EXPIRED):
        raise typer.Exit(code=1)


# -- commands -------------------------------------------------------------------------------


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
        _fail(exc)

    async def work(rt: Runtime) -> RunResult:
        with nullcontext() if as_json else console.status(f"running {agent.name}…"):
            return await rt.run(agent, input, run_id=run_id, agent_ref=agent_ref)

    _finish(_call(store, work), as_json)


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

    _finish(_call(store, work), as_json)


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

    result = _call(store, work)
    _print_result(result, as_json)


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
    rows = _call(store, lambda rt: rt.runs(status=status, limit=limit))
    if as_json:
        _print_json(rows)
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
        style = _STATUS_STYLE.get(r.status, "")
        table.add_row(
            r.run_id,
            Text(f"{r.agent_name} v{r.agent_version}"),
            f"[{style}]{r.status}[/]",
            str(r.turns),
            str(r.input_tokens + r.output_tokens),
            f"${r.cost_usd:.4f}",
            _age(r.updated_at),
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

    async def work(rt: Runtime) -> tuple[Any, Any]:
        return await rt.result(run_id), await rt.events(run_id)

    result, events = _call(store, work)
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "result": _jsonable(result),
                    "events": [json.loads(encode(e)) for e in events],
                },
                indent=2,
            )
            + "\n"
        )
        return
    style = _STATUS_STYLE.get(result.status, "")
    table = Table(
        title=f"run {run_id} [{style}]{result.status}[/]", title_justify="left", show_lines=False
    )
    table.add_column("#", justify="right")
    table.add_column("time")
    table.add_column("event")
    table.add_column("actor")
    table.add_column("detail", overflow="fold")
    for e in events:
        table.add_row(
            str(e.seq),
            e.occurred_at.strftime("%H:%M:%S.%f")[:-3],
            e.type,
            e.actor,
            Text(timeline.describe(e)),  # event text is data, never Rich markup
        )
    console.print(table)
    if context:
        _print_contexts(events)
    origin = started_by(events[0].metadata) if isinstance(events[0], RunCreated) else None
    if origin:
        console.print(Text(origin, style="dim"))
    _print_result(result, False)


def _print_contexts(events: list[Any]) -> None:
    """One table per model call: each item that went in, where from, and why."""
    from contextos.context import manifest_table

    calls = [e for e in events if isinstance(e, ModelResponded)]
    if not calls:
        console.print("[dim]no model calls recorded[/]")
    for turn, e in enumerate(calls, start=1):
        stack = ", ".join(str(layer) for layer in e.context.get("stack", ())) or "none"
        table = Table(
            title=f"turn {turn} (event #{e.seq}) context {(e.context_hash or '')[:12]} "
            f"· middleware: {stack}",
            title_justify="left",
        )
        for col in ("type", "id", "source", "version", "trust", "tokens", "why"):
            table.add_column(col, overflow="fold")
        for row in manifest_table(e.context.get("manifest", ())):
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
        telemetry = e.context.get("telemetry")
        if telemetry:
            console.print(Text(f"  telemetry: {json.dumps(telemetry, sort_keys=True)}"))


# -- people: the inbox, approvals, denials, answers, revocations ---------------------------
#
# Who is acting comes from --as (default: $CONTEXTOS_USER, else the login name); which roles
# they hold comes from the runtime's policy ($CONTEXTOS_POLICY).

_HINTS.update(
    {
        "approval_refused": "See the interrupt with `contextos inbox`.",
        "interrupt_not_found": "List pending interrupts with `contextos inbox`.",
        "answer_invalid": "Answers must match the schema shown by `contextos inbox --json`.",
    }
)


def _me() -> str:
    import getpass
    import os

    try:
        return os.environ.get("CONTEXTOS_USER") or getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "local"


AsOption = Annotated[
    str | None,
    typer.Option("--as", help="Who is acting [default: $CONTEXTOS_USER, else the login name]"),
]


@app.command()
def inbox(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(help="How many waiting runs to look at.")] = 200,
    as_json: JsonOption = False,
) -> None:
    """List interrupts waiting for a person, across runs, with what each one would do."""
    pending = _call(store, lambda rt: rt.inbox(limit=limit))
    if as_json:
        _print_json([i.to_dict() for i in pending])
        return
    if not pending:
        console.print("[dim]nothing is waiting for a person[/]")
        return
    table = Table(title=f"inbox ({len(pending)})", title_justify="left")
    for col in ("interrupt", "kind", "run", "asks", "blast radius", "needs", "age"):
        table.add_column(col, overflow="fold")
    for i in pending:
        action = i.action
        table.add_row(
            i.id,
            i.kind.value,
            i.run_id,
            Text(i.prompt),
            Text(action.blast_radius if action else ""),
            Text(" + ".join(i.approver_roles)),
            _age(i.raised_at),
        )
    console.print(table)


@app.command()
def approve(
    interrupt_id: Annotated[str, typer.Argument(help="The interrupt whose action to approve.")],
    store: StoreOption = None,
    approver: AsOption = None,
    expires_in: Annotated[
        float | None, typer.Option(help="Seconds the approval stays valid [default: policy's].")
    ] = None,
    condition: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE the action must still meet, e.g. max_amount=500."),
    ] = None,
    action_hash: Annotated[
        str | None, typer.Option("--hash", help="Approve only if the frozen action has this hash.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Approve the frozen action of an interrupt (then `contextos resume RUN`)."""
    conditions: dict[str, Any] = {}
    for item in condition or []:
        key, sep, raw = item.partition("=")
        if not sep:
            err.print(f"[bold red]error:[/] condition {item!r} is not KEY=VALUE")
            raise typer.Exit(code=2)
        try:
            conditions[key] = json.loads(raw)
        except json.JSONDecodeError:
            conditions[key] = raw
    approval = _call(
        store,
        lambda rt: rt.approve(
            interrupt_id,
            approver=approver or _me(),
            expires_in=expires_in,
            conditions=conditions or None,
            action_hash=action_hash,
        ),
    )
    if as_json:
        _print_json(approval)
        return
    console.print(
        f"[green]approved[/] {interrupt_id} as [bold]{approval.id}[/] by {approval.approver}, "
        f"valid until {approval.expires_at.isoformat()}"
    )
    console.print(f"[dim]continue with `contextos resume {approval.run_id}`[/]")


@app.command()
def deny(
    interrupt_id: Annotated[str, typer.Argument(help="The interrupt whose action to refuse.")],
    reason: Annotated[str, typer.Option(help="Why; the model is told.")] = "",
    store: StoreOption = None,
    approver: AsOption = None,
) -> None:
    """Refuse the action of an interrupt: that action ends, the run goes on without it."""
    _call(store, lambda rt: rt.deny(interrupt_id, approver=approver or _me(), reason=reason))
    console.print(f"[yellow]denied[/] {interrupt_id}")


@app.command()
def answer(
    interrupt_id: Annotated[str, typer.Argument(help="The interrupt to answer.")],
    value: Annotated[str, typer.Argument(help="The answer: a word, or a JSON object.")],
    store: StoreOption = None,
    who: AsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Answer an interrupt (information, a choice, a review, an external confirmation)."""
    parsed = _call(store, lambda rt: rt.answer(interrupt_id, value, answered_by=who or _me()))
    if as_json:
        _print_json(parsed)
        return
    console.print(f"[green]answered[/] {interrupt_id}:", Text(json.dumps(parsed)))


@app.command()
def revoke(
    approval_id: Annotated[str, typer.Argument(help="The approval to withdraw (apr.…).")],
    reason: Annotated[str, typer.Option(help="Why (recorded on the run).")] = "",
    store: StoreOption = None,
    who: AsOption = None,
) -> None:
    """Withdraw an approval; an action that has not run yet will not run on it."""
    revoked = _call(
        store, lambda rt: rt.revoke(approval_id, revoked_by=who or _me(), reason=reason)
    )
    console.print(f"[yellow]revoked[/] {revoked.id} (was by {revoked.approver})")


# -- workers, schedules and operations -------------------------------------------------------

schedule_app = typer.Typer(
    help="Cron schedules: start a run of an agent at every tick, once across all workers.",
    no_args_is_help=True,
)
app.add_typer(schedule_app, name="schedule")
trigger_app = typer.Typer(
    help="Triggers: start a run when a run of another agent ends, or on a webhook call.",
    no_args_is_help=True,
)
app.add_typer(trigger_app, name="trigger")


@app.command()
def worker(
    store: StoreOption = None,
    concurrency: Annotated[int, typer.Option(help="Runs driven at once.")] = 4,
    lease: Annotated[float, typer.Option(help="Lease seconds (renewed every third).")] = 30.0,
    poll: Annotated[float, typer.Option(help="Seconds between looks at an idle queue.")] = 1.0,
    agent: Annotated[
        list[str] | None, typer.Option(help="Claim only runs of this agent (repeatable).")
    ] = None,
    schedules: Annotated[bool, typer.Option(help="Fire due cron schedules.")] = True,
    triggers: Annotated[bool, typer.Option(help="Start the runs run triggers owe.")] = True,
    max_attempts: Annotated[
        int, typer.Option(help="Failed attempts before a run is failed (runtime_crashed).")
    ] = 10,
    worker_id: Annotated[str | None, typer.Option(help="Name this worker.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Claim queued runs and drive them; SIGTERM drains (each run finishes its step).

    Run many, on many machines, against one store.
    """
    import logging

    from contextos.worker import WorkerConfig, run_worker

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = WorkerConfig(
        concurrency=concurrency,
        lease_s=lease,
        poll_s=poll,
        agents=tuple(agent) if agent else None,
        schedules=schedules,
        triggers=triggers,
        max_attempts=max_attempts,
    )
    try:
        run_worker(store, config=config, worker_id=worker_id)
    except ContextOSError as exc:
        _fail(exc)


@app.command()
def workers(
    store: StoreOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Include stopped and silent ones.")] = False,
    as_json: JsonOption = False,
) -> None:
    """List live workers and the runs they hold leases on."""
    from contextos.worker import list_workers

    rows = _call(store, lambda rt: list_workers(rt.store, live_within_s=None if all_ else 60))
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("[dim]no live workers — start one with `contextos worker`[/]")
        return
    table = Table(title=f"workers ({len(rows)})", title_justify="left")
    for col in ("worker", "host", "pid", "status", "heartbeat", "leases"):
        table.add_column(col)
    for w in rows:
        leases = ", ".join(lease.run_id for lease in w.leases) or "-"
        beat = _age(w.heartbeat_at) + " ago" if w.heartbeat_at else "-"
        table.add_row(
            w.worker_id,
            w.host,
            str(w.pid),
            w.status.value,
            beat,
            f"{len(w.leases)}/{w.concurrency} {leases}",
        )
    console.print(table)


@app.command()
def limit(
    max_running: Annotated[
        int | None, typer.Argument(help="Runs at once; omit to list the limits.")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Per tenant ('*': each tenant).")] = None,
    agent: Annotated[str | None, typer.Option(help="Per agent ('*': each agent).")] = None,
    remove: Annotated[bool, typer.Option(help="Remove the limit instead.")] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show or set concurrency limits (global, per tenant, per agent) shared by all workers."""
    from contextos.store.queue import LimitScope, queue_of

    scope, name = LimitScope.GLOBAL, ""
    if tenant is not None:
        scope, name = LimitScope.TENANT, tenant
    if agent is not None:
        scope, name = LimitScope.AGENT, agent

    async def work(rt: Runtime) -> Any:
        queue = queue_of(rt.store)
        if queue is None:
            raise ContextOSError("this store keeps no run queue")
        if remove or max_running is not None:
            await queue.set_limit(scope, name, None if remove else max_running)
        return await queue.limits()

    rows = _call(store, work)
    if as_json:
        _print_json(rows)
        return
    for lim in rows:
        console.print(f"{lim.scope.value:7} {lim.name or '-':20} {lim.max_running}")
    if not rows:
        console.print("[dim]no limits: workers take as much as their concurrency allows[/]")


@schedule_app.command("add")
def schedule_add(
    name: Annotated[str, typer.Argument(help="A unique name.")],
    agent_ref: Annotated[str, typer.Argument(help="path/to/file.py:attr or module:attr.")],
    cron: Annotated[str, typer.Option(help='Cron expression, e.g. "0 6 * * *".')],
    input: Annotated[str, typer.Option(help="The input of each run.")] = "",
    timezone: Annotated[str, typer.Option(help="Time zone the cron is read in.")] = "UTC",
    catch_up: Annotated[
        str, typer.Option(help="Ticks missed while no worker ran: skip or run_once.")
    ] = "skip",
    misfire_grace: Annotated[
        float, typer.Option(help="Seconds late a tick may fire and still be on time.")
    ] = 60.0,
    priority: Annotated[int, typer.Option(help="Priority of its runs.")] = 0,
    tenant: Annotated[str, typer.Option(help="Tenant of its runs.")] = "",
    store: StoreOption = None,
) -> None:
    """Add a cron schedule; workers fire each tick exactly once."""
    from contextos.scheduler import add_schedule
    from contextos.store.queue import queue_of

    async def work(rt: Runtime) -> Any:
        queue = queue_of(rt.store)
        if queue is None:
            raise ContextOSError("this store keeps no run queue")
        return await add_schedule(
            queue,
            name,
            agent_ref,
            cron,
            input=input,
            timezone=timezone,
            catch_up=catch_up,
            misfire_grace_s=misfire_grace,
            priority=priority,
            tenant=tenant,
        )

    try:
        added = _call(store, work)
    except ValueError:
        _fail(ContextOSError(f"unknown catch-up policy {catch_up!r}: use skip or run_once"))
    console.print(f"schedule [bold]{added.name}[/]: next tick {added.next_tick_at.isoformat()}")


@schedule_app.command("list")
def schedule_list(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List schedules with their next tick and last run."""
    from contextos.store.queue import queue_of

    async def work(rt: Runtime) -> Any:
        queue = queue_of(rt.store)
        return [] if queue is None else await queue.list_schedules()

    rows = _call(store, work)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("[dim]no schedules — add one with `contextos schedule add`[/]")
        return
    table = Table(title=f"schedules ({len(rows)})", title_justify="left")
    for col in ("name", "cron", "agent", "catch-up", "next tick", "last run"):
        table.add_column(col)
    for s in rows:
        table.add_row(
            s.name,
            f"{s.cron} ({s.timezone})",
            Text(s.agent_ref),
            s.catch_up.value,
            s.next_tick_at.isoformat(),
            s.last_run_id or "-",
        )
    console.print(table)


@schedule_app.command("remove")
def schedule_remove(
    name: Annotated[str, typer.Argument(help="The schedule to remove.")],
    store: StoreOption = None,
) -> None:
    """Remove a schedule (runs it started stay)."""
    from contextos.store.queue import queue_of

    async def work(rt: Runtime) -> bool:
        queue = queue_of(rt.store)
        return queue is not None and await queue.remove_schedule(name)

    if not _call(store, work):
        _fail(ContextOSError(f"no schedule named {name!r}"))
    console.print(f"removed schedule [bold]{name}[/]")


@trigger_app.command("add")
def trigger_add(
    name: Annotated[str, typer.Argument(help="A unique name (a webhook's URL path too).")],
    agent_ref: Annotated[str, typer.Argument(help="The agent to start: file.py:attr or mod:attr.")],
    after: Annotated[
        str | None, typer.Option(help="Fire when a run of this agent (by name) ends.")
    ] = None,
    on: Annotated[str, typer.Option(help="Which endings fire it: completed, failed or any.")] = (
        "completed"
    ),
    input: Annotated[
        str | None,
        typer.Option(
            help="Input template: {output}, {run_id}, {status}, {failure}, {agent}, "
            "{input} (default: the finished run's output)"
        ),
    ] = None,
    webhook: Annotated[bool, typer.Option(help="Fire on POST /v1/hooks/NAME instead.")] = False,
    secret_env: Annotated[
        str | None, typer.Option(help="Env var with the webhook's HMAC-SHA256 secret.")
    ] = None,
    allow_cycle: Annotated[
        bool, typer.Option(help="Allow a loop of triggers (an agent starting itself).")
    ] = False,
    max_depth: Annotated[int, typer.Option(help="Triggers a chain may go down.")] = 10,
    priority: Annotated[int, typer.Option(help="Priority of its runs.")] = 0,
    tenant: Annotated[str, typer.Option(help="Tenant of its runs (default: the source's).")] = "",
    store: StoreOption = None,
) -> None:
    """Add a trigger; its runs start once per finished run or webhook delivery."""
    from contextos.store.queue import queue_of
    from contextos.triggers import add_trigger, describe

    async def work(rt: Runtime) -> Any:
        queue = queue_of(rt.store)
        if queue is None:
            raise ContextOSError("this store keeps no run queue")
        return await add_trigger(
            queue,
            name,
            agent_ref,
            after=after,
            on=on,
            input=input,
            webhook=webhook,
            secret_env=secret_env,
            allow_cycle=allow_cycle,
            max_depth=max_depth,
            priority=priority,
            tenant=tenant,
        )

    added = _call(store, work)
    console.print(
        f"trigger [bold]{added.name}[/]: starts {added.agent_name}", Text(describe(added))
    )
    if added.secret_env:
        console.print(f"[dim]set {added.secret_env} where `contextos serve` runs[/]")


@trigger_app.command("list")
def trigger_list(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List triggers: what fires each one and what it starts."""
    from contextos.store.queue import queue_of
    from contextos.triggers import describe

    async def work(rt: Runtime) -> Any:
        queue = queue_of(rt.store)
        return [] if queue is None else await queue.list_triggers()

    rows = _call(store, work)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("[dim]no triggers — add one with `contextos trigger add`[/]")
        return
    table = Table(title=f"triggers ({len(rows)})", title_justify="left")
    for col in ("name", "fires", "starts", "input", "loops"):
        table.add_column(col, overflow="fold")
    for t in rows:
        default = "request body" if t.kind.value == "webhook" else "source output"
        loops = f"{'allowed' if t.allow_cycle else 'refused'}, depth ≤ {t.max_depth}"
        table.add_row(
            t.name,
            Text(describe(t)),
            Text(f"{t.agent_name} ({t.agent_ref})"),
            Text(t.input if t.input is not None else default),
            "-" if t.kind.value == "webhook" else loops,
        )
    console.print(table)


@trigger_app.command("remove")
def trigger_remove(
    name: Annotated[str, typer.Argument(help="The trigger to remove.")],
    store: StoreOption = None,
) -> None:
    """Remove a trigger (runs it started stay; firings it still owed are dropped)."""
    from contextos.store.queue import queue_of

    async def work(rt: Runtime) -> bool:
        queue = queue_of(rt.store)
        return queue is not None and await queue.remove_trigger(name)

    if not _call(store, work):
        _fail(ContextOSError(f"no trigger named {name!r}"))
    console.print(f"removed trigger [bold]{name}[/]")


@app.command()
def serve(
    store: StoreOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    agent: Annotated[
        list[str] | None,
        typer.Option(help="An agent POST /v1/runs may start, file.py:attr (repeatable)."),
    ] = None,
    any_agent: Annotated[
        bool, typer.Option(help="Start any agent reference a client names (trusted clients).")
    ] = False,
    token_env: Annotated[
        str | None, typer.Option(help="Env var with a bearer token every request must carry.")
    ] = None,
    worker: Annotated[bool, typer.Option(help="Also drive queued runs in this process.")] = False,
    concurrency: Annotated[int, typer.Option(help="Runs that worker drives at once.")] = 4,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the HTTP API (see docs/api.md): runs, events, interrupts, webhooks.

    Needs the api extra: pip install 'contextos\\[api]'.
    """
    import logging

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        from contextos.api import ApiConfig
        from contextos.api import serve as run_server
        from contextos.api.app import token_from_env
    except ImportError as exc:
        _fail(ContextOSError(f"the HTTP API needs {exc.name}: pip install 'contextos[api]'"))
    try:
        config = ApiConfig(
            store=store,
            agents=tuple(agent or ()),
            any_agent=any_agent,
            token=token_from_env(token_env),
            worker=worker,
            worker_concurrency=concurrency,
        )
        run_server(config, host=host, port=port, log_level=log_level)
    except ContextOSError as exc:
        _fail(exc)


@app.command()
def doctor(
    store: StoreOption = None,
    model: Annotated[
        str | None, typer.Option(help="Model string to check [default: $CONTEXTOS_MODEL].")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check the store (reachable, migrated) and the model configuration; changes nothing."""
    from contextos.worker import doctor as checks_for

    checks = asyncio.run(checks_for(store, model=model))
    if as_json:
        _print_json(checks)
    else:
        for c in checks:
            mark = "[green]ok[/]  " if c.ok else "[red]FAIL[/]"
            console.print(f"{mark} {c.name:10}", Text(c.detail))
    if not all(c.ok for c in checks):
        raise typer.Exit(code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
