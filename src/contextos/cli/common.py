"""What every `contextos` command shares: the app, the options, errors and printing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from contextos import ContextOSError, RunResult, RunStatus, Runtime

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

HINTS: dict[str, str] = {
    "run_not_found": "List runs with `contextos runs`.",
    "config_error": "See `contextos --help`.",
    "agent_changed": "Pass --allow-changed-agent to continue under the new definition.",
    "migration_error": "Run `contextos doctor` to check the store.",
}


def fail(exc: ContextOSError) -> NoReturn:
    err.print("[bold red]error:[/]", Text(exc.message))
    hint = HINTS.get(exc.code)
    if hint:
        err.print(f"[dim]{hint}[/]")
    raise typer.Exit(code=1)


def call(store: str | None, work: Callable[[Runtime], Awaitable[T]]) -> T:
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
        fail(exc)


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
}


def print_result(result: RunResult, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    style = STATUS_STYLE.get(result.status, "")
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


def finish(result: RunResult, as_json: bool) -> None:
    """Print a driven run's result; exit non-zero when it ended without success."""
    print_result(result, as_json)
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.EXPIRED):
        raise typer.Exit(code=1)
