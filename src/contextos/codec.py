"""The one codec for every event: stored rows to events and back.

Each row stores its event's schema version; a row with a version this code does not know stops
loudly instead of guessing, and an older version is brought up to date by its upcasters.

Version history (bump SCHEMA_VERSION on the type, add a line here and a golden fixture of the
old shape under tests/fixtures/events/):
- every type: v1, the first shape.
- run_completed v2: `answer_seq` names the model answer that holds the output, which is then
  not repeated in `output` (v1 always repeated it; it reads as v2 without `answer_seq`).
- every type: the optional `correlation_id` (rows written before it read with none), and on
  run_created the optional `caused_by`; no version bump, since no older reader is misled.
- node_completed: the optional `route` (the node a conditional edge chose; rows written before
  it read with none); no version bump, since no graph without routes writes one.
- user_message_added moves the run to `queued` (a follow-up is answered by the next driver);
  no version bump: nothing recorded it before.
- node_started: the optional `effect` (a code node's declared effect, recorded before its code
  runs; rows written before it read with none); no version bump, since no graph without
  effects writes one.
- child_run_finished: the optional `record_hash` (the child's DecisionRecord, which the child
  no longer stores itself; rows written before it read with none); no version bump, since
  the child runs of those rows stored their records.
- every type: a stored row leaves out the fields that hold their default, `type` included (the
  row's own column names it), and reads them back as those defaults; rows written whole
  before read as ever. No version bump: the events are the same. A field's default is thus
  part of its type's schema: changing one needs a version bump whose upcaster writes the old
  default into the rows that left it out.
- every type: a stored row leaves out `run_id`, `seq` and `occurred_at` too, which its own
  columns hold, and reads them back from those columns; rows written whole before read as
  ever (their payload opens with `run_id`). No version bump: an older reader stops loudly on
  such a row (a required field is missing) instead of misreading it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import CoreConfig, PydanticSerializationError, SchemaValidator

from contextos.delegation import DelegationContract
from contextos.errors import EventDecodeError
from contextos.events import EVENT_TYPES, Event
from contextos.messages import Message, ToolCall, Usage
from contextos.runs import Budget

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("run_completed", 1): lambda payload: payload,  # v2 only added `answer_seq`
}
"""(type, old version) -> function turning that payload into the next version's shape."""


SHARED = (ToolCall, Message, Usage, Budget, DelegationContract)
"""Records that several event types and the run state hold, each after the records it holds.

pydantic builds the schema of a plain dataclass anew inside every type that holds one, and a
process that reads a run meets several of those types for the first time: building each of
these once and handing it to pydantic where it looks for a dataclass's own
(`__pydantic_core_schema__`, as a pydantic dataclass keeps it) spares a fresh process that
part of each later type's build. Should pydantic stop looking there, it builds them again:
slower, the same schema."""

for _record in SHARED:
    _record.__pydantic_core_schema__ = TypeAdapter(_record).core_schema  # type: ignore[union-attr]


# One adapter per type, built on first use: the union's must first find which member an event
# is, which costs several times the encoding itself; and a packed row does not name its type.
_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


_READERS: dict[type[Any], SchemaValidator] = {}


def reader(cls: type[Any]) -> SchemaValidator:
    """What reads stored JSON of `cls` (an event's row)."""
    found = _READERS.get(cls)
    if found is None:
        found = _READERS[cls] = reader_of(_adapter(cls))
    return found


def reader_of(adapter: TypeAdapter[Any]) -> SchemaValidator:
    """A validator of stored JSON for what `adapter` reads.

    pydantic keeps every short string it reads in a process-wide cache by default: for stored
    rows, the ids of runs long gone, filling a worker's memory as it drives run after run.
    Field names recur on every row, so only those are cached.
    """
    return SchemaValidator(adapter.core_schema, CoreConfig(cache_strings="keys"))


def encode(event: Event) -> bytes:
    """The event as JSON bytes, envelope included."""
    return _adapter(type(event)).dump_json(event)


ROW_FIELDS = {"run_id", "seq", "occurred_at"}
"""Fields a stored row keeps in columns of its own (as it does `type`), not in its payload."""

_WHOLE = b'{"run_id"'
"""How a payload that holds every field opens (a row written before ROW_FIELDS were left
out, or an exported event): `run_id` is every event's first field."""


def pack(event: Event) -> bytes:
    """The event as a stored row's payload: its JSON without what the row's columns hold
    (ROW_FIELDS, `type`) and without the fields that hold their default (an empty list, a
    null, a zero usage)."""
    return _adapter(type(event)).dump_json(event, exclude_defaults=True, exclude=ROW_FIELDS)


def pack_checked(event: Event) -> bytes | None:
    """`pack(event)` when that payload is sure to read back, without decoding it; None when only
    decoding it can tell.

    Serialising with warnings as errors refuses a value its field's type does not expect. Two
    kinds of value pass that and still would not read back: a float that is not finite (JSON
    has no NaN: it is written `null`) and a `Literal` field holding a value it does not list.
    The first leaves a `null` in the payload; the second is looked for in the event's own
    `Literal` fields. A type whose schema this cannot follow is always decoded.
    """
    literals = _literals(type(event))
    if literals is None:
        return None
    try:
        payload = _adapter(type(event)).dump_json(
            event, exclude_defaults=True, exclude=ROW_FIELDS, warnings="error"
        )
    except PydanticSerializationError:
        return None
    if b"null" in payload:
        return None
    for path, allowed in literals:
        if not all(value in allowed for value in _at(event, path)):
            return None
    return payload


LiteralPath = tuple[tuple[str, ...], frozenset[Any]]
"""Where a `Literal` field sits in an event (attribute names; `*` for each item of a sequence,
`{}` for each value of a mapping) and the values it may hold."""

_LITERALS: dict[type[Any], tuple[LiteralPath, ...] | None] = {}


def _literals(cls: type[Any]) -> tuple[LiteralPath, ...] | None:
    """The `Literal` fields of an event type (but its `type`); None if its schema holds one where
    a path cannot reach (in a union) or a kind of schema this does not know."""
    if cls not in _LITERALS:
        found: list[LiteralPath] = []
        ok = _walk(_adapter(cls).core_schema, {}, (), found, set())
        _LITERALS[cls] = tuple(p for p in found if p[0] != ("type",)) if ok else None
    return _LITERALS[cls]


_PLAIN = frozenset(
    ("str", "int", "float", "bool", "any", "none", "enum", "datetime", "date", "bytes", "uuid")
)
_WRAPPED = ("schema", "json_schema", "python_schema", "lax_schema", "strict_schema")


def _walk(
    schema: Any,
    refs: dict[str, Any],
    path: tuple[str, ...],
    found: list[LiteralPath],
    seen: set[tuple[str, tuple[str, ...]]],
) -> bool:
    """Collect the literal paths under `schema`; False where it cannot vouch for one."""
    kind = schema["type"]
    if "ref" in schema:
        refs.setdefault(schema["ref"], schema)
    if kind in _PLAIN:
        return True
    if kind == "literal":
        found.append((path, frozenset(schema["expected"])))
        return True
    if kind == "definitions":
        for d in schema["definitions"]:
            refs[d["ref"]] = d
        return _walk(schema["schema"], refs, path, found, seen)
    if kind == "definition-ref":
        key = (schema["schema_ref"], path)
        if key in seen:  # a recursive type: its fields are being walked already
            return True
        seen.add(key)
        return _walk(refs[schema["schema_ref"]], refs, path, found, seen)
    if kind == "dataclass-args":
        return all(
            _walk(f["schema"], refs, (*path, f["name"]), found, seen) for f in schema["fields"]
        )
    if kind in ("list", "set", "frozenset"):
        items = schema.get("items_schema")
        return items is None or _walk(items, refs, (*path, "*"), found, seen)
    if kind == "tuple":
        return all(_walk(s, refs, (*path, "*"), found, seen) for s in schema["items_schema"])
    if kind == "dict":
        keys, values = schema.get("keys_schema"), schema.get("values_schema")
        return (keys is None or keys["type"] == "str") and (
            values is None or _walk(values, refs, (*path, "{}"), found, seen)
        )
    if kind in ("union", "tagged-union"):
        # A literal inside a union cannot be told from the member that carries it.
        inner: list[LiteralPath] = []
        choices = schema["choices"].values() if kind == "tagged-union" else schema["choices"]
        members = [c[0] if isinstance(c, tuple) else c for c in choices]
        return all(_walk(c, refs, path, inner, seen) for c in members) and not inner
    wrapped = [schema[k] for k in _WRAPPED if k in schema]
    if kind in ("dataclass", "nullable", "default", "json-or-python", "lax-or-strict") or (
        kind.startswith("function-") and wrapped
    ):
        return all(_walk(s, refs, path, found, seen) for s in wrapped)
    return False


def _at(value: Any, path: tuple[str, ...]) -> list[Any]:
    """The values at `path` under `value` (None-valued steps lead nowhere)."""
    values = [value]
    for step in path:
        if step == "*":
            values = [item for v in values for item in v]
        elif step == "{}":
            values = [item for v in values for item in v.values()]
        else:
            values = [getattr(v, step) for v in values]
        values = [v for v in values if v is not None]
    return values


def decode(
    run_id: str,
    seq: int,
    event_type: str,
    version: int,
    payload: bytes | str,
    occurred_at: datetime | str | None = None,
) -> Event:
    """Turn a stored row back into an event; corrupt or unknown rows raise EventDecodeError.

    `occurred_at` is the row's column: a packed payload leaves it out (see `pack`)."""
    if isinstance(payload, str):
        payload = payload.encode()
    if not payload.startswith(_WHOLE):
        payload = _with_row(run_id, seq, occurred_at, payload)
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise EventDecodeError(run_id, seq, f"unknown event type {event_type!r}")
    if version != cls.SCHEMA_VERSION:
        if version > cls.SCHEMA_VERSION or version < 1:
            raise EventDecodeError(
                run_id,
                seq,
                f"{event_type} has schema version {version}, this code knows up to "
                f"{cls.SCHEMA_VERSION}; upgrade ContextOS to read it",
            )
        return _upcast(run_id, seq, event_type, version, payload)
    try:
        event: Event = reader(cls).validate_json(payload)
    except ValidationError as exc:
        raise EventDecodeError(run_id, seq, f"corrupt {event_type} payload: {exc}") from exc
    if event.run_id != run_id or event.seq != seq or event.type != event_type:
        raise EventDecodeError(run_id, seq, "payload does not match its row (run id, seq or type)")
    return event


def _with_row(run_id: str, seq: int, occurred_at: datetime | str | None, payload: bytes) -> bytes:
    """A packed payload with the row's own fields put back in front."""
    if occurred_at is None:
        raise EventDecodeError(run_id, seq, "the row gives no time for its event")
    if isinstance(occurred_at, datetime):  # PostgreSQL's column, in the session's zone
        occurred_at = occurred_at.astimezone(UTC).isoformat()
    head = f'{{"run_id":{json.dumps(run_id)},"seq":{seq},"occurred_at":{json.dumps(occurred_at)}'
    body = payload.strip()
    if body == b"{}":
        return head.encode() + b"}"
    if not body.startswith(b"{"):
        return body  # not an object: validation says so
    return head.encode() + b"," + body[1:]


def _upcast(run_id: str, seq: int, event_type: str, version: int, payload: bytes | str) -> Event:
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise EventDecodeError(run_id, seq, f"corrupt {event_type} payload: {exc}") from exc
    current = EVENT_TYPES[event_type].SCHEMA_VERSION
    while version < current:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise EventDecodeError(run_id, seq, f"no upcaster for {event_type} v{version}")
        data = step(data)
        version += 1
    try:
        upcast: Event = _adapter(EVENT_TYPES[event_type]).validate_python(data)
        return upcast
    except ValidationError as exc:
        raise EventDecodeError(run_id, seq, f"corrupt {event_type} payload: {exc}") from exc
