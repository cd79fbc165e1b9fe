"""Calling user code (a tool, its reconcile) so that nothing it does can hold the process.

Whatever the code ends with is either its result, an `Exception` it raised, `ToolCrashed` for
any other BaseException (SystemExit, KeyboardInterrupt, a CancelledError the runtime did not
cause), or TimeoutError past its limit. A cancellation of the caller passes through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from contextos.errors import ToolCrashed
from contextos.tools._threads import tool_threads

log = logging.getLogger("contextos.tools")

CANCEL_GRACE_S = 1.0
"""How long a cancelled async call may take to stop before it is abandoned to run on alone."""

_abandoned: set[asyncio.Task[Any]] = set()
"""Async calls that ignored their cancellation (kept referenced while they run on)."""


async def invoke(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], limit: float
) -> Any:
    """`fn(*args, **kwargs)` within `limit` seconds: an async function in a task of its own, a
    sync one on a daemon thread."""
    started = time.monotonic()
    if inspect.iscoroutinefunction(fn):
        return await _run_async(name, fn(*args, **kwargs), limit)
    result = await _run_sync(name, fn, args, kwargs, limit)
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        remaining = max(limit - (time.monotonic() - started), 0)
        return await _run_async(name, _awaited(result), remaining)
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _run_sync(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], limit: float
) -> Any:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[bool, Any]] = loop.create_future()
    context = contextvars.copy_context()  # as asyncio.to_thread does: the caller's context

    def settle(outcome: tuple[bool, Any]) -> None:
        if not done.done():  # a call past its limit is no longer awaited
            done.set_result(outcome)

    def job() -> None:
        outcome: tuple[bool, Any]
        try:
            outcome = (True, context.run(fn, *args, **kwargs))
        except BaseException as exc:  # handed to the loop, which tells a crash from an error
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # a closed loop let the call go long ago
            loop.call_soon_threadsafe(settle, outcome)

    tool_threads.submit(job)
    try:
        async with asyncio.timeout(limit):
            ok, value = await done
    except TimeoutError:
        raise CallTimedOut(
            f"{name} did not finish within its time limit ({limit:g}s); its thread was let go"
        ) from None
    if ok:
        return value
    raise _error_of(name, value)


async def _run_async(name: str, coro: Coroutine[Any, Any, Any], limit: float) -> Any:
    watch = _Watch(limit, asyncio.get_running_loop().create_future())
    # A task of its own: a call that ignores its cancellation can be let go, and a
    # CancelledError it raises is told apart from a cancellation of the caller.
    task = asyncio.ensure_future(watch.run(name, coro))
    try:
        async with asyncio.timeout(limit):
            await watch.ended
    except TimeoutError:
        pass  # the task's state below says whether the call is still going
    except asyncio.CancelledError:
        await _stop(name, task)
        raise
    timed_out = not task.done()
    abandoned = timed_out and not await _stop(name, task)
    if watch.held_s is not None:
        if task.done():
            _consume(task)
        raise CallTimedOut(
            f"{name} held the event loop for {watch.held_s:.1f}s without yielding, past its "
            f"time limit ({limit:g}s); run blocking work in a sync tool or a thread"
        )
    if abandoned:
        raise CallTimedOut(
            f"{name} did not finish within its time limit ({limit:g}s) and ignored its "
            f"cancellation; it was abandoned after {CANCEL_GRACE_S:g}s more"
        )
    if timed_out:
        raise CallTimedOut(f"{name} did not finish within its time limit ({limit:g}s)")
    if task.cancelled():  # nothing cancelled it: the call raised CancelledError itself
        raise stray_cancellation(name)
    return task.result()


async def _stop(name: str, task: asyncio.Task[Any]) -> bool:
    """Cancel a call and wait a little for it to end; False when it had to be abandoned."""
    task.cancel()
    await asyncio.wait((task,), timeout=CANCEL_GRACE_S)
    if task.done():
        _consume(task)
        return True
    log.warning("%s ignored its cancellation; abandoned (it runs on until it ends)", name)
    _abandoned.add(task)
    task.add_done_callback(_forget)
    return False


def _forget(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    _consume(task)


def _consume(task: asyncio.Task[Any]) -> None:
    """Retrieve an outcome nobody will read (no 'exception was never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


def _error_of(name: str, error: BaseException) -> Exception:
    if isinstance(error, Exception):
        return error
    crashed = ToolCrashed(
        f"it raised {error_text(error)}", tool=name, error_type=type(error).__name__
    )
    crashed.__cause__ = error
    return crashed


def stray_cancellation(name: str) -> ToolCrashed:
    """A CancelledError that no cancellation of the caller explains."""
    return ToolCrashed(
        "it raised CancelledError although nothing cancelled it",
        tool=name,
        error_type="CancelledError",
    )


class CallTimedOut(TimeoutError):
    """A call ran past its time limit (the message says how)."""


class _Watch:
    """Times each synchronous stretch of an async call: one that started before the call's
    limit and ended after it held the event loop past the limit (no timer could fire)."""

    def __init__(self, limit: float, ended: asyncio.Future[None]) -> None:
        self.deadline = time.monotonic() + limit
        self.held_s: float | None = None
        self.ended = ended
        """Set by the call's task in its last step: the caller wakes one trip round the loop
        sooner than a callback on the task's end would wake it."""

    async def run(self, name: str, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await self._steps(coro)
        except (asyncio.CancelledError, Exception):
            raise
        except BaseException as exc:  # a task would re-raise SystemExit out of the event loop
            raise _error_of(name, exc) from exc
        finally:
            coro.close()  # a call cancelled before it started is not left 'never awaited'
            if not self.ended.done():  # not when the caller stopped waiting
                self.ended.set_result(None)

    @types.coroutine
    def _steps(self, coro: Coroutine[Any, Any, Any]) -> Generator[Any, Any, Any]:
        # `yield from coro`, one step at a time, with a clock around each step.
        value: Any = None
        error: BaseException | None = None
        while True:
            started = time.monotonic()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                ended = time.monotonic()
                if started < self.deadline < ended:
                    self.held_s = ended - started
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # thrown in by the task: pass it on to the call
                value, error = None, exc


def safe_text(value: Any) -> str:
    """`str(value)` fit to be recorded: never raises, lone surrogates escaped."""
    try:
        text = value if isinstance(value, str) else str(value)
    except BaseException as exc:  # user code (__str__) runs here
        text = f"<{type(value).__name__} whose str() raised {type(exc).__name__}>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_type(error: BaseException) -> str:
    """The class of what user code raised (for a crash: SystemExit, not ToolCrashed)."""
    if isinstance(error, ToolCrashed):
        return str(error.fields.get("error_type") or type(error).__name__)
    return type(error).__name__


def error_text(error: BaseException) -> str:
    """`TypeName: message` of an exception raised by user code, fit to be recorded."""
    message = safe_text(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
