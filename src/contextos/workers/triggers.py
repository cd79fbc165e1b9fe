"""Triggers: a run started by another run finishing, or by an HTTP webhook.

A run trigger listens to a source agent. When a run of that agent ends, the database records a
*firing* in the same transaction as the ending, one per trigger that listens; a run that ends
therefore cannot be forgotten, whatever happens to the process that ended it. Workers start the
run a firing owes (at once for the runs they drive, and in a catch-up pass for the others),
then delete the firing. The run's id and idempotency key derive from the trigger's name and the
source run's id, so every attempt — two workers racing, a worker killed between starting the
run and deleting the firing — ends in the same single run. Pending firings are the only rows a
pass reads: history is never rescanned.

A webhook trigger starts a run with an HTTP request's body as its input, once per delivery id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import string
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextos.agents import Agent
from contextos.errors import ConfigError, RunNotFound, SignatureExpired, SignatureInvalid
from contextos.graph import Workflow, load_runnable
from contextos.runs import RunId, check_priority
from contextos.store.base import EventStore
from contextos.store.queue import (
    Firing,
    RunQueue,
    Trigger,
    TriggerKind,
    TriggerOn,
    queue_of,
    require_queue,
    trigger_key,
)
from contextos.workers.scheduler import retry_at

if TYPE_CHECKING:
    from contextos.runtime import Runtime
    from contextos.state import RunState

log = logging.getLogger("contextos.triggers")

TEMPLATE_FIELDS: dict[str, str] = {
    "output": "the source run's final answer (empty if it has none)",
    "run_id": "the source run's id",
    "status": "how it ended: completed, failed, cancelled or expired",
    "failure": "why it failed or was cancelled (empty if it completed)",
    "agent": "the source agent's name",
    "input": "the source run's own input",
}
"""What an input template may say, as `{name}` (`{{` and `}}` for braces)."""

SIGNATURE_HEADER = "X-ContextOS-Signature"
"""`t=UNIX_SECONDS,v1=HEX`: when the delivery was signed, and the hex HMAC-SHA256 of
`"{t}.{body}"` under the trigger's secret (several `v1=` while a secret is being rotated)."""
SIGNATURE_TOLERANCE_S = 300.0
"""How far (either way) a signature's timestamp may be from the receiver's clock by default."""
DELIVERY_HEADER = "X-ContextOS-Delivery"
"""The sender's unique id for one delivery; a retried delivery carries the same id."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- adding triggers ------------------------------------------------------------------------


def check_template(template: str) -> None:
    """Raise ConfigError unless every `{field}` of `template` is one of TEMPLATE_FIELDS."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(
            f"bad input template {template!r}: {exc} (write {{{{ and }}}} for braces)"
        ) from exc
    known = ", ".join(f"{{{name}}}" for name in TEMPLATE_FIELDS)
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS or spec or conversion:
            raise ConfigError(
                f"bad input template {template!r}: unknown field {{{name}}}; use {known}",
                template=template,
            )


def render_input(template: str | None, source: RunState) -> str:
    """The triggered run's input: the template filled from the source run, or its output.

    The template was checked when the trigger was added; fields are substituted literally, so
    a source run's output cannot reach into the template's own syntax.
    """
    values = {
        "output": source.output or "",
        "run_id": source.run_id,
        "status": source.status.value,
        "failure": source.failure_message or "",
        "agent": source.agent_name,
        "input": source.input,
    }
    if template is None:
        return source.output if source.output is not None else values["failure"]
    out: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(values[name])
    return "".join(out)


def find_cycle(triggers: Iterable[Trigger], new: Trigger) -> list[str] | None:
    """The agents of the loop that `new` would close among run triggers, or None.

    `[a, a]` is an agent triggering itself; `[a, b, a]` is a → b → a.
    """
    edges: dict[str, set[str]] = {}
    for t in [*triggers, new]:
        if t.kind is TriggerKind.RUN:
            edges.setdefault(t.source_agent, set()).add(t.agent_name)
    # A path from the new trigger's target back to its source closes the loop.
    start, goal = new.agent_name, new.source_agent
    paths: list[list[str]] = [[goal, start]]
    seen = {start}
    while paths:
        path = paths.pop(0)
        if path[-1] == goal:
            return path
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == goal or nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    return None


async def add_trigger(
    store: EventStore,
    name: str,
    agent_ref: str,
    *,
    after: str | None = None,
    on: TriggerOn | str = TriggerOn.COMPLETED,
    input: str | None = None,
    webhook: bool = False,
    secret_env: str | None = None,
    allow_cycle: bool = False,
    max_depth: int = 10,
    priority: int = 0,
    tenant: str = "",
) -> Trigger:
    """Store a trigger: `after=SOURCE_AGENT_NAME` for a run trigger, or `webhook=True`.

    Everything is checked before anything is stored: the name, the agent reference (imported
    now, not at the first firing), the template, and loops between run triggers, which need
    `allow_cycle` (a chain then stops `max_depth` triggers down).
    """
    queue = require_queue(store)
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"bad trigger name {name!r}: use up to 64 letters, digits, '.', '_' or '-' "
            "(it is also the webhook's URL path)",
            trigger=name,
        )
    if webhook == (after is not None):
        raise ConfigError(
            f"trigger {name!r}: give either --after SOURCE_AGENT_NAME (start a run when a run "
            "of that agent ends) or --webhook (start a run on POST /v1/hooks/NAME)",
            trigger=name,
        )
    try:
        when = TriggerOn(on)
    except ValueError:
        raise ConfigError(
            f"trigger {name!r}: unknown --on {on!r}: use completed, failed or any", trigger=name
        ) from None
    if max_depth < 1:
        raise ConfigError(f"trigger {name!r}: --max-depth must be at least 1", trigger=name)
    check_priority(priority)
    if webhook:
        if input is not None:
            raise ConfigError(
                f"trigger {name!r}: a webhook's runs take the request body as input; "
                "--input is for run triggers",
                trigger=name,
            )
        if secret_env is not None and not _ENV_VAR.fullmatch(secret_env):
            raise ConfigError(
                f"trigger {name!r}: --secret-env takes the name of an environment variable, "
                f"not {secret_env!r}",
                trigger=name,
            )
    else:
        if secret_env is not None:
            raise ConfigError(
                f"trigger {name!r}: --secret-env is for webhooks (signed requests)", trigger=name
            )
        if not after:
            raise ConfigError(f"trigger {name!r}: --after needs an agent name", trigger=name)
        if input is not None:
            check_template(input)
    agent = load_runnable(agent_ref)  # a bad reference fails now, not at every firing
    trigger = Trigger(
        name=name,
        kind=TriggerKind.WEBHOOK if webhook else TriggerKind.RUN,
        agent_ref=agent_ref,
        agent_name=agent.name,
        source_agent=after or "",
        on=when,
        input=input,
        secret_env=secret_env,
        allow_cycle=allow_cycle,
        max_depth=max_depth,
        priority=priority,
        tenant=tenant,
    )
    if trigger.kind is TriggerKind.RUN and not allow_cycle:
        loop = find_cycle(await queue.list_triggers(), trigger)
        if loop is not None:
            raise ConfigError(
                f"trigger {name!r} would close a loop: {' → '.join(loop)} (each run would "
                "start the next forever); pass --allow-cycle to allow it, and chains then stop "
                f"after --max-depth triggers (now {max_depth})",
                trigger=name,
                loop=loop,
            )
    await queue.add_trigger(trigger)
    return trigger


async def list_triggers(store: EventStore) -> list[Trigger]:
    """The store's triggers: what fires each one and what it starts."""
    return await require_queue(store).list_triggers()


async def remove_trigger(store: EventStore, name: str) -> bool:
    """Remove a trigger (runs it started stay; firings it still owed are dropped); False when
    there is none by that name."""
    return await require_queue(store).remove_trigger(name)


# -- firing after a run ends ------------------------------------------------------------------


def trigger_run_id(trigger: str, source: str) -> RunId:
    """The id of the run a trigger starts for one source run (or webhook delivery): the same
    in every process, so a second attempt finds the first one's run."""
    digest = hashlib.sha256(trigger_key(trigger, source).encode()).hexdigest()
    return RunId(f"run_{digest[:20]}")


def chain_depth(metadata: Mapping[str, Any]) -> int:
    """How many triggers down a chain a run was started (0: not by a run trigger)."""
    depth = metadata.get("chain_depth", 0)
    return depth if isinstance(depth, int) and depth >= 0 else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class TriggerFired:
    """What one firing did."""

    trigger: str
    """The trigger's name."""
    source_run: RunId
    """The run whose ending fired it."""
    run_id: RunId | None
    """The run it started (an existing one when another attempt started it first); None when
    the chain was already `max_depth` triggers deep."""


async def fire_triggers(
    runtime: Runtime,
    *,
    run_id: RunId | None = None,
    agents: dict[str, Agent | Workflow] | None = None,
    limit: int = 100,
) -> list[TriggerFired]:
    """Start the runs that firings owe: all due ones, or those of the run `run_id`.

    Safe to call from every worker at once. A firing whose run cannot start (its agent does not
    load) is retried later with a growing back-off; the others go on. `agents` caches loaded
    agents by reference between calls.
    """
    queue = queue_of(runtime.store)
    if queue is None:
        return []
    firings = await queue.due_firings(run_id=run_id, limit=limit)
    if not firings:
        return []
    triggers = {t.name: t for t in await queue.list_triggers()}
    cache = agents if agents is not None else {}
    out: list[TriggerFired] = []
    for firing in firings:
        trigger = triggers.get(firing.trigger)
        if trigger is None:  # removed after this pass read its firings
            await queue.firing_done(firing.trigger, firing.run_id)
            continue
        try:
            out.append(await _fire(runtime, queue, trigger, firing, cache))
        except Exception as exc:
            # Whatever stops this one (an agent module that fails to import, a refused
            # authority), the firings behind it go on; this one waits and tries again.
            attempt = firing.attempts + 1
            log.error(
                "trigger %s: cannot start a run after %s (attempt %d): %s: %s",
                trigger.name,
                firing.run_id,
                attempt,
                type(exc).__name__,
                exc,
            )
            await queue.defer_firing(firing.trigger, firing.run_id, not_before=retry_at(attempt))
    return out


async def _fire(
    runtime: Runtime,
    queue: RunQueue,
    trigger: Trigger,
    firing: Firing,
    cache: dict[str, Agent | Workflow],
) -> TriggerFired:
    source = await runtime.state(firing.run_id)
    depth = chain_depth(source.metadata) + 1
    if depth > trigger.max_depth:
        log.warning(
            "trigger %s: run %s is %d trigger(s) down a chain, the most it allows; "
            "starting nothing",
            trigger.name,
            firing.run_id,
            depth - 1,
        )
        await queue.firing_done(trigger.name, firing.run_id)
        return TriggerFired(trigger=trigger.name, source_run=firing.run_id, run_id=None)
    agent = cache.get(trigger.agent_ref)
    if agent is None:
        agent = cache[trigger.agent_ref] = load_runnable(trigger.agent_ref)
    text = render_input(trigger.input, source)
    if isinstance(agent, Workflow):
        try:
            agent.input_text(text)
        except ConfigError as exc:  # the same source run renders the same text: not retried
            log.error(
                "trigger %s: after run %s, %s; starting nothing (the trigger's --input must "
                "give it)",
                trigger.name,
                firing.run_id,
                exc.message,
            )
            await queue.firing_done(trigger.name, firing.run_id)
            return TriggerFired(trigger=trigger.name, source_run=firing.run_id, run_id=None)
    tenant = trigger.tenant
    if not tenant:
        entry = await queue.queue_entry(firing.run_id)
        tenant = entry.tenant if entry is not None else ""
    started = await runtime.start(
        agent,
        text,
        run_id=trigger_run_id(trigger.name, firing.run_id),
        agent_ref=trigger.agent_ref,
        idempotency_key=trigger_key(trigger.name, firing.run_id),
        priority=trigger.priority,
        tenant=tenant or None,
        metadata={
            "trigger": trigger.name,
            "source_run": firing.run_id,
            "source_status": firing.status,
            "chain_depth": depth,
        },
        caused_by=f"{firing.run_id}#{source.seq}",
    )
    await queue.firing_done(trigger.name, firing.run_id)
    return TriggerFired(trigger=trigger.name, source_run=firing.run_id, run_id=started)


# -- webhooks ---------------------------------------------------------------------------------


def sign(secret: str | bytes, body: bytes, *, timestamp: int | None = None) -> str:
    """The signature header value for `body` sent at `timestamp` (default: now):
    `t=UNIX_SECONDS,v1=HEX`, HEX the HMAC-SHA256 of `"{t}.{body}"` under `secret`."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_digest(secret, t, body)}"


def verify_signature(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
    now: float | None = None,
) -> str:
    """The digest by which `header` signs `body`, once it is checked in constant time and its
    timestamp is within `tolerance_s` of `now`.

    Raises SignatureInvalid for a missing, malformed or wrong signature, SignatureExpired for a
    right one signed too long ago (or too far ahead): a replay of a captured delivery.
    """
    t, digests = _parse_signature(header)
    if t is not None:
        expected = _digest(secret, t, body)
        for digest in digests:
            if hmac.compare_digest(expected, digest):
                skew = (time.time() if now is None else now) - t
                if not abs(skew) <= tolerance_s:  # a NaN tolerance refuses, never accepts
                    raise SignatureExpired(
                        f"the delivery was signed {_ago(skew)}; this server accepts deliveries "
                        f"signed within {tolerance_s:g}s of its clock",
                        signed_at=t,
                    )
                return digest
    raise SignatureInvalid(
        f"the {SIGNATURE_HEADER} header is missing, malformed or does not match the body"
    )


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, b"%d." % timestamp + body, hashlib.sha256).hexdigest()


_MAX_TIMESTAMP_DIGITS = 12  # far past any clock; keeps an absurd `t=` from being parsed at all


def _parse_signature(header: str | None) -> tuple[int | None, list[str]]:
    """(t, the v1 digests) of a header; t is None when it is missing or not an integer."""
    t: int | None = None
    digests: list[str] = []
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit():
            if len(value) <= _MAX_TIMESTAMP_DIGITS:
                t = int(value)
        elif key == "v1":
            digests.append(value)
    return t, digests


def _ago(skew: float) -> str:
    return f"{skew:.0f}s ago" if skew >= 0 else f"{-skew:.0f}s ahead of this server's clock"


async def fire_webhook(
    runtime: Runtime,
    trigger: Trigger,
    body: str,
    *,
    delivery: str,
    signature: str | None = None,
    agents: dict[str, Agent | Workflow] | None = None,
) -> tuple[RunId, bool]:
    """Start the run for one webhook delivery; a delivery seen before returns its run.

    A delivery is seen before when its id or its `signature` (the digest the caller checked)
    already started a run: a retry carries the same id, a captured delivery replayed under a
    new id carries the same signature. Returns the run and whether this call created it.
    """
    if trigger.kind is not TriggerKind.WEBHOOK:
        raise ConfigError(f"trigger {trigger.name!r} is not a webhook", trigger=trigger.name)
    source = f"delivery:{delivery}"
    rid = trigger_run_id(trigger.name, source)
    try:
        await runtime.store.get_run(rid)
        return rid, False
    except RunNotFound:
        pass
    cache = agents if agents is not None else {}
    agent = cache.get(trigger.agent_ref)
    if agent is None:
        agent = cache[trigger.agent_ref] = load_runnable(trigger.agent_ref)
    # The run's idempotency key is the signature when there is one: starting it again under
    # another delivery id returns the run the signature started first.
    key = f"signature:{signature}" if signature is not None else source
    started = await runtime.start(
        agent,
        body,
        run_id=rid,
        agent_ref=trigger.agent_ref,
        idempotency_key=trigger_key(trigger.name, key),
        priority=trigger.priority,
        tenant=trigger.tenant or None,
        metadata={"trigger": trigger.name, "delivery": delivery},
    )
    return started, started == rid


# -- describing ------------------------------------------------------------------------------


def started_by(metadata: Mapping[str, Any]) -> str | None:
    """One line saying what started a run (a trigger, a webhook, a schedule), or None."""
    trigger = metadata.get("trigger")
    if isinstance(trigger, str):
        if "source_run" in metadata:
            return (
                f"started by trigger {trigger} after run {metadata['source_run']} "
                f"{metadata.get('source_status', 'ended')} "
                f"(chain depth {chain_depth(metadata)})"
            )
        if "delivery" in metadata:
            return f"started by webhook {trigger}, delivery {metadata['delivery']}"
        return f"started by trigger {trigger}"
    schedule = metadata.get("schedule")
    if isinstance(schedule, str):
        return f"started by schedule {schedule}, tick {metadata.get('tick', '?')}"
    return None


def what_fires(trigger: Trigger) -> str:
    """What fires a trigger, in a few words."""
    if trigger.kind is TriggerKind.WEBHOOK:
        signed = f"signed with ${trigger.secret_env}" if trigger.secret_env else "unsigned"
        return f"on POST /v1/hooks/{trigger.name} ({signed})"
    ends = {
        TriggerOn.COMPLETED: "completes",
        TriggerOn.FAILED: "fails or expires",
        TriggerOn.ANY: "ends",
    }[trigger.on]
    return f"after a {trigger.source_agent} run {ends}"


__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE_S",
    "TEMPLATE_FIELDS",
    "TriggerFired",
    "add_trigger",
    "chain_depth",
    "check_template",
    "find_cycle",
    "fire_triggers",
    "fire_webhook",
    "list_triggers",
    "remove_trigger",
    "render_input",
    "sign",
    "started_by",
    "trigger_run_id",
    "verify_signature",
    "what_fires",
]
