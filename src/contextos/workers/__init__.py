"""Workers: the processes that drive queued runs under leases, fire cron schedules and run
triggers, and expire the interrupts nobody answered in time.

This is their public surface, what the `contextos` command and the HTTP API use: running and
listing workers, concurrency limits, schedules, triggers and webhooks, and `doctor`.
"""

from contextos.store.queue import (
    CatchUp,
    ConcurrencyLimit,
    LimitScope,
    Schedule,
    Trigger,
    TriggerKind,
    TriggerOn,
    WorkerInfo,
    WorkerStatus,
)
from contextos.workers.doctor import HealthCheck, doctor
from contextos.workers.scheduler import add_schedule, list_schedules, remove_schedule
from contextos.workers.triggers import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    SIGNATURE_TOLERANCE_S,
    add_trigger,
    fire_webhook,
    list_triggers,
    remove_trigger,
    sign,
    started_by,
    verify_signature,
    what_fires,
)
from contextos.workers.worker import (
    Worker,
    WorkerConfig,
    list_limits,
    list_workers,
    run_worker,
    set_limit,
)

__all__ = [
    "CatchUp",
    "ConcurrencyLimit",
    "DELIVERY_HEADER",
    "HealthCheck",
    "LimitScope",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE_S",
    "Schedule",
    "Trigger",
    "TriggerKind",
    "TriggerOn",
    "Worker",
    "WorkerConfig",
    "WorkerInfo",
    "WorkerStatus",
    "add_schedule",
    "add_trigger",
    "doctor",
    "fire_webhook",
    "list_limits",
    "list_schedules",
    "list_triggers",
    "list_workers",
    "remove_schedule",
    "remove_trigger",
    "run_worker",
    "set_limit",
    "sign",
    "started_by",
    "verify_signature",
    "what_fires",
]
