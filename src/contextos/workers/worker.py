"""The worker process: claim runs from the queue, drive them under leases, fire schedules.

Run many per machine and on many machines against one PostgreSQL store (or several on one
SQLite file). A worker that dies stops renewing its leases; when they expire another worker
claims the runs and resumes them from their events. SIGTERM drains: every run in flight
finishes its current step, is recorded as released, and goes back to the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from contextos import events as ev
from contextos.agents import Agent
from contextos.causality import stamp
from contextos.errors import (
    ConcurrencyConflict,
    ConfigError,
    ContextOSError,
    RunIsTerminal,
)
from contextos.events import utcnow
from contextos.graph import Workflow
from contextos.runs import FailureReason, RunId
from contextos.runtime import Runtime
from contextos.state import RunState
from contextos.store import EventStore, open_store
from contextos.store.queue import (
    ConcurrencyLimit,
    Lease,
    LimitScope,
    RunQueue,
    WorkerInfo,
    WorkerStatus,
    queue_of,
    require_queue,
)
from contextos.store.wakeup import Ready, Wakeup, wakeup_for
from contextos.tools._invoke import CANCEL_GRACE_S
from contextos.workers.scheduler import fire_schedules, retry_at
from contextos.workers.sweeper import Sweeper
from contextos.workers.triggers import fire_triggers

log = logging.getLogger("contextos.worker")

POLL_S = 1.0
"""The default poll interval when only this process can wake the worker (SQLite)."""
FALLBACK_POLL_S = 30.0
"""The default poll interval when the store wakes workers (PostgreSQL NOTIFY)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    """How one worker process behaves."""

    concurrency: int = 4
    """Runs it drives at once."""
    lease_s: float = 30.0
    """Lease length; renewed every third of it. A dead worker's runs wait this long."""
    poll_s: float | None = None
    """How often an idle worker asks the queue for work unless woken sooner. None: 1 s on
    SQLite (other processes cannot wake it), 30 s on PostgreSQL (NOTIFY wakes it; polling only
    covers a lost wake-up). Runs waiting on a timer are looked at when it is due, if sooner."""
    heartbeat_s: float = 5.0
    """How often it tells the registry it is alive."""
    agents: tuple[str, ...] | None = None
    """Claim only runs of these agent names (None: any)."""
    schedules: bool = True
    """Fire due cron schedules (safe on every worker: each tick fires once)."""
    schedule_poll_s: float | None = None
    """Longest wait between looks for due schedules (it wakes for the next known tick, and on
    PostgreSQL when a schedule is added). None: the poll interval in effect."""
    triggers: bool = True
    """Start the runs that run triggers owe (safe on every worker: each firing starts one)."""
    trigger_poll_s: float = 1.0
    """How often it looks for firings no worker has started yet (the run ended elsewhere, or
    its worker died before firing)."""
    expiry_poll_s: float = 5.0
    """How often it looks for interrupts nobody answered by their deadline (safe on every
    worker: each expiry is one fenced append, recorded once)."""
    max_attempts: int = 10
    """A run whose worker died or failed this many times is failed with runtime_crashed (or
    tool_crashed when the last worker died during a tool call)."""
    retry_base_s: float = 1.0
    """First back-off after a failed attempt; doubles each time."""
    retry_cap_s: float = 300.0
    """Longest back-off."""


class Worker:
    """One worker process's loop. `run()` until `stop()` (SIGTERM) and the drain finish."""

    def __init__(
        self,
        store: EventStore | str | None = None,
        *,
        config: WorkerConfig | None = None,
        worker_id: str | None = None,
        policy: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config or WorkerConfig()
        if isinstance(store, str) and store.startswith(("postgresql://", "postgres://")):
            from contextos.store.postgres import PostgresStore

            # A connection for each run in flight, plus heartbeats, claims and schedules.
            store = PostgresStore(store, max_size=max(10, self.config.concurrency + 4))
        # The policy decides the runs' tool calls: None reads $CONTEXTOS_POLICY, like every
        # process that drives runs must.
        self.runtime = Runtime(
            store,
            worker_id=worker_id,
            lease_s=self.config.lease_s,
            policy=policy,
            register=False,  # the worker enters itself, with its concurrency
        )
        self.worker_id = self.runtime.worker_id
        queue = queue_of(self.runtime.store)
        if queue is None:
            raise ConfigError(f"the store {self.runtime.store.url!r} keeps no run queue")
        self.queue: RunQueue = queue
        self.driven = 0
        """Runs driven to a stop (finished, waiting or handed back) by this worker."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._schedules_wake = asyncio.Event()
        self.wakeup: Wakeup = wakeup_for(self.runtime.store, name=self.worker_id)
        """What wakes this worker when work is ready (LISTEN/NOTIFY or in-process)."""
        self._stopping = False
        self._stop = asyncio.Event()
        self._agents: dict[str, Agent | Workflow] = {}
        self._scheduled: dict[str, Agent | Workflow] = {}

    # -- control --------------------------------------------------------------------------

    def stop(self) -> None:
        """Drain: claim nothing more, let runs in flight finish their step, hand them back.

        A second call stops at once: runs in flight are abandoned to their leases.
        """
        if self._stopping:
            for task in list(self._tasks):
                task.cancel()
            return
        self._stopping = True
        self.runtime.drain()
        self._stop.set()
        self._wake.set()
        self._schedules_wake.set()

    @property
    def status(self) -> WorkerStatus:
        return WorkerStatus.DRAINING if self._stopping else WorkerStatus.RUNNING

    @property
    def poll_s(self) -> float:
        """The poll interval in effect (see WorkerConfig.poll_s)."""
        if self.config.poll_s is not None:
            return self.config.poll_s
        return FALLBACK_POLL_S if self.wakeup.reaches_other_processes else POLL_S

    def _woken(self, ready: Ready) -> None:
        (self._schedules_wake if ready is Ready.SCHEDULES else self._wake).set()

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        await self.queue.register_worker(
            WorkerInfo(
                worker_id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                concurrency=self.config.concurrency,
            )
        )
        log.info("worker %s started (concurrency %d)", self.worker_id, self.config.concurrency)
        heartbeats = asyncio.create_task(self._heartbeats())
        await self.wakeup.start(self._woken)
        schedules = asyncio.create_task(self._schedules()) if self.config.schedules else None
        triggers = asyncio.create_task(self._triggers()) if self.config.triggers else None
        sweeper = Sweeper(
            self.runtime.store,
            clock=self.runtime.governance.clock,
            actor=f"worker:{self.worker_id}",
        )
        # A run whose interrupt expired with deny or default is queued again: look for work.
        expiries = asyncio.create_task(
            sweeper.run(
                self.config.expiry_poll_s, self._stop, on_expired=lambda _: self._wake.set()
            )
        )
        try:
            while not self._stopping:
                self._wake.clear()
                await self._fill()
                wait_s = await self._idle_wait_s()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
        finally:
            self._stopping = True
            self._stop.set()
            self.runtime.drain()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if schedules is not None:
                # A pass that started a tick's run also moves the schedule on: let it end.
                await asyncio.gather(schedules, return_exceptions=True)
            if triggers is not None:
                await asyncio.gather(triggers, return_exceptions=True)
            await asyncio.gather(expiries, return_exceptions=True)
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await self.wakeup.close()
            with contextlib.suppress(Exception):
                await self.queue.worker_heartbeat(self.worker_id, WorkerStatus.STOPPED)
            await self.runtime.close()
            log.info("worker %s stopped after driving %d runs", self.worker_id, self.driven)

    async def _fill(self) -> None:
        """Claim runs until every slot is busy or the queue has nothing claimable."""
        while not self._stopping and len(self._tasks) < self.config.concurrency:
            try:
                lease = await self.queue.claim(
                    self.worker_id, lease_s=self.config.lease_s, agents=self.config.agents
                )
            except Exception:
                log.exception("claiming a run failed; trying again at the next poll")
                return
            if lease is None:
                return
            task = asyncio.create_task(self._execute(lease))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    async def _idle_wait_s(self) -> float:
        """How long to wait for a wake-up: the poll interval, or less when a timer falls due."""
        poll = self.poll_s
        if self._stopping or len(self._tasks) >= self.config.concurrency:
            return poll  # a run ending here wakes the loop
        try:
            due = await self.queue.next_due()
        except Exception:
            log.exception("reading the queue's next timer failed")
            return poll
        # A little past the due time: the claim then sees it due.
        return poll if due is None else min(poll, due + 0.01)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()

    async def _execute(self, lease: Lease) -> None:
        """Drive one claimed run; on an error give it back with a back-off timer."""
        try:
            if lease.attempts >= self.config.max_attempts:
                await self._give_up(lease)
                return
            if lease.recovered:
                log.warning("run %s: took over from a worker that stopped renewing", lease.run_id)
            result = await self.runtime.resume(lease.run_id, lease=lease)
            self.driven += 1
            log.info("run %s: %s", lease.run_id, result.status.value)
            if result.status.is_terminal:
                await self._fire_triggers(lease.run_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt = lease.attempts + 1
            delay_at = retry_at(
                attempt, base_s=self.config.retry_base_s, cap_s=self.config.retry_cap_s
            )
            log.warning(
                "run %s: attempt %d failed (%s: %s); retrying after %s",
                lease.run_id,
                attempt,
                type(exc).__name__,
                exc,
                delay_at.isoformat(),
            )
            try:
                await self.runtime.release(
                    lease,
                    reason=f"attempt {attempt} failed: {type(exc).__name__}: {exc}",
                    not_before=delay_at,
                    failed=True,
                )
            except Exception:
                log.exception("run %s: could not hand it back; its lease will expire", lease.run_id)

    async def _give_up(self, lease: Lease) -> None:
        state = await self.runtime.state(lease.run_id)
        if not state.is_terminal:
            reason, message, error = _given_up(state, lease)
            failed = ev.RunFailed(
                run_id=RunId(lease.run_id),
                seq=state.seq + 1,
                reason=reason,
                message=message,
                error=error,
                actor=f"worker:{self.worker_id}",
            )
            with contextlib.suppress(ConcurrencyConflict, RunIsTerminal):
                await self.runtime.store.append(
                    lease.run_id, stamp(state, [failed]), expected_seq=state.seq
                )
            log.error("run %s: failed after %d attempts", lease.run_id, lease.attempts)
        await self.queue.release(lease)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                await self.queue.worker_heartbeat(self.worker_id, self.status)
            except Exception:
                log.exception("worker heartbeat failed")

    async def _schedules(self) -> None:
        while not self._stopping:
            self._schedules_wake.clear()
            try:
                for fired in await fire_schedules(self.runtime, agents=self._scheduled):
                    for tick, run_id in fired.runs:
                        log.info(
                            "schedule %s: tick %s -> run %s",
                            fired.schedule,
                            tick.isoformat(),
                            run_id,
                        )
                    if fired.runs:
                        self._wake.set()
            except Exception:
                log.exception("firing schedules failed")
            wait_s = await self._schedules_wait_s()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._schedules_wake.wait()

    async def _schedules_wait_s(self) -> float:
        """Until the next known tick, at most the schedule poll interval."""
        cap = self.config.schedule_poll_s
        cap = self.poll_s if cap is None else cap
        try:
            ticks = [s.next_tick_at for s in await self.queue.list_schedules()]
        except Exception:
            log.exception("reading the schedules failed")
            return cap
        if not ticks:
            return cap
        until = (min(ticks) - utcnow()).total_seconds()
        # A tick left due after a pass failed to fire: the next try waits a second, not less.
        return min(cap, until + 0.01 if until > 0 else 1.0)

    async def _triggers(self) -> None:
        while not self._stopping:
            await self._fire_triggers(None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.trigger_poll_s):
                    await self._stop.wait()

    async def _fire_triggers(self, run_id: RunId | None) -> None:
        """Start the runs that run triggers owe after `run_id` (just ended here), or any."""
        if not self.config.triggers:
            return
        try:
            for fired in await fire_triggers(self.runtime, run_id=run_id, agents=self._agents):
                log.info(
                    "trigger %s: after run %s -> run %s",
                    fired.trigger,
                    fired.source_run,
                    fired.run_id or "none (chain too deep)",
                )
                if fired.run_id is not None:
                    self._wake.set()
        except Exception:
            log.exception("firing triggers failed; the next pass tries again")


def _given_up(state: RunState, lease: Lease) -> tuple[FailureReason, str, dict[str, Any]]:
    """Why a run that used up its attempts failed: the tool its last worker died running
    (`tool_crashed`), or the runtime (`runtime_crashed`)."""
    error: dict[str, Any] = {"code": "too_many_attempts", "attempts": lease.attempts}
    if lease.recovered and state.pending_tool_calls:
        call = state.pending_tool_calls[0]
        return (
            FailureReason.TOOL_CRASHED,
            f"gave up after {lease.attempts} failed attempts: the last worker died during the "
            f"call to {call.name}, which most likely ends the process (os._exit, a signal, a "
            "crash in native code); fix or remove the tool",
            {**error, "tool": call.name, "call_id": call.id},
        )
    return (
        FailureReason.RUNTIME_CRASHED,
        f"gave up after {lease.attempts} failed attempts "
        "(workers died holding the run, or it kept failing)",
        error,
    )


def run_worker(
    store: str | None = None,
    *,
    config: WorkerConfig | None = None,
    worker_id: str | None = None,
) -> None:
    """Run a worker in this process until SIGTERM or SIGINT (twice: stop without draining)."""

    async def main() -> None:
        worker = Worker(store, config=config, worker_id=worker_id)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    _run_letting_go(main())


def _run_letting_go(main: Coroutine[Any, Any, None]) -> None:
    """`asyncio.run(main)`, except that at the end it does not wait for what it cannot stop.

    `asyncio.run` waits, without a limit, for every task still running: a tool call abandoned
    because it ignored its cancellation would hold a stopped worker for ever. Tasks left here
    get `CANCEL_GRACE_S` after their cancellation, then go with the loop.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


# -- operations ---------------------------------------------------------------------------


async def list_workers(
    store: EventStore | str | None = None, *, live_within_s: float | None = 60.0
) -> list[WorkerInfo]:
    """Workers that sent a heartbeat recently, with the leases they hold."""
    opened = store if isinstance(store, EventStore) else open_store(store)
    try:
        return await require_queue(opened).list_workers(live_within_s=live_within_s)
    finally:
        if opened is not store:
            await opened.close()


async def set_limit(
    store: EventStore,
    max_running: int | None,
    *,
    tenant: str | None = None,
    agent: str | None = None,
) -> None:
    """Let at most `max_running` runs be driven at once, across every worker: in all, or per
    tenant (`tenant`, `"*"` for each tenant), or per agent (`agent`, `"*"` for each agent).
    None removes the limit."""
    scope, name = LimitScope.GLOBAL, ""
    if tenant is not None:
        scope, name = LimitScope.TENANT, tenant
    if agent is not None:
        scope, name = LimitScope.AGENT, agent
    await require_queue(store).set_limit(scope, name, max_running)


async def list_limits(store: EventStore) -> list[ConcurrencyLimit]:
    """The concurrency limits every worker respects."""
    return await require_queue(store).limits()


# -- `python -m contextos.workers` ---------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: `python -m contextos.workers --store URL [--concurrency N] …`."""
    defaults = WorkerConfig()
    parser = argparse.ArgumentParser(prog="contextos worker", description=__doc__)
    parser.add_argument("--store", default=None, help="store URL (default: $CONTEXTOS_STORE)")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--lease", type=float, default=defaults.lease_s, help="seconds")
    parser.add_argument(
        "--poll",
        type=float,
        default=defaults.poll_s,
        help="seconds between looks at an idle queue (default: 1 on SQLite, 30 on PostgreSQL,"
        " where NOTIFY wakes workers)",
    )
    parser.add_argument("--heartbeat", type=float, default=defaults.heartbeat_s)
    parser.add_argument("--agent", action="append", default=None, help="only this agent name")
    parser.add_argument("--no-schedules", action="store_true", help="do not fire schedules")
    parser.add_argument("--no-triggers", action="store_true", help="do not fire run triggers")
    parser.add_argument(
        "--trigger-poll",
        type=float,
        default=defaults.trigger_poll_s,
        help="seconds between looks for firings no worker started",
    )
    parser.add_argument(
        "--expiry-poll",
        type=float,
        default=defaults.expiry_poll_s,
        help="seconds between looks for interrupts past their deadline",
    )
    parser.add_argument("--max-attempts", type=int, default=defaults.max_attempts)
    parser.add_argument("--retry-base", type=float, default=defaults.retry_base_s)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    config = WorkerConfig(
        concurrency=args.concurrency,
        lease_s=args.lease,
        poll_s=args.poll,
        heartbeat_s=args.heartbeat,
        agents=tuple(args.agent) if args.agent else None,
        schedules=not args.no_schedules,
        triggers=not args.no_triggers,
        trigger_poll_s=args.trigger_poll,
        expiry_poll_s=args.expiry_poll,
        max_attempts=args.max_attempts,
        retry_base_s=args.retry_base,
    )
    try:
        run_worker(args.store, config=config, worker_id=args.worker_id)
    except ContextOSError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "Worker",
    "WorkerConfig",
    "list_limits",
    "list_workers",
    "main",
    "run_worker",
    "set_limit",
]
