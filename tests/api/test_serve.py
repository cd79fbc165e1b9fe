"""`contextos serve` as a real process: a webhook starts a run, its ending fires a run trigger,
the worker inside the server drives both; SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from contextos import Runtime
from contextos.store.queue import queue_of
from contextos.workers import DELIVERY_HEADER, add_trigger

ROOT = Path(__file__).resolve().parents[2]
WRITER = "tests/triggers/trigger_agents.py:writer"
REVIEWER = "tests/triggers/trigger_agents.py:reviewer"


def port_of(log: Path, proc: subprocess.Popen[bytes]) -> int:
    for _ in range(1200):
        found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"the server never started:\n{log.read_text()}")


def start_server(store: str, log: Path) -> subprocess.Popen[bytes]:
    """`contextos serve` with a worker inside, a bearer token, a 4 KiB body limit, on a free
    port."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextos",
                "serve",
                "--store",
                store,
                "--port",
                "0",
                "--agent",
                WRITER,
                "--worker",
                "--token-env",
                "CONTEXTOS_TEST_API_TOKEN",
                "--max-body-bytes",
                "4096",
            ],
            cwd=ROOT,
            env={**os.environ, "CONTEXTOS_TEST_API_TOKEN": "t0ken"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_serve_a_webhook_then_a_run_trigger(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/runs.db"
    async with Runtime(store) as rt:
        q = queue_of(rt.store)
        assert q is not None
        await add_trigger(q, "inbound", WRITER, webhook=True)
        await add_trigger(q, "review", REVIEWER, after="writer", input="Review: {output}")

    log = tmp_path / "serve.log"
    proc = start_server(store, log)
    try:
        base = f"http://127.0.0.1:{await asyncio.to_thread(port_of, log, proc)}"
        auth = {"Authorization": "Bearer t0ken"}
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            hooked = await http.post(
                "/v1/hooks/inbound", content=b"write the report", headers={DELIVERY_HEADER: "1"}
            )
            assert hooked.status_code == 202, hooked.text
            source = hooked.json()["run_id"]

            async def reviewed() -> list[dict[str, object]]:
                runs = (await http.get("/v1/runs", headers=auth)).json()["runs"]
                return [r for r in runs if r["agent_name"] == "reviewer"]

            for _ in range(1200):
                done = [r for r in await reviewed() if r["status"] == "completed"]
                if done:
                    break
                await asyncio.sleep(0.05)
            (review,) = done
            run = (await http.get(f"/v1/runs/{review['run_id']}", headers=auth)).json()
            assert run["input"] == "Review: draft: the quarterly report"
            assert run["metadata"]["source_run"] == source
            assert run["started_by"] == (
                f"started by trigger review after run {source} completed (chain depth 1)"
            )
            assert (await http.get("/v1/runs")).status_code == 401
            big = await http.post(
                "/v1/runs", json={"agent": "writer", "input": "x" * 5000}, headers=auth
            )
            assert big.status_code == 413
            assert big.json()["error"]["max_body_bytes"] == 4096
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal for its supervisor.
        assert await asyncio.to_thread(proc.wait, 60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete." in log.read_text()
        async with Runtime(store) as rt:
            q = queue_of(rt.store)
            assert q is not None
            (worker,) = await q.list_workers(live_within_s=None)
            assert worker.status.value == "stopped"  # the worker inside drained and stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
