"""People answering runs: the inbox, approvals, denials, answers, revocations."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from contextos.cli.common import (
    HINTS,
    JsonOption,
    StoreOption,
    age,
    app,
    call,
    console,
    err,
    examples,
    print_json,
    resolve_interrupt,
    until,
)

#
# Who is acting comes from --as (default: $CONTEXTOS_USER, else the login name); which roles
# they hold comes from the runtime's policy ($CONTEXTOS_POLICY).

HINTS.update(
    {
        "approval_refused": "See the interrupt with `contextos inbox`.",
        "interrupt_not_found": "List pending interrupts with `contextos inbox`.",
        "answer_invalid": "Answers must match the schema shown by `contextos inbox --json`.",
        "interrupt_expired": "See what happened with `contextos show RUN`.",
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


@app.command(
    short_help="List interrupts waiting for a person.",
    epilog=examples(
        "contextos inbox",
        "contextos inbox --json",
    ),
)
def inbox(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option(min=1, help="How many waiting runs to look at.")] = 200,
    as_json: JsonOption = False,
) -> None:
    """List interrupts waiting for a person, across runs, with what each one would do."""
    pending = call(store, lambda rt: rt.inbox(limit=limit))
    if as_json:
        print_json([i.to_dict() for i in pending])
        return
    if not pending:
        console.print("[dim]nothing is waiting for a person[/]")
        return
    # The id is what people copy into `approve`: never cut or wrapped. The run is the id's
    # part before `.iN`; what the interrupt asks wraps in one column so that 80 fit.
    table = Table(title=f"inbox ({len(pending)})", title_justify="left")
    table.add_column("interrupt", no_wrap=True, min_width=max(len(i.id) for i in pending))
    table.add_column("asks", overflow="fold", ratio=1)
    table.add_column("age", no_wrap=True)
    table.add_column("expires", overflow="fold")
    now = datetime.now(UTC)
    for i in pending:
        asks = Text(i.kind.value, style="magenta")
        asks.append("\n").append(i.prompt)
        if i.action and i.action.blast_radius:
            asks.append("\n").append(i.action.blast_radius, style="dim")
        if i.approver_roles:
            asks.append("\nneeds " + " + ".join(i.approver_roles), style="dim")
        deadline = i.deadline
        table.add_row(
            i.id,
            asks,
            age(i.raised_at),
            "never"
            if deadline is None
            else f"{until(deadline.expires_at, now)} ({deadline.on_expiry})",
        )
    console.print(table)


@app.command(
    short_help="Approve the frozen action of an interrupt.",
    epilog=examples(
        "contextos approve run_3f2a9c.i7",
        "contextos approve run_3f.i7 --as alice --condition max_amount=500",
        "contextos approve run_3f2a9c.i7 --hash 9b1f… --expires-in 600",
    ),
)
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
    interrupt_id = resolve_interrupt(store, interrupt_id)
    approval = call(
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
        print_json(approval)
        return
    console.print(
        f"[green]approved[/] {interrupt_id} as [bold]{approval.id}[/] by {approval.approver}, "
        f"valid until {approval.expires_at.isoformat()}"
    )
    console.print(f"[dim]continue with `contextos resume {approval.run_id}`[/]")


@app.command(
    short_help="Refuse an interrupt's action; the run goes on.",
    epilog=examples(
        'contextos deny run_3f2a9c.i7 --reason "not this customer"',
    ),
)
def deny(
    interrupt_id: Annotated[str, typer.Argument(help="The interrupt whose action to refuse.")],
    reason: Annotated[str, typer.Option(help="Why; the model is told.")] = "",
    store: StoreOption = None,
    approver: AsOption = None,
) -> None:
    """Refuse the action of an interrupt: that action ends, the run goes on without it."""
    interrupt_id = resolve_interrupt(store, interrupt_id)
    call(store, lambda rt: rt.deny(interrupt_id, approver=approver or _me(), reason=reason))
    console.print(f"[yellow]denied[/] {interrupt_id}")


@app.command(
    short_help="Answer an interrupt: information, a choice, a review.",
    epilog=examples(
        "contextos answer run_3f2a9c.i4 yes",
        'contextos answer run_3f2a9c.i4 \'{"city": "Lyon"}\' --as alice',
    ),
)
def answer(
    interrupt_id: Annotated[str, typer.Argument(help="The interrupt to answer.")],
    value: Annotated[str, typer.Argument(help="The answer: a word, or a JSON object.")],
    store: StoreOption = None,
    who: AsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Answer an interrupt (information, a choice, a review, an external confirmation)."""
    interrupt_id = resolve_interrupt(store, interrupt_id)
    parsed = call(store, lambda rt: rt.answer(interrupt_id, value, answered_by=who or _me()))
    if as_json:
        print_json(parsed)
        return
    console.print(f"[green]answered[/] {interrupt_id}:", Text(json.dumps(parsed)))


@app.command(
    short_help="Withdraw an approval before its action runs.",
    epilog=examples(
        'contextos revoke apr.run_3f2a9c.9 --reason "amount changed"',
    ),
)
def revoke(
    approval_id: Annotated[str, typer.Argument(help="The approval to withdraw (apr.…).")],
    reason: Annotated[str, typer.Option(help="Why (recorded on the run).")] = "",
    store: StoreOption = None,
    who: AsOption = None,
) -> None:
    """Withdraw an approval; an action that has not run yet will not run on it."""
    revoked = call(store, lambda rt: rt.revoke(approval_id, revoked_by=who or _me(), reason=reason))
    console.print(f"[yellow]revoked[/] {revoked.id} (was by {revoked.approver})")
