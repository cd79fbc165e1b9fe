"""The DecisionRecords a runtime stores as the runs it drives stop.

A stored record is a receipt: it can always be rebuilt from the run's log, so failing to store
one never fails the run.
"""

from __future__ import annotations

import asyncio
import logging

from contextos.evidence.record import materialise
from contextos.runs import RunStatus
from contextos.state import RunState
from contextos.store import EventStore

log = logging.getLogger("contextos.runtime")


class Records:
    """Stores the record of each run that ended or waits on a person."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._storing: set[asyncio.Task[None]] = set()
        """Records of ended runs being stored in the background."""

    async def stopped(self, state: RunState) -> None:
        """A driver stopped driving the run: store its record if it ended or waits.

        A run that ended has its end committed and its log frozen, so its record is made and
        stored in the background and its result is handed back without waiting for it (a long
        run's record is most of the time a resume to its end takes); `stored` waits for it. A
        run that waits on a person may go on at once: its record is stored now. A child run's
        record is vouched for by its parent's log (`child_run_finished`) instead.
        """
        if state.is_terminal:
            if state.delegation is not None:
                return
            task = asyncio.create_task(self._store(state))
            self._storing.add(task)
            task.add_done_callback(self._storing.discard)
        elif state.status is RunStatus.INPUT_REQUIRED:
            await self._store(state)

    async def stored(self) -> None:
        """Wait for the records being stored in the background."""
        while self._storing:
            await asyncio.gather(*self._storing)

    async def _store(self, state: RunState) -> None:
        try:
            # The state is the log folded up to its seq: the record needs no second fold.
            events = (await self.store.read(state.run_id))[: state.seq]
            await materialise(self.store, events, state)
        except Exception:
            log.warning("run %s: could not store its decision record", state.run_id, exc_info=True)


__all__ = ["Records"]
