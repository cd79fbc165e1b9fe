"""`contextos token`: issue, list and revoke the API tokens `contextos serve` accepts."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from contextos import ContextOSError, issue_token, list_tokens, revoke_token
from contextos.cli.common import JsonOption, StoreOption, app, call, console, fail, print_json

token_app = typer.Typer(
    help="API tokens: each acts as one user of one tenant, with its roles.", no_args_is_help=True
)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option(help="The tenant it acts in.")],
    user: Annotated[str, typer.Option(help="The user it acts as.")],
    role: Annotated[
        list[str] | None,
        typer.Option(help="An approver role it may use, if the policy gives it (repeatable)."),
    ] = None,
    scope: Annotated[
        list[str] | None, typer.Option(help="A scope its runs may use (repeatable).")
    ] = None,
    label: Annotated[str, typer.Option(help="What it is for.")] = "",
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Issue a token and print it once: only a hash of it is kept."""
    record, secret = call(
        store,
        lambda rt: issue_token(
            rt.store,
            tenant=tenant,
            user=user,
            roles=tuple(role or ()),
            scopes=tuple(scope or ()),
            label=label,
        ),
        create=True,
    )
    if as_json:
        print_json({"token": secret, "record": record})
        return
    print(secret)  # alone on stdout, so that TOKEN=$(contextos token create …) works
    typer.echo(
        f"token {record.token_id}: {record.user} in tenant {record.tenant}, roles "
        f"{', '.join(record.roles) or 'none'}. Shown once; send it as "
        "Authorization: Bearer TOKEN.",
        err=True,
    )


@token_app.command("list")
def token_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List tokens (never their secrets), revoked ones too."""
    rows = call(store, lambda rt: list_tokens(rt.store, tenant=tenant))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("[dim]no tokens — issue one with `contextos token create`[/]")
        return
    table = Table(title=f"tokens ({len(rows)})", title_justify="left")
    for col in ("id", "tenant", "user", "roles", "scopes", "label", "created", "revoked"):
        table.add_column(col, overflow="fold")
    for t in rows:
        table.add_row(
            t.token_id,
            t.tenant,
            t.user,
            ", ".join(t.roles),
            ", ".join(t.scopes),
            t.label,
            f"{t.created_at:%Y-%m-%d %H:%M}",
            f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "",
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (from `contextos token list`).")],
    store: StoreOption = None,
) -> None:
    """Revoke a token: the server refuses it from the next request on."""
    if not call(store, lambda rt: revoke_token(rt.store, token_id)):
        fail(ContextOSError(f"no live token with id {token_id!r}; see `contextos token list`"))
    console.print(f"revoked token [bold]{token_id}[/]")
