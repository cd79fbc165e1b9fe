"""Snapshots of a run's folded state: a cache that spares a load most of the run's log.

The log stays the only truth. A snapshot names the seq it was folded up to and the format of
the code that folded and encoded it; a load that finds none, one of another format, or one
that does not decode into that run at that seq, folds the whole log instead.

Once a run is long enough to need one, the store that appends to it loads its state and
keeps folding the events it commits into it (`Folds`), so that each later snapshot costs an
encode of what is new, never a re-read of the log. Short runs cost nothing.

A snapshot is stored zlib-compressed (a run's state repeats its texts' shapes: a fan-out
parent's state of 190 kB stores in 7 kB); `restore` reads the plain JSON of snapshots written
before that as well. A long run's messages are kept compressed between its snapshots
(`MessageMemo`), so each snapshot compresses only what is new.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import zlib
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from contextos import codec
from contextos import events as ev
from contextos.errors import EventDecodeError
from contextos.messages import Message
from contextos.runs import RunId, RunStatus
from contextos.state import RunState, apply
from contextos.store.base import Row

log = logging.getLogger("contextos.store")

EVERY = 128
"""A run's snapshot is rewritten once its log has grown this many events past the last one…"""
GROWTH = 16
"""…or a 1/GROWTH of its length, if more: a snapshot's cost grows with the run, and so does
the gap between two, which keeps the cost per event constant while a load folds at most a
1/GROWTH of the log on top of its snapshot."""
AT_REST = 64
"""It is also written when the run stops (parks, is let go, or the store closes) with at least
this many events since the last one; and when a run of at least EVERY events ends, whatever
came since the last one, since no append will follow."""
CAPACITY = 4096
"""Runs a store keeps track of at most (the least recently appended go first); only the long
ones it drives now keep their folded state."""

SNAPSHOT_VERSION = 2
"""Bump when the encoding changes in a way the format's fingerprint cannot see."""

_STATE: TypeAdapter[RunState] = TypeAdapter(RunState)
_READ_STATE = codec.reader_of(_STATE)
_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])

# The modules that define the fold and every record a state holds.
_SOURCES = (
    "contextos.state",
    "contextos.events",
    "contextos.codec",
    "contextos.messages",
    "contextos.ledger",
    "contextos.records.interrupts",
    "contextos.runs",
    "contextos.delegation",
)


def _format() -> str:
    """This code's snapshot format: its encoding, the fold and the shapes of what it folds.

    The source of the fold's modules goes into it, so that a change to how a state is built
    can never meet a snapshot made before it (a forgotten version bump would go unnoticed).
    """
    digest = hashlib.sha256(f"{SNAPSHOT_VERSION}/{pydantic_core.__version__}".encode())
    for name, cls in sorted(ev.EVENT_TYPES.items()):
        digest.update(f"/{name}:{cls.SCHEMA_VERSION}".encode())
    for module in _SOURCES:
        path = getattr(sys.modules[module], "__file__", None)
        try:
            digest.update(Path(path).read_bytes() if path else module.encode())
        except OSError:  # no source shipped: the versions above decide alone
            digest.update(module.encode())
    return f"{SNAPSHOT_VERSION}.{digest.hexdigest()[:20]}"


FORMAT = _format()
"""The format this code writes, and the only one it reads."""


# Held once already: a state's input is its first message, restored from it on decode. A
# snapshot holds nothing its run's events do not, and each of the run's texts once.
_DERIVED = {"input"}


def encode(state: RunState) -> bytes:
    """The state as JSON.

    A field holding its default is left out (a load puts it back): most of a message's
    fields are empty, and a long run's snapshot is mostly messages."""
    return _STATE.dump_json(state, exclude=_DERIVED, exclude_defaults=True)


Packer = Callable[[], bytes]
"""What makes a snapshot's stored bytes (its state's JSON, zlib-compressed): called off the
event loop, so it only deflates what was taken from the state on the loop."""


def packer(state: RunState, memo: MessageMemo | None = None) -> Packer:
    """What packs `state` as it is now; `memo` keeps its messages compressed between calls."""
    if memo is not None:
        return memo.pack(state)
    return partial(zlib.compress, encode(state), 1)


_DEFLATE = (1, zlib.DEFLATED, -zlib.MAX_WBITS)
"""Raw deflate blocks, fastest level: pieces of one zlib stream, made apart."""
_ZLIB_HEAD = b"\x78\x01"
"""The header of a zlib stream of deflate blocks with a 32 kB window, fastest level."""


def _deflated(data: bytes, *, last: bool) -> bytes:
    deflate = zlib.compressobj(*_DEFLATE)
    return deflate.compress(data) + deflate.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


class MessageMemo:
    """A run's messages as the compressed start of its next snapshot, kept between snapshots.

    The fold only ever appends to a state's messages, so each snapshot deflates just the new
    ones (and all of them again if the list turns out not to have grown from the one seen
    last). They are kept compressed, a small part of their text: a long run's memory grows
    with its history once, not once more for its snapshots. Each snapshot's new messages are
    deflated on their own, into blocks that end on a byte; the blocks of all snapshots,
    followed by the state's other fields, make one zlib stream, whose check value is carried
    from piece to piece.
    """

    __slots__ = ("_blocks", "_check", "_seen")

    def __init__(self) -> None:
        self._seen: list[Message] = []
        self._blocks: list[bytes] = []
        self._check = 0
        self._start()

    def _start(self) -> None:
        self._seen.clear()
        self._blocks.clear()
        self._check = zlib.adler32(b"")
        self._add(b'{"messages":[')

    def _add(self, data: bytes) -> None:
        self._blocks.append(_deflated(data, last=False))
        self._check = zlib.adler32(data, self._check)

    def pack(self, state: RunState) -> Packer:
        """What packs `state`: its messages from this memo, the rest of it deflated when called."""
        messages, seen = state.messages, self._seen
        grown = len(messages) >= len(seen) and all(
            a is b for a, b in zip(seen, messages, strict=False)
        )
        if not grown:
            self._start()
        new = messages[len(seen) :]
        if new:
            items = _MESSAGES.dump_json(new, exclude_defaults=True)[1:-1]
            self._add((b"," if seen else b"") + items)
            seen.extend(new)
        rest = _STATE.dump_json(state, exclude={"messages", *_DERIVED}, exclude_defaults=True)
        tail = b"]," + rest[1:]
        head, check = b"".join(self._blocks), zlib.adler32(tail, self._check)

        def pack() -> bytes:
            return _ZLIB_HEAD + head + _deflated(tail, last=True) + check.to_bytes(4, "big")

        return pack


def restore(run_id: RunId, seq: int, fmt: str, blob: bytes) -> RunState | None:
    """The snapshot's state, or None when it cannot be trusted (the caller folds the log)."""
    if fmt != FORMAT:
        return None
    try:
        plain = blob if blob.startswith(b"{") else zlib.decompress(blob)
        state: RunState = _READ_STATE.validate_json(plain)
    except (ValidationError, zlib.error) as exc:
        log.warning("ignoring the snapshot of run %s at #%d: %s", run_id, seq, exc)
        return None
    if state.messages:
        state.input = state.messages[0].content
    if state.run_id != run_id or state.seq != seq:
        log.warning(
            "ignoring the snapshot of run %s at #%d: it holds run %s at #%d",
            run_id,
            seq,
            state.run_id,
            state.seq,
        )
        return None
    return state


def replay(state: RunState, rows: Sequence[Row]) -> RunState:
    """Fold event rows into `state`; a corrupt or unknown row stops with its run and seq."""
    run_id = state.run_id
    for seq, event_type, version, payload, at in rows:
        apply(state, codec.decode(run_id, seq, event_type, version, payload, at))
    return state


@dataclass(frozen=True, slots=True)
class Due:
    """A snapshot the store should write now."""

    run_id: RunId
    """The run."""
    seq: int
    """The seq it is folded up to."""
    pack: Packer | None
    """What packs the state; None when this store does not hold the state and must load it."""


@dataclass(slots=True)
class _Run:
    last: int
    """The last seq this store appended."""
    saved: int
    """Seq of the newest snapshot written, or where this store began to follow the run."""
    state: RunState | None = None
    """Folded up to `state.seq`, once the run needed a snapshot; None until then, while the
    store loads it, and when it went stale (another writer) or the run stopped here."""
    memo: MessageMemo | None = None
    """Its messages' JSON, while `state` is kept."""
    loading: bool = False
    """True while the store loads the state to snapshot it."""
    resting: bool = False
    """True when its last batch parked, released or ended it: its state is not kept."""


class Folds:
    """The runs a store appends to: when each needs a snapshot, and the folded state of the
    long ones it drives.

    Only the store touches these states: they are folded from the events it committed, and
    never handed out (a load decodes its own copy). An appender that hands in its own fold
    (a driver's) spares the store holding one: a snapshot due is encoded from it at once.
    """

    def __init__(
        self,
        *,
        every: int = EVERY,
        growth: int = GROWTH,
        at_rest: int = AT_REST,
        capacity: int = CAPACITY,
    ) -> None:
        self.every = every
        self.growth = growth
        self.at_rest = at_rest
        self.capacity = capacity
        self._runs: dict[RunId, _Run] = {}

    def appended(
        self,
        run_id: RunId,
        expected_seq: int,
        events: Sequence[ev.Event],
        folded: RunState | None = None,
    ) -> Due | None:
        """Fold a committed batch in; return the snapshot to write, if one is due.

        `folded`, the appender's own fold of the log up to `expected_seq`, is encoded at once
        when a snapshot is due and this store holds no state of the run: a snapshot just
        before the batch, which saves reading the log back and folding it a second time."""
        last = events[-1].seq
        run = self._runs.pop(run_id, None)
        if run is None:
            run = _Run(last=expected_seq, saved=expected_seq)
        state = run.state
        if state is not None:
            if state.seq == expected_seq:
                try:
                    for event in events:
                        apply(state, event)
                except EventDecodeError as exc:
                    log.debug("run %s: no snapshots from this batch: %s", run_id, exc)
                    run.state = None
            elif state.seq < last:  # another writer moved the log on
                run.state = None
            # else a load already read this batch
        run.last = max(run.last, last)
        status = None
        for event in events:
            status = type(event).SETS_STATUS or status
        run.resting = status is not None and status is not RunStatus.RUNNING
        if status is not None and status.is_terminal:  # no append will follow: forget it
            need = 1 if last >= self.every else self.at_rest
        else:
            self._runs[run_id] = run  # the least recently appended go first
            while len(self._runs) > self.capacity:
                del self._runs[next(iter(self._runs))]
            need = self.at_rest if run.resting else self.gap(run.saved)
        due = None
        if not run.loading and last - run.saved >= need:
            if run.state is None and folded is not None and folded.seq == expected_seq:
                run.memo = run.memo or MessageMemo()
                due = Due(run_id=run_id, seq=expected_seq, pack=packer(folded, run.memo))
                run.saved = expected_seq
            elif run.state is None:
                run.loading = True
                due = Due(run_id=run_id, seq=last, pack=None)
            else:
                run.memo = run.memo or MessageMemo()
                due = Due(run_id=run_id, seq=run.state.seq, pack=packer(run.state, run.memo))
                run.saved = run.state.seq  # no second one while this one is being written
        if run.resting:  # parked, let go or ended: nobody here drives it now
            run.state = run.memo = None
        return due

    def gap(self, seq: int) -> int:
        """Events a run with a snapshot at `seq` may grow before the next one."""
        return max(self.every, seq // self.growth)

    def last(self, run_id: RunId) -> int:
        """The last seq this store appended to the run (0 if it does not follow it)."""
        run = self._runs.get(run_id)
        return 0 if run is None else run.last

    def loaded(self, run_id: RunId, state: RunState | None) -> None:
        """Adopt a state the store loaded to snapshot (its own copy); None: the load failed."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.loading = False
        if state is not None and run.state is None and not run.resting and state.seq >= run.last:
            run.state = state

    def saved(self, run_id: RunId, seq: int) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            run.saved = max(run.saved, seq)

    def unsaved(self) -> list[Due]:
        """Snapshots worth writing before the store closes, and forget every run."""
        due = [
            Due(run_id=run_id, seq=run.state.seq, pack=packer(run.state, run.memo))
            for run_id, run in self._runs.items()
            if run.state is not None and run.state.seq - run.saved >= self.at_rest
        ]
        self._runs.clear()
        return due


Snapshot = tuple[int, str, bytes]
"""A snapshot row: seq, format, encoded state."""


class Snapshotting:
    """The snapshot half of a store, over a few primitives each backend provides.

    `state` loads from the newest trusted snapshot; appends keep `Folds` and write the
    snapshots it asks for in the background (a failed write is logged, never raised: the
    events are committed, and the next load folds a little more).
    """

    _folds: Folds

    async def _read_snapshot(self, run_id: RunId) -> tuple[Snapshot | None, list[Row]]:
        """The run's snapshot in this code's FORMAT (if any), and the events after it."""
        raise NotImplementedError

    async def _read_rows(self, run_id: RunId, after_seq: int) -> list[Row]:
        """Event rows after a seq; RunNotFound for an unknown run."""
        raise NotImplementedError

    async def _write_snapshot(self, run_id: RunId, seq: int, blob: bytes) -> None:
        """Keep this snapshot unless the run has a newer one of this FORMAT."""
        raise NotImplementedError

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background; the store waits for it before it closes."""
        raise NotImplementedError

    async def state(self, run_id: RunId) -> RunState:
        """The run's folded state: its snapshot, when one can be trusted, and the log after it."""
        state, folded = await self._load(run_id)
        if folded >= self._folds.gap(state.seq - folded):  # worth a fresh one for the next load
            self._spawn(self._snapshot(Due(run_id=run_id, seq=state.seq, pack=packer(state))))
        return state

    async def _load(self, run_id: RunId) -> tuple[RunState, int]:
        """A state of the caller's own, and how many events were folded on top of a snapshot."""
        snap, rows = await self._read_snapshot(run_id)
        state = restore(run_id, *snap) if snap is not None else None
        if snap is not None and state is None:
            rows = await self._read_rows(run_id, 0)
        return replay(state or RunState(run_id=run_id), rows), len(rows)

    def _folded(
        self,
        run_id: RunId,
        expected_seq: int,
        events: Sequence[ev.Event],
        folded: RunState | None = None,
    ) -> None:
        """Keep a committed batch's run folded; snapshot it when one is due."""
        try:
            due = self._folds.appended(run_id, expected_seq, events, folded)
        except Exception:  # a cache: its failure must never fail a committed append
            log.exception("run %s: cannot fold the appended events for a snapshot", run_id)
            return
        if due is not None:
            self._spawn(self._snapshot(due))

    def _unsaved(self) -> None:
        """Snapshot the runs this store stops following (it is closing)."""
        try:
            dues = self._folds.unsaved()
        except Exception:  # a cache: it must never keep the store from closing
            log.exception("cannot snapshot the runs this store drove")
            return
        for due in dues:
            self._spawn(self._snapshot(due))

    async def _snapshot(self, due: Due) -> None:
        run_id, seq, pack = due.run_id, due.seq, due.pack
        try:
            if pack is None:  # this store does not hold the run's state yet: load it
                state: RunState | None = None
                try:
                    state, _ = await self._load(run_id)
                    for _ in range(3):  # appends that committed meanwhile
                        if state.seq >= self._folds.last(run_id):
                            break
                        replay(state, await self._read_rows(run_id, state.seq))
                finally:
                    self._folds.loaded(run_id, state)
                seq, pack = state.seq, packer(state)
            await self._write_snapshot(run_id, seq, await asyncio.to_thread(pack))
        except Exception:
            log.warning("run %s: snapshot at #%d not written", run_id, seq, exc_info=True)
            return
        self._folds.saved(run_id, seq)
