"""Operations: workers, limits, cron schedules, run triggers, the HTTP server, doctor, migrate."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from contextos import ConfigError, ContextOSError, Runtime, open_store
from contextos.cli.common import (
    JsonOption,
    StoreOption,
    age,
    app,
    call,
    console,
    err,
    examples,
    fail,
    print_json,
)
from contextos.workers import (
    WorkerConfig,
    add_schedule,
    add_trigger,
    list_limits,
    list_schedules,
    list_triggers,
    list_workers,
    remove_schedule,
    remove_trigger,
    run_worker,
    set_limit,
    what_fires,
)
from contextos.workers import (
    doctor as checks_for,
)

schedule_app = typer.Typer(
    help="Cron schedules: start a run of an agent at every tick, once across all workers.",
    no_args_is_help=True,
)
app.add_typer(schedule_app, name="schedule", short_help="Cron schedules: a run at every tick.")
trigger_app = typer.Typer(
    help="Triggers: start a run when a run of another agent ends, or on a webhook call.",
    no_args_is_help=True,
)
app.add_typer(
    trigger_app, name="trigger", short_help="Triggers: a run when a run ends, or on a webhook."
)


@app.command(
    short_help="Claim queued runs and drive them.",
    epilog=examples(
        "contextos worker",
        "contextos worker --store postgresql://db/contextos --concurrency 8",
        "contextos worker --agent support --no-schedules",
    ),
)
def worker(
    store: StoreOption = None,
    concurrency: Annotated[int, typer.Option(help="Runs driven at once.")] = 4,
    lease: Annotated[float, typer.Option(help="Lease seconds (renewed every third).")] = 30.0,
    poll: Annotated[
        float | None,
        typer.Option(
            help="Seconds between looks at an idle queue (default: 1 on SQLite, 30 on"
            " PostgreSQL, where NOTIFY wakes workers at once)."
        ),
    ] = None,
    agent: Annotated[
        list[str] | None, typer.Option(help="Claim only runs of this agent (repeatable).")
    ] = None,
    schedules: Annotated[bool, typer.Option(help="Fire due cron schedules.")] = True,
    triggers: Annotated[bool, typer.Option(help="Start the runs run triggers owe.")] = True,
    max_attempts: Annotated[
        int,
        typer.Option(
            help="Failed attempts before a run is failed (runtime_crashed, or tool_crashed"
            " when the last worker died during a tool call)."
        ),
    ] = 10,
    worker_id: Annotated[str | None, typer.Option(help="Name this worker.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Claim queued runs and drive them; SIGTERM drains (each run finishes its step).

    Run many, on many machines, against one store.
    """
    import logging

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
        fail(exc)


@app.command(
    short_help="List live workers and the runs they hold.",
    epilog=examples(
        "contextos workers",
        "contextos workers --all --json",
    ),
)
def workers(
    store: StoreOption = None,
    all_: Annotated[bool, typer.Option("--all", help="Include stopped and silent ones.")] = False,
    as_json: JsonOption = False,
) -> None:
    """List live workers and the runs they hold leases on."""
    rows = call(store, lambda rt: list_workers(rt.store, live_within_s=None if all_ else 60))
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("[dim]no live workers — start one with `contextos worker`[/]")
        return
    table = Table(title=f"workers ({len(rows)})", title_justify="left")
    for col in ("worker", "host", "pid", "status", "heartbeat", "leases"):
        table.add_column(col)
    for w in rows:
        leases = ", ".join(lease.run_id for lease in w.leases) or "-"
        beat = age(w.heartbeat_at) + " ago" if w.heartbeat_at else "-"
        table.add_row(
            w.worker_id,
            w.host,
            str(w.pid),
            w.status.value,
            beat,
            f"{len(w.leases)}/{w.concurrency} {leases}",
        )
    console.print(table)


@app.command(
    short_help="Show or set concurrency limits for all workers.",
    epilog=examples(
        "contextos limit",
        "contextos limit 20",
        "contextos limit 2 --agent '*'",
        "contextos limit --tenant acme --remove",
    ),
)
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

    async def work(rt: Runtime) -> Any:
        if remove or max_running is not None:
            limit = None if remove else max_running
            await set_limit(rt.store, limit, tenant=tenant, agent=agent)
        return await list_limits(rt.store)

    rows = call(store, work, create=remove or max_running is not None)
    if as_json:
        print_json(rows)
        return
    for lim in rows:
        console.print(f"{lim.scope.value:7} {lim.name or '-':20} {lim.max_running}")
    if not rows:
        console.print("[dim]no limits: workers take as much as their concurrency allows[/]")


@schedule_app.command(
    "add",
    epilog=examples(
        'contextos schedule add nightly reports.py:agent --cron "0 6 * * *"',
        'contextos schedule add weekly reports.py:agent --cron "0 9 * * 1"',
    ),
)
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

    async def work(rt: Runtime) -> Any:
        return await add_schedule(
            rt.store,
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
        added = call(store, work, create=True)
    except ValueError:
        fail(ContextOSError(f"unknown catch-up policy {catch_up!r}: use skip or run_once"))
    console.print(f"schedule [bold]{added.name}[/]: next tick {added.next_tick_at.isoformat()}")


@schedule_app.command(
    "list",
    epilog=examples(
        "contextos schedule list",
        "contextos schedule list --json",
    ),
)
def schedule_list(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List schedules with their next tick and last run."""
    rows = call(store, lambda rt: list_schedules(rt.store))
    if as_json:
        print_json(rows)
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


@schedule_app.command(
    "remove",
    epilog=examples(
        "contextos schedule remove nightly",
    ),
)
def schedule_remove(
    name: Annotated[str, typer.Argument(help="The schedule to remove.")],
    store: StoreOption = None,
) -> None:
    """Remove a schedule (runs it started stay)."""
    if not call(store, lambda rt: remove_schedule(rt.store, name)):
        fail(ContextOSError(f"no schedule named {name!r}"))
    console.print(f"removed schedule [bold]{name}[/]")


@trigger_app.command(
    "add",
    short_help="Add a trigger: a run per finished run or webhook call.",
    epilog=examples(
        "contextos trigger add summarise summary.py:agent --after support",
        "contextos trigger add hook hook.py:agent --webhook --secret-env HOOK_SECRET",
    ),
)
def trigger_add(
    name: Annotated[str, typer.Argument(help="A unique name (a webhook's URL path too).")],
    agent_ref: Annotated[
        str, typer.Argument(help="The agent or workflow to start: file.py:attr or mod:attr.")
    ],
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

    async def work(rt: Runtime) -> Any:
        return await add_trigger(
            rt.store,
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

    added = call(store, work, create=True)
    console.print(
        f"trigger [bold]{added.name}[/]: starts {added.agent_name}", Text(what_fires(added))
    )
    if added.secret_env:
        console.print(f"[dim]set {added.secret_env} where `contextos serve` runs[/]")


@trigger_app.command(
    "list",
    epilog=examples(
        "contextos trigger list",
        "contextos trigger list --json",
    ),
)
def trigger_list(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List triggers: what fires each one and what it starts."""
    rows = call(store, lambda rt: list_triggers(rt.store))
    if as_json:
        print_json(rows)
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
            Text(what_fires(t)),
            Text(f"{t.agent_name} ({t.agent_ref})"),
            Text(t.input if t.input is not None else default),
            "-" if t.kind.value == "webhook" else loops,
        )
    console.print(table)


@trigger_app.command(
    "remove",
    short_help="Remove a trigger (the runs it started stay).",
    epilog=examples(
        "contextos trigger remove summarise",
    ),
)
def trigger_remove(
    name: Annotated[str, typer.Argument(help="The trigger to remove.")],
    store: StoreOption = None,
) -> None:
    """Remove a trigger (runs it started stay; firings it still owed are dropped)."""
    if not call(store, lambda rt: remove_trigger(rt.store, name)):
        fail(ContextOSError(f"no trigger named {name!r}"))
    console.print(f"removed trigger [bold]{name}[/]")


@app.command(
    short_help="Serve the HTTP API and the control room.",
    epilog=examples(
        "contextos serve --agent examples/quickstart.py:agent --worker",
        "contextos serve --token-env CONTEXTOS_API_TOKEN --host 0.0.0.0",
        "contextos serve --oidc-issuer https://id.example --oidc-audience api",
    ),
)
def serve(
    store: StoreOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    agent: Annotated[
        list[str] | None,
        typer.Option(
            help="An agent or workflow POST /v1/runs may start, file.py:attr (repeatable)."
        ),
    ] = None,
    any_agent: Annotated[
        bool, typer.Option(help="Start any agent reference a client names (trusted clients).")
    ] = False,
    token_env: Annotated[
        str | None,
        typer.Option(help="Env var with one shared token that acts as the local operator."),
    ] = None,
    open_access: Annotated[
        bool,
        typer.Option(
            "--open", help="Requests without a token act as the local operator (only you)."
        ),
    ] = False,
    oidc_issuer: Annotated[
        str | None,
        typer.Option(help="Also accept tokens this OpenID Connect issuer signed (its URL)."),
    ] = None,
    oidc_audience: Annotated[
        str | None, typer.Option(help="The audience those tokens must carry (a client id).")
    ] = None,
    oidc_jwks: Annotated[
        str | None, typer.Option(help="The issuer's key URL (default: from its discovery).")
    ] = None,
    oidc_tenant_claim: Annotated[
        str, typer.Option(help="The token claim that names the user's tenant.")
    ] = "tenant",
    oidc_roles_claim: Annotated[
        str, typer.Option(help="The token claim that lists the user's roles.")
    ] = "roles",
    worker: Annotated[bool, typer.Option(help="Also drive queued runs in this process.")] = False,
    concurrency: Annotated[int, typer.Option(help="Runs that worker drives at once.")] = 4,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="The largest request body accepted (413 beyond).")
    ] = 1 << 20,
    webhook_tolerance: Annotated[
        float,
        typer.Option(
            min=1, max=86400, help="Seconds a signed webhook's timestamp may be from this clock."
        ),
    ] = 300.0,
) -> None:
    """Serve the HTTP API (see docs/api.md) and the control room at /: runs, events,
    interrupts, webhooks. Each request acts as its token's principal (`contextos token`).

    Needs the api extra: pip install 'contextos[api]'.
    """
    import logging

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        from contextos.api import ApiConfig, OidcConfig, token_from_env
        from contextos.api import serve as run_server
    except ImportError as exc:
        fail(ContextOSError(f"the HTTP API needs {exc.name}: pip install 'contextos[api]'"))
    try:
        oidc = None
        if oidc_issuer is not None or oidc_audience is not None:
            if oidc_issuer is None:
                raise ConfigError("--oidc-audience needs --oidc-issuer URL too")
            oidc = OidcConfig(
                issuer=oidc_issuer,
                audience=oidc_audience or "",
                jwks_url=oidc_jwks,
                tenant_claim=oidc_tenant_claim,
                roles_claim=oidc_roles_claim,
            )
        config = ApiConfig(
            store=store,
            oidc=oidc,
            agents=tuple(agent or ()),
            any_agent=any_agent,
            token=token_from_env(token_env),
            open_access=open_access,
            worker=worker,
            worker_concurrency=concurrency,
            max_body_bytes=max_body_bytes,
            webhook_tolerance_s=webhook_tolerance,
        )
        if not worker:
            err.print(
                "[yellow]no worker in this process:[/] runs started over HTTP wait until a "
                "`contextos worker` claims them (pass --worker to drive them here)",
                soft_wrap=True,
            )
        run_server(config, host=host, port=port, log_level=log_level)
    except ContextOSError as exc:
        fail(exc)


@app.command(
    short_help="Check the store and the model; changes nothing.",
    epilog=examples(
        "contextos doctor",
        "contextos doctor --store postgresql://db/contextos --json",
    ),
)
def doctor(
    store: StoreOption = None,
    model: Annotated[
        str | None, typer.Option(help="Model string to check [default: $CONTEXTOS_MODEL].")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check the store (reachable, migrated) and the model configuration; changes nothing."""
    checks = asyncio.run(checks_for(store, model=model))
    if as_json:
        print_json(checks)
    else:
        for c in checks:
            mark = "[green]ok[/]  " if c.ok else "[red]FAIL[/]"
            console.print(f"{mark} {c.name:10}", Text(c.detail))
    if not all(c.ok for c in checks):
        raise typer.Exit(code=1)


@app.command(
    short_help="Bring the store's schema to this version.",
    epilog=examples(
        "contextos migrate --store postgresql://owner@db/contextos",
    ),
)
def migrate(store: StoreOption = None) -> None:
    """Bring the store's schema to this ContextOS's version (first use does it too).

    Run it as the database role that owns the tables when the other processes run as a role
    that may not change them.
    """

    async def _migrate() -> int:
        opened = open_store(store)
        try:
            version: int = await opened.migrate()  # type: ignore[attr-defined]
            return version
        finally:
            await opened.close()

    try:
        version = asyncio.run(_migrate())
    except ContextOSError as exc:
        fail(exc)
    console.print(f"schema at version {version}")
