"""Fixtures for the model adapters: the embedded model, a real OpenAI-compatible server serving
it, and small scripted HTTP servers on loopback for the failure cases."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the tests import their helpers (model_servers) from here
    sys.path.insert(0, str(HERE))

from model_servers import Handler, LoopbackServer, Reply  # noqa: E402

from support.models import local_model_path  # noqa: E402

# -- the embedded model --------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_path() -> Path:
    return local_model_path()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


SERVER_SCRIPT = Path(__file__).with_name("llama_server.py")


@pytest.fixture(scope="session")
def llama_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server on loopback, serving the embedded model.

    Yields the base URL (`http://127.0.0.1:PORT/v1`); the model is served as `smollm2`.
    """
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette_context  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        why = f"llama-cpp-python's server extras are missing ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: install 'llama-cpp-python[server]'")
        pytest.skip(why)
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                "--model",
                str(model_path),
                "--model_alias",
                "smollm2",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "4096",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the llama server exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the llama server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def loopback() -> Iterator[Callable[[list[Reply] | Handler], LoopbackServer]]:
    """Start scripted servers; all are shut down after the test."""
    started: list[LoopbackServer] = []

    def start(replies: list[Reply] | Handler) -> LoopbackServer:
        server = LoopbackServer(replies).__enter__()
        started.append(server)
        return server

    yield start
    for s in started:
        s.__exit__(None, None, None)
