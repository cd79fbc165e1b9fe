"""The knowledge-base scan: `contextos kb scan PATH`, the `kb_scan` workflow on one folder."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Annotated

import typer
from rich.text import Text

from contextos import (
    Approval,
    ContextOSError,
    RunNotFound,
    RunResult,
    RunStatus,
    Runtime,
    Workflow,
    load_runnable,
)
from contextos.cli.common import (
    JsonOption,
    StoreOption,
    app,
    call,
    err,
    examples,
    fail,
    print_result,
    resolve_interrupt,
    workflow_progress,
)
from contextos.jobs.kb import (
    SCANNER,
    FixOutcome,
    Report,
    ScanRequest,
    default_index,
    fix_frontmatter,
    fix_policy,
)

KB_SCAN = "contextos.jobs.kb:kb_scan"
"""The workflow's reference: what a resume, a worker or a schedule loads."""

PolicyOption = Annotated[
    str | None,
    typer.Option(
        help="The policy file whose [roles] table names the kb-editors who may approve a fix "
        "[default: the file CONTEXTOS_POLICY names].",
    ),
]

kb_app = typer.Typer(
    help="The knowledge-base scan: dead links, frontmatter, structure; only what is new.",
    no_args_is_help=True,
)
app.add_typer(kb_app, name="kb", short_help="Scan a knowledge base: links, frontmatter, structure.")


@kb_app.command(
    "scan",
    short_help="Scan a knowledge base and report what is new.",
    epilog=examples(
        "contextos kb scan ./kb",
        "contextos kb scan ./kb --full --json",
        "contextos kb scan ./kb --fix frontmatter --policy people.toml",
    ),
)
def scan(
    path: Annotated[str, typer.Argument(help="The knowledge base: a folder of Markdown.")],
    full: Annotated[bool, typer.Option(help="Read every page, not only what changed.")] = False,
    index: Annotated[
        str | None,
        typer.Option(help="The scan's state between runs [default: ./.contextos/kb/NAME.db]."),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(help="A host the link check may fetch (repeatable); none by default."),
    ] = None,
    sample_site: Annotated[
        bool,
        typer.Option(help="Check external links against the sample's loopback site."),
    ] = False,
    workflow: Annotated[
        str,
        typer.Option(
            help="The scan workflow (path.py:attr or module:attr), e.g. one that "
            "kb_scan_workflow built with another model for the summary."
        ),
    ] = KB_SCAN,
    fix: Annotated[
        str | None,
        typer.Option(
            help="frontmatter: propose adding the missing frontmatter; it is written only "
            "once a kb-editor approves that exact list (run the command again to apply it)."
        ),
    ] = None,
    policy: PolicyOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Scan a knowledge base and print the report: what is new, still open and fixed since
    the last scan of the same folder. Resumable (`contextos resume RUN`) like any run."""
    if not os.path.isdir(path):
        err.print(f"[bold red]error:[/] {path} is not a folder: give the knowledge base's path")
        raise typer.Exit(code=1)
    if fix not in (None, "frontmatter"):
        err.print("[bold red]error:[/] --fix takes one value: frontmatter")
        raise typer.Exit(code=1)
    try:
        flow = load_runnable(workflow)
        if fix:
            fix_policy(policy)  # before the scan: no one to approve, no fix
    except ContextOSError as exc:
        fail(exc)
    if not isinstance(flow, Workflow):
        err.print(f"[bold red]error:[/] {workflow} is an agent: give a scan workflow")
        raise typer.Exit(code=1)
    request = ScanRequest(
        root=os.path.realpath(path),
        index=os.path.realpath(index or default_index(path)),
        full=full,
        allow_hosts=tuple(allow_host or ()),
        sample_site=0 if sample_site else None,
    )
    run_id = f"run_{uuid.uuid4().hex[:20]}"

    async def work(rt: Runtime) -> RunResult:
        running = asyncio.create_task(
            rt.run(
                flow,
                request,
                run_id=run_id,
                agent_ref=workflow,
                principal=SCANNER,
            )
        )
        if as_json:
            return await running
        with err.status("scanning…") as status:
            while not running.done():
                await asyncio.wait({running}, timeout=0.25)
                try:
                    status.update(f"scanning: {workflow_progress(await rt.state(run_id))}")
                except RunNotFound:
                    continue
        return await running

    result = call(store, work, create=True)  # a scan is a run: it may start the store
    if result.status is not RunStatus.COMPLETED:
        print_result(result, as_json)
        raise typer.Exit(code=1 if result.status.is_terminal else 0)
    report = Report.model_validate(result.structured_output)
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(report.markdown())
        err.print(Text(f"run {result.run_id} · `contextos show {result.run_id}` draws it", "dim"))
    if fix:
        done = call(store, lambda rt: fix_frontmatter(store, path, report, policy=policy))
        print_fix(done)


def print_fix(done: FixOutcome) -> None:
    """What the fix wrote, and what waits for whom."""
    if done.written:
        err.print(f"[green]frontmatter added[/] to {len(done.written)} file(s):")
        for path in done.written:
            err.print(Text(f"  {path}"))
    for interrupt in done.waiting:
        action = interrupt.action
        err.print("[magenta]the fix waits for approval[/]:", Text(action.preview if action else ""))
        if action is not None and action.blast_radius:
            err.print("  blast radius:", Text(action.blast_radius))
        err.print(
            Text(
                f"  approve: contextos kb approve {interrupt.id} --as EDITOR, "
                "then run this command again",
                "dim",
            )
        )
    if not done.written and not done.waiting:
        err.print("[dim]no page is missing frontmatter[/]")


@kb_app.command(
    "approve",
    epilog=examples(
        "contextos kb approve run_3f2a9c.i12 --as erin --policy people.toml",
    ),
)
def approve(
    interrupt_id: Annotated[str, typer.Argument(help="The fix's interrupt (`contextos inbox`).")],
    approver: Annotated[str, typer.Option("--as", help="Who approves: a kb-editor.")],
    policy: PolicyOption = None,
    store: StoreOption = None,
) -> None:
    """Approve a proposed fix: exactly the files it lists, nothing more. Only someone the
    policy's [roles] table makes a kb-editor may."""
    interrupt_id = resolve_interrupt(store, interrupt_id)

    async def work(_: Runtime) -> Approval:
        async with Runtime(store, policy=fix_policy(policy)) as rt:
            return await rt.approve(interrupt_id, approver=approver)

    approval = call(store, work)
    err.print(f"[green]approved[/] {approval.id}: run the scan with --fix again to apply it")
