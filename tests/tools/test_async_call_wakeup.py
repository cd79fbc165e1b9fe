"""An async tool's caller wakes on the loop's next trip after the tool ends, not two trips on:
the call's own task tells it in its last step instead of through a callback on its end."""

from __future__ import annotations

import asyncio

from contextos.tools._invoke import invoke


async def test_the_caller_of_an_async_call_wakes_one_trip_after_it_ends() -> None:
    loop = asyncio.get_running_loop()
    trips = 0

    def count() -> None:  # runs once a trip round the loop, from the tool's last step on
        nonlocal trips
        trips += 1
        loop.call_soon(count)

    async def tool() -> str:
        loop.call_soon(count)
        return "done"

    assert await invoke("tool", tool, (), {}, 5.0) == "done"
    assert trips == 1
