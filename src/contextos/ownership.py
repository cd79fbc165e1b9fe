"""Run ownership: the runs one runtime drives, the lease it holds on each, and letting go.

Every driver holds the lease of the run it drives: it renews it while the run is in flight,
stops driving a run whose lease was lost or that someone else ended, and hands a run back
(recorded as released) when it stops early: a drain on shutdown, Ctrl-C in a script.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from contextos import events as ev
from contextos.causality import stamp
from contextos.errors import ConcurrencyConflict, RunInUse, RunIsTerminal
from contextos.events import utcnow
from contextos.graph.engine import WorkflowDriver
from contextos.loop import Driver
from contextos.runs import RunId, RunStatus
from contextos.state import RunState, apply
from contextos.store import EventStore
from contextos.store.queue import Lease, RunOwner, RunQueue, WorkerInfo, WorkerStatus


class Ownership:
    """The runs a runtime drives: their leases, their drivers in flight, how they stop."""

    def __init__(
        self,
        store: EventStore,
        queue: RunQueue | None,
        *,
        worker_id: str,
        lease_s: float,
        cancel_poll_s: float,
        register: bool,
    ) -> None:
        self.store = store
        self._queue = queue
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.cancel_poll_s = cancel_poll_s
        self._inflight: dict[RunId, tuple[Driver | WorkflowDriver, asyncio.Task[RunState]]] = {}
        self._cancelled: set[RunId] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._leases: dict[RunId, Lease] = {}
        self._renewed_at: dict[RunId, float] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._draining = False
        self._drain_reason = "the worker is shutting down"
        self._register = register
        """Whether to enter itself in the worker registry while it drives runs (a Worker
        enters itself), so that others see who drives them."""
        self._announced = False

    async def close(self) -> None:
        await self.withdraw()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._keeper is not None:
            self._keeper.cancel()

    async def supervise(
        self,
        driver: Driver | WorkflowDriver,
        state: RunState,
        lease: Lease | None,
        *,
        materialise: Callable[[RunState], Awaitable[None]],
    ) -> RunState:
        """Drive under the lease: renew it, watch for cancellation, hand back on a stop;
        `materialise` stores what a run that ended or waits leaves as evidence."""
        driver.stop_requested = self._draining
        task = asyncio.create_task(driver.drive())
        self._inflight[state.run_id] = (driver, task)
        if lease is not None:
            self._leases[state.run_id] = lease
            self._renewed_at[state.run_id] = time.monotonic()
            if self._keeper is None or self._keeper.done():
                self._keeper = asyncio.create_task(self._keep_leases())
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch_for_cancel())
        cut_from_outside = False
        ended = False
        try:
            await task
            await driver.after_run()
            ended = driver.state.is_terminal
            if not ended:
                await materialise(driver.state)
        except asyncio.CancelledError:
            # Cancelled from outside. While draining (a worker's second SIGTERM) the step is
            # abandoned to the lease; otherwise (Ctrl-C in a script) the run is handed back
            # before the cancellation goes on.
            if state.run_id not in self._cancelled and self._draining:
                raise
            cut_from_outside = state.run_id not in self._cancelled
            if cut_from_outside:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        except (ConcurrencyConflict, RunIsTerminal):
            pass  # another writer moved the run on (a cancel, another worker); we stop here
        finally:
            self._inflight.pop(state.run_id, None)
            self._cancelled.discard(state.run_id)
            held = self._leases.pop(state.run_id, None)
            self._renewed_at.pop(state.run_id, None)
        if held is not None:  # still ours (a lost lease is not ours to give back)
            wake: datetime | None = None
            if driver.state.status is RunStatus.RUNNING and (
                driver.stop_requested or cut_from_outside
            ):
                reason = "interrupted"
                if driver.stop_requested:
                    reason = driver.stop_reason or self._drain_reason
                await self.hand_back(driver.state, reason)
                if driver.stop_requested and driver.wake_after_s is not None:
                    wake = utcnow() + timedelta(seconds=driver.wake_after_s)
            await self.release_lease(held, not_before=wake)
        if not self._leases:
            await self.withdraw()
        if ended:
            # Only now: an ended run's record (its whole log read, decoded and built) would
            # otherwise hold the loop while its lease is given back and its result waits.
            await materialise(driver.state)
        if cut_from_outside:
            raise asyncio.CancelledError
        # The driver's state is the log up to its seq; fold in whatever others added since
        # (nothing follows an ended run's last event).
        if not driver.state.is_terminal:
            for event in await self.store.read(state.run_id, after_seq=driver.state.seq):
                apply(driver.state, event)
        return driver.state

    # -- leases ---------------------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Renew the leases of runs in flight; stop driving a run whose lease was lost.

        A lease is lost when another worker took it (ours had expired: we were too slow or cut
        off) or when it could not be renewed for a whole lease period. Either way someone else
        may be driving the run now, so this runtime stops appending to it.
        """
        queue = self._queue
        assert queue is not None
        while self._leases:
            await asyncio.sleep(self.lease_s / 3)
            if self._announced:
                with contextlib.suppress(Exception):  # the lease renewals below decide
                    await queue.worker_heartbeat(self.worker_id, WorkerStatus.RUNNING)
            for run_id, lease in list(self._leases.items()):
                try:
                    renewed = await queue.renew(lease, lease_s=self.lease_s)
                except Exception:  # the store is unreachable: keep trying while the lease lasts
                    since = self._renewed_at.get(run_id, time.monotonic())
                    if time.monotonic() - since < self.lease_s:
                        continue
                    renewed = None
                if run_id not in self._leases:
                    continue  # it finished meanwhile
                if renewed is not None:
                    self._leases[run_id] = renewed
                    self._renewed_at[run_id] = time.monotonic()
                    continue
                self._leases.pop(run_id, None)
                inflight = self._inflight.get(run_id)
                if inflight is not None and not inflight[1].done():
                    self._cancelled.add(run_id)
                    inflight[1].cancel()

    async def take(self, run_id: RunId) -> Lease:
        """The run's lease for an explicit resume; RunInUse while a live driver holds it.

        A holder is gone when its lease expired, or when it ran on this machine and its
        process no longer exists (a `kill -9` seen from the same host needs no waiting).
        """
        queue = self._queue
        assert queue is not None
        if run_id in self._inflight:  # a task of this runtime drives it: its lease is live
            raise RunInUse(run_id, f"this runtime ({self.worker_id})")
        await self.announce()
        lease = await queue.take(run_id, self.worker_id, lease_s=self.lease_s)
        if lease is not None:
            return lease
        owner = await self.owner(run_id)
        if owner is None:
            return await queue.acquire(run_id, self.worker_id, lease_s=self.lease_s)
        since = f" since {owner.since:%H:%M:%S} UTC" if owner.since else ""
        raise RunInUse(run_id, owner.describe(), detail=since)

    async def owner(self, run_id: str) -> RunOwner | None:
        """Who drives the run now (the holder of its live lease), or None: nobody does (a
        holder seen killed on this machine drives nothing, lease or not)."""
        queue = self._queue
        if queue is None:
            return None
        entry = await queue.queue_entry(RunId(run_id))
        if entry is None or entry.lease_owner is None or entry.lease_expires_at is None:
            return None
        if entry.lease_expires_at <= utcnow():
            return None
        known = [
            w
            for w in await queue.list_workers(live_within_s=None)
            if w.worker_id == entry.lease_owner
        ]
        info = known[0] if known else None
        if info is not None and info.status is WorkerStatus.STOPPED:
            return None  # it said it stopped: the lease it left behind drives nothing
        owner = RunOwner(
            run_id=RunId(run_id),
            worker_id=entry.lease_owner,
            expires_at=entry.lease_expires_at,
            host=info.host if info else None,
            pid=info.pid if info else None,
            since=info.started_at if info else None,
        )
        return None if process_gone(owner) else owner  # killed: its lease drives nothing

    async def announce(self) -> None:
        """Enter this runtime in the worker registry (once), as a driver of one run at a time."""
        queue = self._queue
        if not self._register or self._announced or queue is None:
            return
        await queue.register_worker(
            WorkerInfo(
                worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid(), concurrency=1
            )
        )
        self._announced = True

    async def withdraw(self) -> None:
        """Mark this runtime stopped in the registry, if it entered itself."""
        queue = self._queue
        if not self._announced or queue is None:
            return
        self._announced = False
        with contextlib.suppress(Exception):  # a stale entry ages out of the live list anyway
            await queue.worker_heartbeat(self.worker_id, WorkerStatus.STOPPED)

    async def release_lease(self, lease: Lease, **kwargs: Any) -> None:
        queue = self._queue
        if queue is not None:
            await queue.release(lease, **kwargs)

    async def hand_back(self, state: RunState, reason: str) -> None:
        """Record that this worker let go of a running run (the next one does not cry crash)."""
        event = ev.RunReleased(
            run_id=state.run_id,
            seq=state.seq + 1,
            worker_id=self.worker_id,
            reason=reason,
            actor=f"worker:{self.worker_id}",
        )
        with contextlib.suppress(ConcurrencyConflict, RunIsTerminal):
            await self.store.append(state.run_id, stamp(state, [event]), expected_seq=state.seq)

    async def release(
        self,
        state: RunState,
        lease: Lease,
        *,
        reason: str,
        not_before: datetime | None = None,
        failed: bool = False,
    ) -> None:
        """Give a leased run back to the queue: RunReleased if it was running, then the lease."""
        if state.status is RunStatus.RUNNING:
            await self.hand_back(state, reason)
        await self.release_lease(lease, not_before=not_before, failed=failed)

    # -- stopping -------------------------------------------------------------------------

    def drain(self, *, reason: str, at_once: bool) -> None:
        """Let every run in flight finish its current step, then hand it back (or, `at_once`,
        cut the step in flight)."""
        self._draining = True
        self._drain_reason = reason
        for run_id, (driver, task) in self._inflight.items():
            driver.stop_requested = True
            if at_once and not task.done():
                self._cancelled.add(run_id)
                task.cancel()

    @property
    def in_flight(self) -> int:
        """Runs this runtime is driving now."""
        return len(self._inflight)

    async def _watch_for_cancel(self) -> None:
        """Cancel in-flight steps of runs that someone else ended.

        Short steps need no watching: their next append hits the fence. Only a step in flight
        for longer than the poll interval (a slow tool, a slow model) costs a status read, so a
        thousand concurrent runs do not mean a thousand reads per interval.
        """
        while self._inflight:
            await asyncio.sleep(self.cancel_poll_s)
            now = time.monotonic()
            for run_id, (driver, task) in list(self._inflight.items()):
                if task.done() or now - driver.step_started < self.cancel_poll_s:
                    continue
                summary = await self.store.get_run(run_id)
                if summary.status.is_terminal and not task.done():
                    self._cancelled.add(run_id)
                    task.cancel()


def process_gone(owner: RunOwner) -> bool:
    """Whether the owner's process is known to have ended: it ran here and its pid is free."""
    if owner.pid is None or owner.host != socket.gethostname():
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # someone else's live process
    return False
