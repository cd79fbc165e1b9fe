"""What every `contextos` command shares: the app, the options, errors and printing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from contextos import (
    ContextOSError,
    RunNotFound,
    RunOwner,
    RunResult,
    RunState,
    RunStatus,
    Runtime,
    open_store,
)

T = TypeVar("T")

app = typer.Typer(
    name="contextos",
    help="ContextOS: run agents durably, inspect them, resume them after a crash.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
console = Console()
err = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        console.print(f"contextos {metadata.version('contextos')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """ContextOS: run agents durably, inspect them, resume them after a crash."""


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="CONTEXTOS_STORE",
        help="Store URL: sqlite:///abs/path.db, sqlite:rel/path.db or a file path, or "
        "postgresql://… (default: .contextos/contextos.db)",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

AgentRefOption = Annotated[
    str | None,
    typer.Option("--agent", help="Agent reference, if not the one recorded at start."),
]

HINTS: dict[str, str] = {
    "run_not_found": "List runs with `contextos runs`.",
    "agent_changed": "Pass --allow-changed-agent to continue under the new definition.",
    "migration_error": "Run `contextos doctor` to check the store.",
}


def fail(exc: ContextOSError) -> NoReturn:
    # One line however narrow the terminal: people copy it, scripts grep it.
    err.print("[bold red]error:[/]", Text(exc.message), soft_wrap=True)
    hint = HINTS.get(exc.code)
    if hint:
        err.print(f"[dim]{hint}[/]", soft_wrap=True)
    raise typer.Exit(code=1)


def call(store: str | None, work: Callable[[Runtime], Awaitable[T]], *, create: bool = False) -> T:
    """Open a runtime on the store, run `work`, close, and turn our errors into messages.

    Only commands that `create` (start runs, add schedules…) may make a store that is missing.
    """

    async def main() -> T:
        runtime = Runtime(open_store(store, create=create))
        try:
            return await work(runtime)
        finally:
            await runtime.close()

    return guarded(lambda: asyncio.run(main()))


def guarded(work: Callable[[], T]) -> T:
    """Run `work`; our errors and a damaged SQLite file become one line, never a traceback."""
    try:
        return work()
    except ContextOSError as exc:
        fail(exc)
    except sqlite3.DatabaseError as exc:  # damage found past the first look at the file
        fail(ContextOSError(f"the store is damaged ({exc}); name another with --store"))


STOPPED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
"""Exit codes of `run`/`resume` stopped by a signal (the shell's 128 + signal number): the run
was handed back, resumable."""


def drive(
    store: str | None,
    work: Callable[[Runtime], Awaitable[RunResult]],
    as_json: bool,
    *,
    create: bool = False,
) -> None:
    """Drive a run in this process (`run`, `resume`), holding its lease as its driver.

    SIGINT or SIGTERM stops it cleanly: the step in flight finishes and is recorded, the run
    is released (resumable), and the command exits 130 or 143. A second signal cuts the step
    at once; what was recorded stays.
    """
    stopped: list[signal.Signals] = []

    async def main() -> RunResult:
        runtime = Runtime(
            open_store(store, create=create),
            worker_id=f"cli-{socket.gethostname()}-{os.getpid()}",
        )
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            stopped.append(sig)
            if len(stopped) == 1:
                err.print(
                    f"[yellow]{sig.name}: stopping after the current step[/] "
                    "[dim](again to stop at once)[/]"
                )
            runtime.drain(reason=f"stopped by {sig.name}", at_once=len(stopped) > 1)

        for sig in STOPPED_EXIT:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await work(runtime)
        finally:
            for sig in STOPPED_EXIT:
                loop.remove_signal_handler(sig)
            await runtime.close()

    result = guarded(lambda: asyncio.run(main()))
    if not stopped or result.status.is_terminal:
        finish(result, as_json)
        return
    print_result(result, as_json)
    err.print(
        f"[yellow]released after {stopped[0].name}[/], resumable: "
        f"`contextos resume {result.run_id}`"
    )
    raise typer.Exit(code=STOPPED_EXIT[stopped[0]])


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(value), indent=2, default=str) + "\n")


def age(ts: datetime) -> str:
    seconds = int((datetime.now(UTC) - ts).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def until(deadline: datetime | None, now: datetime) -> str:
    """`in 3h`, `in 12m`, `overdue`, or `never`, for listings."""
    if deadline is None:
        return "never"
    seconds = int((deadline - now).total_seconds())
    if seconds <= 0:
        return "overdue"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"in {seconds // size}{unit}"
    return f"in {seconds}s"


STATUS_STYLE = {
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.EXPIRED: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.QUEUED: "blue",
    RunStatus.INPUT_REQUIRED: "magenta",
    RunStatus.PAUSED: "yellow",
}


def counted(n: int, noun: str) -> str:
    """`1 turn`, `2 turns`."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def workflow_progress(state: RunState) -> str:
    """Where a workflow stands, in a few words: the nodes done, and those under way with the
    items each has finished."""
    total = len(state.workflow.nodes) if state.workflow is not None else len(state.nodes)
    done = sum(1 for node in state.nodes.values() if node.status == "completed")
    now = [_under_way(state, name) for name, n in state.nodes.items() if n.status == "running"]
    return f"{done} of {total} nodes done" + (f" · {', '.join(now)}" if now else "")


def _under_way(state: RunState, name: str) -> str:
    node = state.nodes[name]
    if node.items is None:
        return f"{name}…"
    children = state.children.values()
    finished = len(node.item_outputs)
    finished += sum(1 for c in children if c.contract.node == name and c.finished)
    return f"{name} ({finished} of {counted(len(node.items), 'item')})…"


def turns(n: int) -> str:
    return counted(n, "turn")


def print_result(result: RunResult, as_json: bool, *, owner: RunOwner | None = None) -> None:
    """The result in a few lines; with `owner`, who drives the run now (so not: resume it)."""
    if as_json:
        print_json(result)
        return
    style = STATUS_STYLE.get(result.status, "")
    console.print(f"run [bold]{result.run_id}[/] [{style}]{result.status}[/]")
    if result.output is not None:
        console.print(Text(result.output))
    if result.failure_reason is not None:
        why = result.failure_message or ""
        if why in ("", result.failure_reason.value):  # nothing more to say than the reason
            console.print(f"[red]{result.failure_reason}[/]")
        else:
            console.print(f"[red]{result.failure_reason}[/]:", Text(why))
    u = result.usage
    console.print(
        f"[dim]{turns(result.turns)} · "
        f"{u.input_tokens}+{u.output_tokens} tokens · "
        f"${u.cost_usd:.4f}[/]"
    )
    if owner is not None:
        since = f" since {owner.since:%H:%M:%S} UTC" if owner.since else ""
        console.print(
            f"[cyan]live:[/] driven by {owner.describe()}{since}, "
            f"lease renewed until {owner.expires_at:%H:%M:%S} UTC"
        )
    elif result.status is RunStatus.PAUSED:
        console.print(
            f"[yellow]paused:[/] continue with `contextos resume {result.run_id}` (an agent's "
            f'run also takes a message: `contextos send {result.run_id} "…"`)'
        )
    elif result.status is RunStatus.INPUT_REQUIRED and result.output is not None:
        console.print(
            f'[magenta]waiting for your next message:[/] `contextos send {result.run_id} "…"`'
        )
    elif result.status is RunStatus.INPUT_REQUIRED:
        console.print("[magenta]waiting for a person:[/] see `contextos inbox`")
    elif result.status is RunStatus.QUEUED:
        console.print(
            f"[dim]queued: a worker (`contextos worker`) drives it on, or drive it here with "
            f"`contextos resume {result.run_id}`[/]"
        )
    elif not result.status.is_terminal:
        console.print(f"[dim]continue with `contextos resume {result.run_id}`[/]")


def finish(result: RunResult, as_json: bool) -> None:
    """Print a driven run's result; exit non-zero when it ended without success."""
    print_result(result, as_json)
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.EXPIRED):
        raise typer.Exit(code=1)


PREFIX_SHOWN = 8
"""How many candidates an ambiguous id prefix lists."""


def resolve_run(store: str | None, given: str) -> str:
    """The run `given` names: itself when it is a run's id, else the one run whose id starts
    with it; a prefix without a dot names a top-level run, not the child runs below it (whose
    ids start with their parent's). Several: one line listing them, exit 1. None: `given`, for
    the command to say."""

    async def work(rt: Runtime) -> str:
        ids: list[str] = [r.run_id for r in await rt.runs(prefix=given, limit=PREFIX_SHOWN + 1)]
        if len(ids) == 1:
            return ids[0]
        if ids and given not in ids:  # the run itself may be among those not listed
            try:
                await rt.result(given)
            except RunNotFound:
                pass
            else:
                return given
            if "." not in given:
                found = await rt.runs(prefix=given, top_level=True, limit=PREFIX_SHOWN + 1)
                tops: list[str] = [r.run_id for r in found]
                if len(tops) == 1:
                    return tops[0]
                ids = tops or ids
            ambiguous("run", given, ids)
        return given

    return call(store, work)


def resolve_interrupt(store: str | None, given: str) -> str:
    """The interrupt `given` names: `RUN.iSEQ` with RUN a run's id or its unique prefix, or
    a unique prefix of a pending interrupt's id (as `contextos inbox` lists them)."""
    run_part, dot, tail = given.rpartition(".")
    if dot and run_part and tail[:1] == "i" and tail[1:].isdigit():
        return f"{resolve_run(store, run_part)}.{tail}"

    async def pending(rt: Runtime) -> list[str]:
        return [i.id for i in await rt.inbox(limit=10_000) if i.id.startswith(given)]

    ids = call(store, pending)
    if len(ids) > 1:
        ambiguous("interrupt", given, ids)
    return ids[0] if ids else given


def ambiguous(kind: str, given: str, ids: list[str]) -> NoReturn:
    shown = ", ".join(ids[:PREFIX_SHOWN]) + (", …" if len(ids) > PREFIX_SHOWN else "")
    fail(ContextOSError(f"{kind} id prefix {given!r} is ambiguous: {shown}; give more of it"))


def examples(*lines: str) -> str:
    """A command's help epilog: its examples, one a line, kept as written (never rewrapped)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
