"""The run queue every store backend keeps next to its event logs.

Events say what happened to a run; the queue says who may work on it next: its priority, the
idempotency key it was started with, a not-before time (a durable timer), and the lease a worker
holds on it. A lease decides who *should* drive a run; the event log's expected-seq check is
what stops a worker that lost its lease from writing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol, cast, runtime_checkable

from contextos.errors import ConfigError
from contextos.runs import RunId
from contextos.store.base import conforms


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueEntry:
    """A run's place in the queue."""

    run_id: RunId
    """The run."""
    priority: int = 0
    """Higher goes first; equal priorities go in start order."""
    tenant: str = ""
    """Whose run it is, for per-tenant concurrency limits."""
    agent_name: str = ""
    """Which agent runs it, for per-agent limits and workers that serve some agents only."""
    idempotency_key: str | None = None
    """A second start with the same key returns this run instead of creating another."""
    not_before: datetime | None = None
    """No worker claims the run before this time (UTC): delayed starts and retry back-off."""
    enqueued_at: datetime | None = None
    """When it was queued (UTC); set by the store."""
    attempts: int = 0
    """Times a worker died holding the run or gave it back after an error."""
    lease_owner: str | None = None
    """The worker holding (or last holding) the lease, if any."""
    lease_expires_at: datetime | None = None
    """When that lease runs out (UTC)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """The right to drive one run until `expires_at`, renewed by heartbeats."""

    run_id: RunId
    """The run."""
    worker_id: str
    """Who holds it."""
    token: int
    """Grows with every claim of the run, so a stale holder cannot renew or release it."""
    expires_at: datetime
    """When it lapses unless renewed (UTC)."""
    attempts: int = 0
    """The run's failed attempts so far (see QueueEntry.attempts)."""
    recovered: bool = False
    """True when this claim took over a lease that had expired: its holder died or hung."""


class LimitScope(StrEnum):
    """What a concurrency limit counts."""

    GLOBAL = "global"
    TENANT = "tenant"
    AGENT = "agent"


DEFAULT_LIMIT_NAME = "*"
"""A tenant or agent limit with this name applies to every tenant or agent without its own."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ConcurrencyLimit:
    """At most `max_running` leased runs at once in a scope, across all workers."""

    scope: LimitScope
    """Global, per tenant or per agent."""
    name: str
    """The tenant or agent name, `*` for each one without its own limit, empty for global."""
    max_running: int
    """Runs that may hold a lease at once."""


class WorkerStatus(StrEnum):
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    """A worker process as the store knows it."""

    worker_id: str
    """Unique per process."""
    host: str
    """Host name."""
    pid: int
    """Process id on that host."""
    concurrency: int
    """Runs it drives at once."""
    status: WorkerStatus = WorkerStatus.RUNNING
    """Running, draining after SIGTERM, or stopped."""
    started_at: datetime | None = None
    """When it registered (UTC)."""
    heartbeat_at: datetime | None = None
    """Its last heartbeat (UTC)."""
    leases: tuple[Lease, ...] = ()
    """The runs it holds a live lease on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOwner:
    """Who drives a run now: the holder of its live lease, as the worker registry knows it."""

    run_id: RunId
    """The run."""
    worker_id: str
    """The lease holder: a worker, `contextos run`, or a script's Runtime."""
    expires_at: datetime
    """When the lease lapses unless renewed (UTC)."""
    host: str | None = None
    """Its host, when it is in the registry."""
    pid: int | None = None
    """Its process id on that host, when it is in the registry."""
    since: datetime | None = None
    """When it registered to drive (UTC), when it is in the registry."""

    def describe(self) -> str:
        """`cli-host-12 (pid 12 on host)`: the holder in one phrase."""
        where = f" (pid {self.pid} on {self.host})" if self.pid is not None else ""
        return f"{self.worker_id}{where}"


class CatchUp(StrEnum):
    """What a schedule does about ticks that passed while no worker was there to fire them."""

    SKIP = "skip"
    """Missed ticks start nothing; the schedule waits for its next tick."""
    RUN_ONCE = "run_once"
    """However many ticks were missed, one run starts, for the latest of them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A cron schedule that starts a run of an agent at each tick."""

    name: str
    """Unique name."""
    agent_ref: str
    """Where to import the agent from (`path.py:attr` or `module:attr`)."""
    cron: str
    """Cron expression (5 fields, or 6 with seconds last)."""
    input: str = ""
    """The input each run starts with."""
    timezone: str = "UTC"
    """IANA time zone the cron expression is read in."""
    catch_up: CatchUp = CatchUp.SKIP
    """Policy for ticks missed by more than `misfire_grace_s`."""
    misfire_grace_s: float = 60.0
    """A tick fired at most this late still counts as on time."""
    priority: int = 0
    """Priority of the runs it starts."""
    tenant: str = ""
    """Tenant of the runs it starts."""
    next_tick_at: datetime
    """The next tick to fire (UTC)."""
    last_tick_at: datetime | None = None
    """The last tick handled (fired or skipped)."""
    last_run_id: RunId | None = None
    """The run the last fired tick started."""
    created_at: datetime | None = None
    """When it was added (UTC)."""


class TriggerKind(StrEnum):
    """What starts a trigger's runs."""

    RUN = "run"
    """A run of the source agent finishing."""
    WEBHOOK = "webhook"
    """An HTTP request to `POST /v1/hooks/NAME`."""


class TriggerOn(StrEnum):
    """Which endings of a source run fire a run trigger."""

    COMPLETED = "completed"
    """The source run completed."""
    FAILED = "failed"
    """The source run failed or expired (not cancelled by a person)."""
    ANY = "any"
    """Any ending: completed, failed, cancelled or expired."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Trigger:
    """Starts a run of an agent when a run of another agent ends, or when a webhook is called."""

    name: str
    """Unique name (also the webhook's path: `/v1/hooks/NAME`)."""
    kind: TriggerKind
    """Run-finished or webhook."""
    agent_ref: str
    """Where to import the agent it starts from (`path.py:attr` or `module:attr`)."""
    agent_name: str
    """That agent's name when the trigger was added (to find cycles between triggers)."""
    source_agent: str = ""
    """Run triggers: the name of the agent whose runs ending fire it."""
    on: TriggerOn = TriggerOn.COMPLETED
    """Run triggers: which endings fire it."""
    input: str | None = None
    """Run triggers: template of the new run's input (`{output}`, `{run_id}`, `{status}`, …);
    None: the source run's output."""
    secret_env: str | None = None
    """Webhooks: the environment variable holding the HMAC-SHA256 secret (None: unsigned)."""
    allow_cycle: bool = False
    """Whether it may close a loop of triggers (an agent triggering itself, A → B → A)."""
    max_depth: int = 10
    """A run this many triggers down a chain starts nothing more."""
    priority: int = 0
    """Priority of the runs it starts."""
    tenant: str = ""
    """Tenant of the runs it starts (empty: the source run's)."""
    created_at: datetime | None = None
    """When it was added (UTC)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Firing:
    """A source run that ended and the run trigger it fires: due until the run is started."""

    trigger: str
    """The trigger's name."""
    run_id: RunId
    """The source run."""
    status: str
    """How the source run ended."""
    attempts: int = 0
    """Times starting the run failed (the agent would not load, the store was unreachable)."""


@runtime_checkable
class RunQueue(Protocol):
    """Queue, leases, limits, worker registry and schedules; kept by each store backend."""

    async def enqueue(
        self, entry: QueueEntry, *, lease_owner: str | None = None, lease_s: float = 30.0
    ) -> tuple[RunId, Lease | None]:
        """Queue a run (before its RunCreated is appended) and return the run that owns it.

        When `entry.idempotency_key` already belongs to a run, nothing changes and that run's
        id is returned. With `lease_owner`, the new entry starts leased to that worker.
        """
        ...

    async def claim(
        self, worker_id: str, *, lease_s: float, agents: Sequence[str] | None = None
    ) -> Lease | None:
        """Lease the most urgent claimable run within the concurrency limits, or None.

        Claimable: created, queued or running, not leased (or the lease expired), past its
        not-before time. A run waiting for a person (input_required) is never claimed.
        """
        ...

    async def acquire(self, run_id: RunId, worker_id: str, *, lease_s: float) -> Lease:
        """Take a run's lease whoever holds it (an explicit resume); the old holder stops."""
        ...

    async def take(
        self, run_id: RunId, worker_id: str, *, lease_s: float, reenter: bool = True
    ) -> Lease | None:
        """Take a run's lease unless another holder's lease is still live (None then).

        With `reenter`, a live lease of the same worker is taken anew (a process that lost
        track of its own lease); without it, that lease counts as another holder's: some task
        of this worker drives the run already."""
        ...

    async def renew(self, lease: Lease, *, lease_s: float) -> Lease | None:
        """Extend a lease; None when it is no longer held (it expired and was claimed)."""
        ...

    async def release(
        self, lease: Lease, *, not_before: datetime | None = None, failed: bool = False
    ) -> bool:
        """Give a run back; `not_before` delays the next claim, `failed` counts an attempt."""
        ...

    async def queue_entry(self, run_id: RunId) -> QueueEntry | None:
        """The run's queue row, if it has one."""
        ...

    async def next_due(self) -> float | None:
        """Seconds until a queued or running run that cannot be claimed now may become
        claimable (its not-before time passes, or its lease expires unless renewed); None
        when no run waits on a timer. What an idle worker sleeps for at most."""
        ...

    async def set_limit(self, scope: LimitScope, name: str, max_running: int | None) -> None:
        """Set (or with None, remove) a concurrency limit."""
        ...

    async def limits(self) -> list[ConcurrencyLimit]:
        """All concurrency limits."""
        ...

    async def register_worker(self, info: WorkerInfo) -> None:
        """Record a worker process (and its first heartbeat)."""
        ...

    async def worker_heartbeat(self, worker_id: str, status: WorkerStatus) -> None:
        """Record that the worker is alive, and its status."""
        ...

    async def list_workers(self, *, live_within_s: float | None = 60.0) -> list[WorkerInfo]:
        """Running or draining workers with a heartbeat in the last `live_within_s` (with None:
        every worker on record, stopped ones too), each with its live leases."""
        ...

    async def add_schedule(self, schedule: Schedule) -> None:
        """Add a schedule; ConfigError when the name is taken."""
        ...

    async def list_schedules(self, *, due_at: datetime | None = None) -> list[Schedule]:
        """All schedules by name, or those whose next tick is at or before `due_at`."""
        ...

    async def remove_schedule(self, name: str) -> bool:
        """Delete a schedule; False when there was none."""
        ...

    async def advance_schedule(
        self,
        name: str,
        *,
        expected_next: datetime,
        next_tick_at: datetime,
        last_tick_at: datetime,
        last_run_id: RunId | None,
    ) -> bool:
        """Move a schedule on to its next tick, unless another worker already did (False)."""
        ...

    async def add_trigger(self, trigger: Trigger) -> None:
        """Add a trigger; ConfigError when the name is taken."""
        ...

    async def list_triggers(self) -> list[Trigger]:
        """All triggers by name."""
        ...

    async def remove_trigger(self, name: str) -> bool:
        """Delete a trigger and the firings it still owes; False when there was none."""
        ...

    async def due_firings(self, *, run_id: RunId | None = None, limit: int = 100) -> list[Firing]:
        """Firings not done yet (oldest first; past their back-off), or those of one run.

        The database records a firing in the same transaction as the run's ending, for every
        run trigger listening to the run's agent; it stays until `firing_done`.
        """
        ...

    async def firing_done(self, trigger: str, run_id: RunId) -> None:
        """Forget a firing whose run was started (or that must never start one)."""
        ...

    async def defer_firing(self, trigger: str, run_id: RunId, *, not_before: datetime) -> None:
        """Count a failed attempt at a firing and leave it alone until `not_before`."""
        ...


def tick_key(schedule: str, tick: datetime) -> str:
    """The idempotency key of the run a schedule starts for one tick: the same everywhere."""
    return f"schedule:{schedule}:{tick.isoformat()}"


def trigger_key(trigger: str, source: str) -> str:
    """The idempotency key of the run a trigger starts for one source run or webhook delivery."""
    return f"trigger:{trigger}:{source}"


def queue_of(store: object) -> RunQueue | None:
    """The store's queue, when the backend keeps one."""
    return cast(RunQueue, store) if conforms(store, RunQueue) else None


def require_queue(store: object) -> RunQueue:
    """The store's queue; ConfigError when the backend keeps none."""
    queue = queue_of(store)
    if queue is None:
        raise ConfigError(f"the store {getattr(store, 'url', store)!r} keeps no run queue")
    return queue


__all__ = [
    "DEFAULT_LIMIT_NAME",
    "CatchUp",
    "Firing",
    "Lease",
    "ConcurrencyLimit",
    "LimitScope",
    "QueueEntry",
    "RunOwner",
    "RunQueue",
    "Schedule",
    "Trigger",
    "TriggerKind",
    "TriggerOn",
    "WorkerInfo",
    "WorkerStatus",
    "queue_of",
    "require_queue",
    "tick_key",
    "trigger_key",
]
