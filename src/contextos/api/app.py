"""The HTTP API: a FastAPI app over one Runtime, versioned under /v1.

Like the CLI, it calls only the public API (`contextos` and `contextos.workers`): starting a run
queues it for the workers (or for a worker inside the server, with `worker=True`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from contextos import (
    ConfigError,
    RunId,
    RunNotFound,
    RunState,
    RunStatus,
    Runtime,
    Workflow,
    load_runnable,
)
from contextos.api import errors
from contextos.api.auth import PrincipalDep, interrupt_of, run_of, visible
from contextos.api.config import MAX_SEQ, Api, ApiConfig
from contextos.api.control import router as control_router
from contextos.api.errors import ApiError
from contextos.api.hooks import router as hooks_router
from contextos.api.improve import router as improve_router
from contextos.api.limits import BodyLimit
from contextos.api.schemas import (
    Answer,
    Approve,
    CancelRun,
    Deny,
    StartRun,
    jsonable,
    run_view,
    summary_view,
)
from contextos.api.stream import router as stream_router
from contextos.workers import Worker, WorkerConfig

API_VERSION = "v1"

SHUTDOWN_GRACE_S = 5
"""How long a stopping server lets open requests finish; live event streams are then cut."""

STATIC = Path(__file__).parent / "static"
"""The control room: one page and its script, served as they are (no build step)."""


def _api(request: Request) -> Api:
    api: Api = request.app.state.api
    return api


ApiDep = Annotated[Api, Depends(_api)]


def create_app(config: ApiConfig | None = None) -> FastAPI:
    """The app; the runtime (and the in-process worker) start with it and stop with it.

    The agents it may start are imported now: a bad reference fails here (ConfigError), not at
    the first request.
    """
    cfg = config or ApiConfig()
    if not cfg.max_body_bytes >= 1:
        raise ConfigError(f"max_body_bytes must be at least 1, not {cfg.max_body_bytes}")
    if not 0 < cfg.webhook_tolerance_s < float("inf"):
        raise ConfigError(
            f"webhook_tolerance_s must be a positive number of seconds, not "
            f"{cfg.webhook_tolerance_s}"
        )
    served = {ref: load_runnable(ref) for ref in cfg.agents}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(cfg.store, policy=cfg.policy)
        worker_task: asyncio.Task[None] | None = None
        worker = None
        try:
            app.state.api = Api(cfg, runtime, served)
            if cfg.worker:
                worker = Worker(
                    cfg.store,
                    config=WorkerConfig(concurrency=cfg.worker_concurrency),
                    policy=cfg.policy,
                )
                worker_task = asyncio.create_task(worker.run())
            yield
        finally:
            if worker is not None and worker_task is not None:
                worker.stop()
                await asyncio.gather(worker_task, return_exceptions=True)
            await runtime.close()

    app = FastAPI(
        title="ContextOS",
        version=API_VERSION,
        lifespan=lifespan,
        docs_url=None,  # served below from the installed Swagger UI, not from a CDN
        openapi_url=f"/{API_VERSION}/openapi.json",
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "api": API_VERSION}

    @app.get("/v1/me")
    async def me(principal: PrincipalDep) -> dict[str, Any]:
        """Who the token acts as."""
        return {
            "user": principal.id,
            "tenant": principal.tenant,
            "roles": list(principal.roles),
            "scopes": list(principal.scopes),
        }

    @app.get("/", include_in_schema=False)
    async def control_room() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # The interactive schema works offline: its scripts come from this server.
    assets = f"/{API_VERSION}/docs-assets"
    app.mount(assets, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get(f"/{API_VERSION}/docs", include_in_schema=False)
    async def interactive_schema() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=f"/{API_VERSION}/openapi.json",
            title="ContextOS API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon-32x32.png",
        )

    @app.post("/v1/runs", status_code=201)
    async def start_run(
        api: ApiDep,
        principal: PrincipalDep,
        body: StartRun,
        wait: Annotated[bool, Query(description="Wait until the run ends or waits.")] = False,
        wait_s: Annotated[
            float,
            Query(alias="timeout", gt=0, allow_inf_nan=False, description="Seconds to wait."),
        ] = 30.0,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JSONResponse:
        ref, agent = api.agent(body.agent)
        if not isinstance(body.input, str) and not isinstance(agent, Workflow):
            raise ApiError(
                422,
                "invalid_request",
                f"agent {agent.name} takes text as its input, not a JSON object",
                hint="Send the task as a string; a JSON object is a workflow's input.",
            )
        if wait_s > api.config.max_wait_s:
            raise ApiError(
                422,
                "invalid_request",
                f"timeout {wait_s:g}s is longer than this server waits "
                f"({api.config.max_wait_s:g}s)",
                hint="Wait less, then poll GET /v1/runs/{id}.",
            )
        if body.tenant is not None and body.tenant != principal.tenant:
            raise ApiError(
                403,
                "tenant_forbidden",
                f"this token acts in tenant {principal.tenant!r}, not {body.tenant!r}",
                hint="Leave `tenant` out (runs start in the token's tenant) or use a token of "
                "that tenant.",
            )
        rt = api.runtime
        key = f"api:{principal.tenant}:{idempotency_key}" if idempotency_key else None
        run_id: RunId | None = None
        created = True
        if key is not None:
            # The id derives from the key, so a retry finds the first request's run.
            run_id = RunId("run_" + hashlib.sha256(key.encode()).hexdigest()[:20])
            try:
                await rt.store.get_run(run_id)
                created = False
            except RunNotFound:
                pass
        if created:
            run_id = await rt.start(
                agent,
                body.input,
                run_id=run_id,
                agent_ref=ref,
                metadata=body.metadata,
                idempotency_key=key,
                priority=body.priority,
                tenant=principal.tenant,
                principal=principal,
            )
        assert run_id is not None
        state = await run_of(api, principal, run_id)
        # `principal` is the runtime's own key (the bound principal), not part of the request.
        asked = {k: v for k, v in state.metadata.items() if k != "principal"}
        # a workflow keeps its input as the JSON its type gives (spacing, key order)
        if not created and (state.input, state.agent_ref, asked) != (
            agent.input_text(body.input) if isinstance(agent, Workflow) else body.input,
            ref,
            body.metadata,
        ):
            raise ApiError(
                409,
                "idempotency_key_reused",
                f"Idempotency-Key {idempotency_key!r} already started run {run_id} with a "
                "different agent, input or metadata",
                hint="Use a new key for a new request; retry with the same body to get the run.",
                run_id=run_id,
            )
        code = 201 if created else 200
        if wait:
            state, ended = await _wait(rt, run_id, wait_s)
            if not ended:
                code = 202
        return JSONResponse(run_view(state), status_code=code)

    @app.get("/v1/runs")
    async def list_runs(
        api: ApiDep,
        principal: PrincipalDep,
        status: Annotated[
            RunStatus | None, Query(description="Only runs with this status.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> dict[str, Any]:
        rows = await api.runtime.runs(status=status, limit=limit, tenant=principal.tenant)
        return {"runs": [summary_view(r) for r in rows]}

    @app.get("/v1/runs/{run_id}")
    async def get_run(api: ApiDep, principal: PrincipalDep, run_id: str) -> dict[str, Any]:
        return run_view(await run_of(api, principal, run_id))

    @app.get("/v1/runs/{run_id}/events")
    async def run_events(
        api: ApiDep,
        principal: PrincipalDep,
        run_id: str,
        after: Annotated[
            int, Query(ge=0, le=MAX_SEQ, description="Only events with a greater seq.")
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        await run_of(api, principal, run_id)
        entries = await api.runtime.timeline(run_id, after_seq=after)
        page = entries[:limit]
        more = len(entries) > limit
        return {
            "run_id": run_id,
            "events": [e.data for e in page],
            "next_after": page[-1].seq if more else None,
        }

    @app.post("/v1/runs/{run_id}/cancel")
    async def cancel_run(
        api: ApiDep,
        principal: PrincipalDep,
        run_id: str,
        body: Annotated[CancelRun | None, Body()] = None,
    ) -> dict[str, Any]:
        state = await run_of(api, principal, run_id)
        result = await api.runtime.cancel(
            state.run_id, reason=body.reason if body else "", actor=principal.ref
        )
        return run_view(await api.runtime.state(result.run_id))

    @app.get("/v1/interrupts")
    async def inbox(
        api: ApiDep, principal: PrincipalDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
    ) -> dict[str, Any]:
        waiting = await api.runtime.inbox(limit=limit, tenant=principal.tenant)
        pending = await visible(api, principal, waiting)
        return {"interrupts": [i.to_dict() for i in pending]}

    @app.post("/v1/interrupts/{interrupt_id}/approve")
    async def approve(
        api: ApiDep, principal: PrincipalDep, interrupt_id: str, body: Approve
    ) -> dict[str, Any]:
        await interrupt_of(api, principal, interrupt_id)
        approval = await api.runtime.approve(
            interrupt_id,
            approver=principal,
            expires_in=body.expires_in,
            conditions=body.conditions,
            action_hash=body.action_hash,
        )
        view: dict[str, Any] = jsonable(approval)
        return view

    @app.post("/v1/interrupts/{interrupt_id}/deny")
    async def deny(
        api: ApiDep, principal: PrincipalDep, interrupt_id: str, body: Deny
    ) -> dict[str, Any]:
        await interrupt_of(api, principal, interrupt_id)
        await api.runtime.deny(interrupt_id, approver=principal, reason=body.reason)
        return {"interrupt_id": interrupt_id, "denied": True, "by": principal.id}

    @app.post("/v1/interrupts/{interrupt_id}/answer")
    async def answer(
        api: ApiDep, principal: PrincipalDep, interrupt_id: str, body: Answer
    ) -> dict[str, Any]:
        await interrupt_of(api, principal, interrupt_id)
        parsed = await api.runtime.answer(interrupt_id, body.value, answered_by=principal.id)
        return {"interrupt_id": interrupt_id, "answer": jsonable(parsed)}

    app.include_router(stream_router)
    app.include_router(hooks_router)
    app.include_router(control_router)
    app.include_router(improve_router)
    return app


async def _wait(rt: Runtime, run_id: RunId, timeout_s: float) -> tuple[RunState, bool]:
    """Poll the run until it ends, waits for a person or pauses; (state, whether it got
    there)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while True:
                summary = await rt.store.get_run(run_id)
                if summary.status.is_terminal or summary.status.is_idle:
                    break
                await asyncio.sleep(0.1)
    state = await rt.state(run_id)
    return state, state.is_terminal or state.status.is_idle


def serve(
    config: ApiConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
) -> None:
    """Run the API with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,  # live streams end only when cut
    )


def token_from_env(var: str | None) -> str | None:
    """The bearer token named by `--token-env`; ConfigError when that variable is unset."""
    if var is None:
        return None
    token = os.environ.get(var)
    if not token:
        raise ConfigError(f"--token-env {var}: the environment variable {var} is not set")
    return token


__all__ = ["API_VERSION", "Api", "ApiConfig", "create_app", "serve", "token_from_env"]
