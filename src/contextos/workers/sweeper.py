"""The expiry sweeper: a worker's pass over the runs waiting for a person, expiring what is
overdue (see `contextos.policy.expiry` for what an expiry records)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from contextos import events as ev
from contextos.errors import RunNotFound
from contextos.events import utcnow
from contextos.policy.expiry import expire_overdue, next_due
from contextos.runs import RunStatus
from contextos.store.base import EventStore, load_state

log = logging.getLogger("contextos.expiry")

SWEEP_LIMIT = 10_000
"""Waiting runs one sweep looks at (the most recently updated first)."""


@dataclass(slots=True)
class _Seen:
    seq: int
    due: datetime | None


class Sweeper:
    """Finds waiting runs whose interrupts are overdue and expires them.

    One pass is one indexed query for the runs in `input_required`; a run's log is read only
    when it changed since the last pass (its last seq moved), so the cost of a pass does not
    grow with the length of the logs of runs that are simply waiting.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Callable[[], datetime] = utcnow,
        actor: str = "runtime",
        limit: int = SWEEP_LIMIT,
    ) -> None:
        self.store = store
        self.clock = clock
        self.actor = actor
        self.limit = limit
        self._seen: dict[str, _Seen] = {}

    async def sweep(self) -> list[ev.InterruptExpired]:
        """One pass: expire everything overdue now; returns the expiries it recorded."""
        now = self.clock()
        waiting = await self.store.list_runs(status=RunStatus.INPUT_REQUIRED, limit=self.limit)
        seen: dict[str, _Seen] = {}
        expired: list[ev.InterruptExpired] = []
        for summary in waiting:
            rid = str(summary.run_id)
            known = self._seen.get(rid)
            if known is None or known.seq != summary.last_seq:
                try:
                    state = await load_state(self.store, summary.run_id)
                except RunNotFound:
                    continue
                known = _Seen(seq=state.seq, due=next_due(state))
            seen[rid] = known
            if known.due is not None and known.due <= now:
                expired.extend(await expire_overdue(self.store, rid, now=now, actor=self.actor))
                seen.pop(rid, None)  # read again next time, whatever happened
        self._seen = seen
        return expired

    async def run(
        self,
        every_s: float,
        stop: asyncio.Event,
        *,
        on_expired: Callable[[list[ev.InterruptExpired]], None] | None = None,
    ) -> None:
        """Sweep every `every_s` seconds until `stop` is set."""
        while not stop.is_set():
            try:
                expired = await self.sweep()
                if expired and on_expired is not None:
                    on_expired(expired)
            except Exception:
                log.exception("sweeping for expired interrupts failed; trying again")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):
                    await stop.wait()
