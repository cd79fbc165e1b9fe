"""A tool whose call never ends: what keeps a child run in flight while a test acts on it."""

from __future__ import annotations

import asyncio

from contextos import tool
from contextos.tools.contract import Tool


def never_answering() -> Tool:
    """`wait(q)`: waits for something that never comes (until the run's cancellation)."""
    never = asyncio.Event()

    @tool(timeout_s=60)
    async def wait(q: str) -> str:
        """Wait for something that never comes."""
        await never.wait()
        return "late"

    return wait
