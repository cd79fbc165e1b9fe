"""Who is asking: every request acts as the principal its bearer token authenticates, and sees
only its own tenant. A run, an interrupt or an event of another tenant answers 404, exactly as
one that does not exist, so ids do not leak.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from contextos import (
    Interrupt,
    Principal,
    RunContext,
    RunId,
    RunNotFound,
    RunState,
    authenticate,
)
from contextos.api.config import Api
from contextos.api.errors import ApiError

_BEARER_HINT = (
    "Send Authorization: Bearer TOKEN; an operator issues one with "
    "`contextos token create --tenant TENANT --user USER`."
)


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="A token from `contextos token create`: it acts as one user of one tenant.",
)


async def principal_of(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The principal the request acts as (401 without one)."""
    api: Api = request.app.state.api
    token = credentials.credentials.strip() if credentials is not None else ""
    if api.oidc is not None and token.count(".") == 2:  # a JWT: the provider vouches for it
        return await api.oidc.principal(token)
    shared = api.config.token
    if shared is not None:  # one shared secret: whoever holds it is the server's operator
        if not hmac.compare_digest(token.encode(), shared.encode()):
            raise ApiError(
                401,
                "unauthorized",
                "missing or wrong bearer token",
                hint="Send Authorization: Bearer TOKEN (the server's --token-env variable).",
            )
        return api.operator
    if not token:
        if api.config.open_access:
            return api.operator
        raise ApiError(
            401, "unauthorized", "this request carries no bearer token", hint=_BEARER_HINT
        )
    return await authenticate(api.runtime.store, token)


PrincipalDep = Annotated[Principal, Depends(principal_of)]


def tenant_of(state: RunState) -> str:
    """The tenant a run acts in, as its log recorded it."""
    return RunContext.of_run(state.context).tenant


async def run_of(api: Api, principal: Principal, run_id: str) -> RunState:
    """The run, if it is the principal's tenant's; RunNotFound otherwise."""
    if "\x00" in run_id:  # no store can look that up: it names no run
        raise RunNotFound(run_id)
    state = await api.runtime.state(RunId(run_id))
    if tenant_of(state) != principal.tenant:
        raise RunNotFound(run_id)
    return state


async def interrupt_of(api: Api, principal: Principal, interrupt_id: str) -> Interrupt:
    """The interrupt, if its run is the principal's tenant's; 404 otherwise, as for an
    interrupt that does not exist."""
    found = await api.runtime.interrupt(interrupt_id)
    try:
        await run_of(api, principal, found.run_id)
    except RunNotFound:
        raise ApiError(
            404,
            "interrupt_not_found",
            f"no interrupt with id {interrupt_id!r}",
            hint="List pending interrupts with GET /v1/interrupts.",
            interrupt_id=interrupt_id,
        ) from None
    return found


async def visible(api: Api, principal: Principal, pending: list[Interrupt]) -> list[Interrupt]:
    """The interrupts whose runs are the principal's tenant's."""
    tenants: dict[str, str] = {}
    shown = []
    for interrupt in pending:
        if interrupt.run_id not in tenants:
            tenants[interrupt.run_id] = tenant_of(await api.runtime.state(interrupt.run_id))
        if tenants[interrupt.run_id] == principal.tenant:
            shown.append(interrupt)
    return shown


__all__ = ["PrincipalDep", "interrupt_of", "principal_of", "run_of", "tenant_of", "visible"]
