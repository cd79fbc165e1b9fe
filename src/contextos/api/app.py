"""The HTTP API: a FastAPI app over one Runtime, versioned under /v1.

Like the CLI, it calls only the public API (`contextos` and `contextos.workers`): starting a run
queues it for the workers (or for a worker inside the server, with `worker=True`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse

from contextos import (
    Agent,
    ConfigError,
    RunId,
    RunNotFound,
    RunState,
    RunStatus,
    Runtime,
    load_agent,
)
from contextos.api import errors
from contextos.api.errors import ApiError
from contextos.api.hooks import router as hooks_router
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
from contextos.workers import SIGNATURE_TOLERANCE_S, Worker, WorkerConfig

API_VERSION = "v1"

_MAX_SEQ = 2**63 - 1  # a 64-bit integer in every store


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiConfig:
    """How `contextos serve` serves."""

    store: str | None = None
    """Store URL (None: $CONTEXTOS_STORE, else ./.contextos/contextos.db)."""
    agents: tuple[str, ...] = ()
    """Agent references `POST /v1/runs` may start, named by reference or by agent name."""
    any_agent: bool = False
    """Start any importable agent reference a client names (trusted clients only)."""
    token: str | None = None
    """Bearer token every request but webhooks and /v1/health must carry (None: no check)."""
    worker: bool = False
    """Also drive queued runs inside the server process."""
    worker_concurrency: int = 4
    """Runs that in-process worker drives at once."""
    policy: str | None = None
    """Policy file for approvals (None: $CONTEXTOS_POLICY)."""
    max_wait_s: float = 300.0
    """The longest `?wait=true&timeout=` a client may ask for."""
    max_body_bytes: int = 1 << 20
    """The largest request body accepted (413 beyond, before it is read whole)."""
    webhook_tolerance_s: float = SIGNATURE_TOLERANCE_S
    """How far a signed webhook delivery's timestamp may be from the server's clock."""


class Api:
    """What the routes share: the runtime, the configuration, the agents allowed."""

    def __init__(self, config: ApiConfig, runtime: Runtime, agents: dict[str, Agent]) -> None:
        self.config = config
        self.runtime = runtime
        self.agents = dict(agents)
        """Loaded agents by reference (also the webhook triggers' cache)."""
        self.allowed: dict[str, str] = {}
        """Allowed agent reference or name -> reference."""
        for ref, agent in agents.items():
            self.allowed[ref] = ref
            self.allowed.setdefault(agent.name, ref)

    def agent(self, name: str) -> tuple[str, Agent]:
        """The reference and agent a client asked for, if this server may start it."""
        ref = name if self.config.any_agent else self.allowed.get(name)
        if ref is None:
            served = ", ".join(sorted(self.allowed)) or "none"
            raise ApiError(
                422,
                "unknown_agent",
                f"this server does not start agent {name!r} (it starts: {served})",
                hint="Name one of those, or restart `contextos serve` with --agent REF.",
                agent=name,
            )
        agent = self.agents.get(ref)
        if agent is None:
            try:
                agent = self.agents[ref] = load_agent(ref)
            except ConfigError as exc:
                raise ApiError(
                    422,
                    "unknown_agent",
                    exc.message,
                    hint="Use path/to/file.py:attr or package.module:attr, importable by the "
                    "server and the workers.",
                    agent=name,
                ) from exc
        return ref, agent


def _api(request: Request) -> Api:
    api: Api = request.app.state.api
    return api


def _authorized(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    token = _api(request).config.token
    if token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong bearer token",
            hint="Send Authorization: Bearer TOKEN (the server's --token-env variable).",
        )


ApiDep = Annotated[Api, Depends(_api)]


def _run_id(text: str) -> RunId:
    """A run id from a URL; text no store can look up (a NUL) names no run."""
    if "\x00" in text:
        raise RunNotFound(text)
    return RunId(text)


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
    served = {ref: load_agent(ref) for ref in cfg.agents}

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
        docs_url=f"/{API_VERSION}/docs",
        openapi_url=f"/{API_VERSION}/openapi.json",
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    auth = [Depends(_authorized)]

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "api": API_VERSION}

    @app.post("/v1/runs", dependencies=auth, status_code=201)
    async def start_run(
        api: ApiDep,
        body: StartRun,
        wait: Annotated[bool, Query(description="Wait until the run ends or waits.")] = False,
        wait_s: Annotated[
            float,
            Query(alias="timeout", gt=0, allow_inf_nan=False, description="Seconds to wait."),
        ] = 30.0,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> JSONResponse:
        ref, agent = api.agent(body.agent)
        if wait_s > api.config.max_wait_s:
            raise ApiError(
                422,
                "invalid_request",
                f"timeout {wait_s:g}s is longer than this server waits "
                f"({api.config.max_wait_s:g}s)",
                hint="Wait less, then poll GET /v1/runs/{id}.",
            )
        rt = api.runtime
        key = f"api:{idempotency_key}" if idempotency_key else None
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
                tenant=body.tenant,
            )
        assert run_id is not None
        state = await rt.state(run_id)
        # `principal` is the runtime's own key (the bound principal), not part of the request.
        asked = {k: v for k, v in state.metadata.items() if k != "principal"}
        if not created and (state.input, state.agent_ref, asked) != (
            body.input,
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

    @app.get("/v1/runs", dependencies=auth)
    async def list_runs(
        api: ApiDep,
        status: Annotated[
            RunStatus | None, Query(description="Only runs with this status.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> dict[str, Any]:
        rows = await api.runtime.runs(status=status, limit=limit)
        return {"runs": [summary_view(r) for r in rows]}

    @app.get("/v1/runs/{run_id}", dependencies=auth)
    async def get_run(api: ApiDep, run_id: str) -> dict[str, Any]:
        return run_view(await api.runtime.state(_run_id(run_id)))

    @app.get("/v1/runs/{run_id}/events", dependencies=auth)
    async def run_events(
        api: ApiDep,
        run_id: str,
        after: Annotated[
            int, Query(ge=0, le=_MAX_SEQ, description="Only events with a greater seq.")
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        rid = _run_id(run_id)
        entries = await api.runtime.timeline(rid, after_seq=after)
        if not entries:
            await api.runtime.store.get_run(rid)  # past its end, or no such run at all
        page = entries[:limit]
        more = len(entries) > limit
        return {
            "run_id": run_id,
            "events": [e.data for e in page],
            "next_after": page[-1].seq if more else None,
        }

    @app.post("/v1/runs/{run_id}/cancel", dependencies=auth)
    async def cancel_run(
        api: ApiDep, run_id: str, body: Annotated[CancelRun | None, Body()] = None
    ) -> dict[str, Any]:
        result = await api.runtime.cancel(
            _run_id(run_id), reason=body.reason if body else "", actor="user:api"
        )
        return run_view(await api.runtime.state(result.run_id))

    @app.get("/v1/interrupts", dependencies=auth)
    async def inbox(
        api: ApiDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
    ) -> dict[str, Any]:
        pending = await api.runtime.inbox(limit=limit)
        return {"interrupts": [i.to_dict() for i in pending]}

    @app.post("/v1/interrupts/{interrupt_id}/approve", dependencies=auth)
    async def approve(api: ApiDep, interrupt_id: str, body: Approve) -> dict[str, Any]:
        approval = await api.runtime.approve(
            interrupt_id,
            approver=body.approver,
            expires_in=body.expires_in,
            conditions=body.conditions,
            action_hash=body.action_hash,
        )
        view: dict[str, Any] = jsonable(approval)
        return view

    @app.post("/v1/interrupts/{interrupt_id}/deny", dependencies=auth)
    async def deny(api: ApiDep, interrupt_id: str, body: Deny) -> dict[str, Any]:
        await api.runtime.deny(interrupt_id, approver=body.approver, reason=body.reason)
        return {"interrupt_id": interrupt_id, "denied": True, "by": body.approver}

    @app.post("/v1/interrupts/{interrupt_id}/answer", dependencies=auth)
    async def answer(api: ApiDep, interrupt_id: str, body: Answer) -> dict[str, Any]:
        parsed = await api.runtime.answer(interrupt_id, body.value, answered_by=body.answered_by)
        return {"interrupt_id": interrupt_id, "answer": jsonable(parsed)}

    app.include_router(hooks_router)
    return app


async def _wait(rt: Runtime, run_id: RunId, timeout_s: float) -> tuple[RunState, bool]:
    """Poll the run until it ends or waits for a person; (state, whether it got there)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while True:
                summary = await rt.store.get_run(run_id)
                if summary.status.is_terminal or summary.status is RunStatus.INPUT_REQUIRED:
                    break
                await asyncio.sleep(0.1)
    state = await rt.state(run_id)
    return state, state.is_terminal or state.status is RunStatus.INPUT_REQUIRED


def serve(
    config: ApiConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
) -> None:
    """Run the API with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level.lower())


def token_from_env(var: str | None) -> str | None:
    """The bearer token named by `--token-env`; ConfigError when that variable is unset."""
    if var is None:
        return None
    token = os.environ.get(var)
    if not token:
        raise ConfigError(f"--token-env {var}: the environment variable {var} is not set")
    return token


__all__ = ["API_VERSION", "Api", "ApiConfig", "create_app", "serve", "token_from_env"]
