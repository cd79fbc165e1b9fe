"""A real API server on 127.0.0.1 (a free port) in a thread of the test process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from contextos import Runtime, issue_token
from contextos.api import ApiConfig, create_app

AGENTS = "tests/api/api_agents.py"
GREETER = f"{AGENTS}:greeter"
PAYER = f"{AGENTS}:payer"
ASKER = f"{AGENTS}:asker"
GREETINGS = f"{AGENTS}:greetings"


GRACE_S = 5
"""What `contextos serve` gives open requests (live streams) when it stops."""


@contextmanager
def serving(config: ApiConfig) -> Iterator[str]:
    """Serve `config` until the block ends; yields the base URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            timeout_graceful_shutdown=GRACE_S,
        )
    )
    thread = threading.Thread(target=server.run, name="api-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "the API server did not stop"


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    """The JSON error of a refused request, checked: its status, code, message and hint."""
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"] == "application/json"
    error: dict[str, object] = response.json()["error"]
    assert error["code"] == code and error["message"] and error["hint"], error
    return error


async def token_for(
    store: str, *, tenant: str = "default", user: str, roles: tuple[str, ...] = ()
) -> dict[str, str]:
    """Issue a token on the store, as `contextos token create` does; its request headers."""
    async with Runtime(store) as rt:
        _, secret = await issue_token(rt.store, tenant=tenant, user=user, roles=roles)
    return {"Authorization": f"Bearer {secret}"}
