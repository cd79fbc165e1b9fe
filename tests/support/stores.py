"""A store that dies on cue: the process 'crashes' right after an append it was told about."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contextos import events as ev
from contextos.runs import RunId
from contextos.store import SqliteStore


class Crash(BaseException):
    """Stands in for the process dying (a BaseException: nothing catches it on the way)."""


class CrashAfter(SqliteStore):
    """A SQLite store that raises `Crash` once an append holding a matching event committed:
    the log ends exactly there, as after a SIGKILL at that moment."""

    def __init__(self, path: str | Path, when: Callable[[ev.Event], bool]) -> None:
        super().__init__(path)
        self.when = when

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        **options: Any,
    ) -> int:
        seq = await super().append(
            run_id, events, expected_seq=expected_seq, synchronous=synchronous, **options
        )
        if any(self.when(e) for e in events):
            raise Crash()
        return seq
