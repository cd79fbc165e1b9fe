"""The EventStore protocol every backend implements, and the run summary it keeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, cast, runtime_checkable

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from contextos import codec
from contextos import events as ev
from contextos.errors import ConcurrencyConflict, EventDecodeError, EventEncodeError
from contextos.runs import RunId, RunStatus, can_transition
from contextos.state import RunState, apply, fold


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    """A run's row in the store: a projection of its events kept for listing."""

    run_id: RunId
    """The run."""
    agent_name: str
    """Agent name at creation."""
    agent_version: str
    """Agent version at creation."""
    status: RunStatus
    """Current status."""
    last_seq: int
    """Seq of the last event."""
    created_at: datetime
    """When the run was created (UTC)."""
    updated_at: datetime
    """When its last event was appended (UTC)."""
    turns: int = 0
    """Model calls answered (its finished child runs' included)."""
    input_tokens: int = 0
    """Prompt tokens over the run (its finished child runs' included)."""
    output_tokens: int = 0
    """Completion tokens over the run (its finished child runs' included)."""
    cost_usd: float = 0.0
    """Money spent over the run (its finished child runs' included)."""


TOP_LEVEL = (
    "NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = runs.run_id AND e.seq <= 3"
    " AND e.type = 'delegation_bound')"
)
"""The SQL condition on `runs` of a run no other run started: a child run's log binds its
delegation contract among its first events (a primary-key range, so it costs one probe)."""


@runtime_checkable
class EventStore(Protocol):
    """Append-only run logs with optimistic concurrency.

    `append` is the fence: it names the seq the caller last saw, and fails with
    `ConcurrencyConflict` when the log has moved on, or `RunIsTerminal` when the run has ended.
    All events of one call land in one transaction or not at all.
    """

    url: str

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
    ) -> int:
        """Append events numbered expected_seq+1, +2, …; return the new last seq.

        `expected_seq=0` creates the run, and its first event must be `RunCreated`.
        With `synchronous=False` the events are committed and visible at once, safe from a
        process crash, but the store need not wait for the disk: they become safe from a power
        loss with the next synchronous commit (the log is written in order). SQLite commits
        it with `synchronous=NORMAL`, PostgreSQL with `synchronous_commit` off; a store that
        cannot defer the flush treats every append as synchronous.
        """
        ...

    async def read(self, run_id: RunId, *, after_seq: int = 0) -> list[ev.Event]:
        """Events with seq > after_seq, in order. Raises RunNotFound for an unknown run."""
        ...

    async def get_run(self, run_id: RunId) -> RunSummary:
        """The run's summary. Raises RunNotFound for an unknown run."""
        ...

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int = 50,
        tenant: str | None = None,
        top_level: bool = False,
        prefix: str | None = None,
    ) -> list[RunSummary]:
        """Most recently updated runs first, optionally of one status, of one tenant, whose
        id starts with `prefix`; with `top_level`, only runs no other run started (see
        TOP_LEVEL)."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...


@runtime_checkable
class StateStore(Protocol):
    """A store that loads a run's folded state itself, from a snapshot and the log after it."""

    async def append(
        self,
        run_id: RunId,
        events: Sequence[ev.Event],
        *,
        expected_seq: int,
        synchronous: bool = True,
        folded: RunState | None = None,
    ) -> int:
        """`EventStore.append`; `folded` is the caller's fold of the log up to `expected_seq`,
        which a snapshot due now is taken from instead of the log read back (the store is
        done with it when the append returns)."""
        ...

    async def state(self, run_id: RunId) -> RunState:
        """The run's state, equal to `fold(await read(run_id))`. Raises RunNotFound."""
        ...


DEFAULT_TENANT = "default"
"""The tenant of a run started without one (and of the local operator)."""


def run_filter(
    status: RunStatus | None,
    tenant: str | None,
    placeholder: str,
    *,
    top_level: bool = False,
    prefix: str | None = None,
    bytewise: tuple[str, str] = (">=", "<"),
) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause (and its parameters) of `list_runs`: a run's tenant is its queue
    entry's, and a run queued without one belongs to the default tenant; `top_level` keeps
    only runs no other run started; `prefix` only ids that start with it (compared exactly,
    where LIKE would read `_` and `%` as patterns and SQLite's would ignore case).

    A prefix is also a range of ids, read from the index on the id (`bytewise`: the store's
    operators that compare ids byte by byte), so finding a few runs by prefix does not read
    every run of a status: the release of an agent is looked up so at every run's start."""
    clauses: list[str] = []
    params: list[str] = []
    if status is not None:
        # With a prefix, the status is checked on the few runs of the id range rather than
        # picking the status's index (SQLite would, reading every run of that status).
        column = "status || ''" if prefix else "status"
        clauses.append(f"{column} = {placeholder}")
        params.append(RunStatus(status).value)
    if tenant is not None:
        clauses.append(
            "run_id IN (SELECT run_id FROM run_queue WHERE"
            f" coalesce(nullif(tenant, ''), '{DEFAULT_TENANT}') = {placeholder})"
        )
        params.append(tenant)
    if top_level:
        clauses.append(TOP_LEVEL)
    if prefix is not None:
        if prefix and ord(prefix[-1]) < 0x10FFFF:
            at_least, below = bytewise
            clauses.append(f"run_id {at_least} {placeholder} AND run_id {below} {placeholder}")
            params += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
        clauses.append(f"substr(run_id, 1, {len(prefix)}) = {placeholder}")
        params.append(prefix)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def conforms(obj: object, protocol: type) -> bool:
    """`isinstance(obj, protocol)` for a runtime-checkable protocol, answered once per type:
    the check looks up every member of the protocol and costs tens of microseconds, and the
    runtime asks it of its store several times a run."""
    key = (type(obj), protocol)
    if key not in _CONFORMING:
        try:
            _CONFORMING[key] = issubclass(key[0], protocol)
        except TypeError:  # a protocol with data members: only an instance can tell
            _CONFORMING[key] = None
    known = _CONFORMING[key]
    return isinstance(obj, protocol) if known is None else known


_CONFORMING: dict[tuple[type, type], bool | None] = {}


async def load_state(store: EventStore, run_id: RunId) -> RunState:
    """A run's folded state: the store's own way when it has one, else the fold of its log."""
    if conforms(store, StateStore):
        return await cast(StateStore, store).state(run_id)
    return fold(await store.read(run_id), run_id)


async def append_after(
    store: EventStore,
    state: RunState,
    events: Sequence[ev.Event],
    *,
    requests: tuple[type[ev.Event], ...],
    synchronous: bool = True,
    prepare: Callable[[Sequence[ev.Event]], Sequence[ev.Event]] = tuple,
) -> tuple[ev.Event, ...]:
    """Append `events` right after `state` (the fence), and return them as appended (each
    time through `prepare`, which may fill in what depends on the state).

    Someone else's `requests` (a person asking the run to end or to pause) may have come in
    since: they are folded into `state`, and the events numbered to follow them. Any other
    writer means the run was lost, and ConcurrencyConflict stands."""
    while True:
        out = tuple(prepare(events))
        check_moves(state, out)
        try:
            # A store that snapshots may take one due from the caller's fold.
            given = {"folded": state} if conforms(store, StateStore) else {}
            await store.append(
                state.run_id, out, expected_seq=state.seq, synchronous=synchronous, **given
            )
            return out
        except ConcurrencyConflict:
            tail = await store.read(state.run_id, after_seq=state.seq)
            if not tail or not all(isinstance(e, requests) for e in tail):
                raise
            for e in tail:
                apply(state, e)
            events = [replace(e, seq=state.seq + i) for i, e in enumerate(out, 1)]


def check_moves(state: RunState, events: Sequence[ev.Event]) -> None:
    """Refuse, before anything is written, events that would move the run where its status
    may not go: stored, they would leave a log no fold can read."""
    status = state.status
    for i, e in enumerate(events):
        new = type(e).SETS_STATUS
        if new is None:
            continue
        if (state.seq > 0 or i > 0) and not can_transition(status, new):
            raise ValueError(
                f"run {state.run_id}: {e.type} would move a {status} run to {new}, which is "
                "not allowed; nothing was written"
            )
        status = new


Row = tuple[int, str, int, bytes, datetime | str]
"""A stored event: seq, type, schema version, payload, when it occurred (the column)."""

OFF_LOOP_ROWS = 512
"""Reads of at least this many events decode them in a thread: a long log takes tens of
milliseconds to decode, during which the event loop (other runs, leases to renew, a caller
waiting for a result) would otherwise stand still."""


async def decode_rows(run_id: RunId, rows: Sequence[Row]) -> list[ev.Event]:
    """Stored rows (seq, type, schema version, payload, time) as events."""
    if len(rows) < OFF_LOOP_ROWS:
        return _decode(run_id, rows)
    return await asyncio.to_thread(_decode, run_id, rows)


def _decode(run_id: RunId, rows: Sequence[Row]) -> list[ev.Event]:
    return [codec.decode(run_id, seq, t, v, payload, at) for seq, t, v, payload, at in rows]


def check_batch(run_id: RunId, events: Sequence[ev.Event], expected_seq: int) -> None:
    """Shared sanity checks every backend makes before touching its database."""
    if not events:
        raise ValueError("append() needs at least one event")
    for offset, event in enumerate(events, start=1):
        if event.run_id != run_id:
            raise ValueError(f"event for run {event.run_id} appended to run {run_id}")
        if event.seq != expected_seq + offset:
            raise ValueError(
                f"event seq {event.seq} does not follow expected seq {expected_seq} "
                f"(should be {expected_seq + offset})"
            )
    if expected_seq == 0 and not isinstance(events[0], ev.RunCreated):
        raise ValueError("a run's first event must be RunCreated")


def encode_batch(run_id: RunId, events: Sequence[ev.Event]) -> list[bytes]:
    """Each event's stored payload, sure to read back (decoded once when only that can tell)
    before anything is written.

    A value its field's type cannot carry (an object where text belongs, say) serialises with at
    most a warning into a row that no later read could decode, and the run could never be
    resumed, shown or cancelled again: such an append is refused whole, with EventEncodeError.
    """
    payloads: list[bytes] = []
    for event in events:
        checked = codec.pack_checked(event)
        if checked is not None:
            payloads.append(checked)
            continue
        try:
            payload = codec.pack(event)
            version = type(event).SCHEMA_VERSION
            codec.decode(run_id, event.seq, event.type, version, payload, event.occurred_at)
        except PydanticSerializationError as exc:
            raise EventEncodeError(run_id, event.seq, str(exc)) from exc
        except EventDecodeError as exc:
            raise EventEncodeError(run_id, event.seq, _why(exc)) from exc
        payloads.append(payload)
    return payloads


def _why(exc: EventDecodeError) -> str:
    """What did not read back, on one line: each field's path and the problem."""
    cause = exc.__cause__
    if not isinstance(cause, ValidationError):
        return exc.message
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
        for error in cause.errors(include_url=False)
    )


@dataclass(slots=True)
class SummaryDelta:
    """How a batch of events changes a run's summary row."""

    status: RunStatus | None = None
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


def summarize(events: Sequence[ev.Event]) -> SummaryDelta:
    delta = SummaryDelta()
    for event in events:
        status = ev.status_after(event)
        if status is not None:
            delta.status = status
        if isinstance(event, ev.ModelResponded):
            delta.turns += 1
            delta.input_tokens += event.usage.input_tokens
            delta.output_tokens += event.usage.output_tokens
            delta.cost_usd += event.usage.cost_usd
        elif isinstance(event, ev.ChildRunFinished):  # what it delegated is its spend too
            delta.turns += event.turns
            delta.input_tokens += event.usage.input_tokens
            delta.output_tokens += event.usage.output_tokens
            delta.cost_usd += event.usage.cost_usd
    return delta
