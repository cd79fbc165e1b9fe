"""Worker processes for tests, and waiting for what they do (a hang fails; nothing is timed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from contextos import RunStatus, Runtime

ROOT = Path(__file__).resolve().parents[2]
"""The project's root: worker processes run from there, so `tests/...` agent paths import."""


def spawn_worker(
    store_url: str,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    lease_s: float = 2.0,
    concurrency: int = 4,
) -> subprocess.Popen[bytes]:
    """Start `python -m contextos.workers` on the store (polling every 0.1 s, a heartbeat
    every 0.5 s), its log appended to `log`; `args` are more of its options."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contextos.workers",
                "--store",
                store_url,
                "--concurrency",
                str(concurrency),
                "--lease",
                str(lease_s),
                "--poll",
                "0.1",
                "--heartbeat",
                "0.5",
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill the processes still running and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 60.0, what: str = "condition"
) -> None:
    """Poll `check` until it holds; fail after `timeout_s` (a hang, not a timing claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def ended(rt: Runtime, run_id: str, *, timeout_s: float = 120.0) -> RunStatus:
    """Wait until the run has ended, and say how."""

    async def terminal() -> bool:
        return (await rt.store.get_run(run_id)).status.is_terminal

    await wait_until(terminal, timeout_s=timeout_s, what=f"run {run_id} to end")
    return (await rt.store.get_run(run_id)).status


def wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    """Block until a process writes `path`."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.05)
